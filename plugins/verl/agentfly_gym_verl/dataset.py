"""Training / validation data sets for verl: one parquet row per episode to play.

verl's ``RLHFDataset`` reads the columns ``prompt`` (a chat message list), ``data_source``,
``agent_name``, ``reward_model`` and ``extra_info``, and passes every column of a row to the
agent loop's ``run(**row)``.  The prompt here is only a placeholder (system prompt + a line
naming the task): the environment makes the real first observation at reset, and the agent
loop renders it.  ``extra_info`` says what to play (see
:func:`agentfly_gym_verl.agent_loop.parse_row`)::

    {"index": 3, "env_id": "agentfly/Chess-v0", "seed": 3, "task_id": "tewjc", "split": "",
     "reset_options": "{}", "env_kwargs": "{\\"mode\\": \\"puzzle\\"}", "mode": "chain",
     "max_turns": 6, "history": 3}

``reset_options`` and ``env_kwargs`` are JSON strings so that rows with different keys share
one parquet schema (a struct column would give every row every key, set to null).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentfly_gym.errors import ConfigError, DataNotFoundError
from agentfly_gym.utils.jsonargs import json_object

__all__ = ["build_dataset", "dataset_main", "AGENT_NAMES"]

#: agent_name per mode (entries of ``agent_loops.yaml``).
AGENT_NAMES = {"chain": "agentfly_chain", "step": "agentfly_step"}


def _env_class(env_id: str) -> type:
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    spec = gymnasium.spec(env_id)
    ep = spec.entry_point
    return load_env_creator(ep) if isinstance(ep, str) else ep


def _check_kwargs(env_id: str, cls: type, kwargs: dict[str, Any]) -> None:
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        valid = sorted(k for k, p in params.items() if k != "self" and p.kind is p.KEYWORD_ONLY)
        raise ConfigError(f"{env_id} takes no constructor argument(s) {unknown}; valid: {valid}")


def build_dataset(env_id: str, tasks: Sequence[str | int] | None = None, n: int | None = None,
                  out_path: str | os.PathLike = "train.parquet", *, mode: str = "chain", split: str | None = None,
                  seed: int = 0, max_turns: int = 10, history: int = 3, env_kwargs: dict[str, Any] | None = None,
                  reset_options: dict[str, Any] | None = None, agent_name: str | None = None,
                  data_source: str | None = None, check: bool = True) -> Path:
    """Write a verl parquet data set of ``n`` episodes of ``env_id``.

    Args:
        env_id: a registered env (``"Chess"``, ``"ScienceWorld-v0"``, ``"agentfly/ALFWorld-v0"``).
        tasks: task ids, one row each (reset option ``task_id``: a Lichess PuzzleId, a
            ScienceWorld ``"boil:3"``, an ALFWorld game id, a WebShop goal index); with ``n``,
            the first ``n`` (cycled when ``n`` is larger).  None: the env draws the task from the
            row's seed.
        n: rows; required when ``tasks`` is None.
        out_path: the parquet file to write (parent folders are created).
        mode: ``"chain"`` or ``"step"`` (sets ``agent_name`` and ``extra_info["mode"]``).
        split: the env's task split (constructor argument ``split`` of ScienceWorld, ALFWorld,
            WebShop); None leaves the env's default.
        seed: row ``i`` resets with seed ``seed + i``.
        max_turns: most policy turns per episode; history: step mode's shown (action, observation) pairs.
        env_kwargs: constructor arguments of the env for every row (checked against its signature).
        reset_options: extra reset options for every row.
        agent_name: override the loop name (default ``agentfly_chain`` / ``agentfly_step``).
        data_source: default the full env id (verl groups validation metrics by it).
        check: reset the env once per distinct task (once with a seed when there is no task list)
            with these kwargs and options, so a bad task id, split or option fails here rather than
            during training.  Costs one episode start per distinct task (e.g. ~1 s per ScienceWorld task).

    Returns:
        The written path.

    Raises:
        ConfigError: an unknown env, bad mode/numbers, constructor arguments the env does not take,
            or (with ``check``) a task id, split or reset option the env rejects.
        DataNotFoundError: (with ``check``) the env's data is missing.
    """
    from agentfly_gym.registration import normalize_env_id

    # a user's "package.module:make_env" stays in the rows, so that every worker process registers the env again
    row_env_id = env_id if ":" in env_id else None
    env_id = normalize_env_id(env_id)
    row_env_id = row_env_id or env_id
    if mode not in AGENT_NAMES:
        raise ConfigError(f"mode={mode!r} is not one of {list(AGENT_NAMES)}")
    for name, v, lo in (("max_turns", max_turns, 1), ("history", history, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name}={v!r} must be an integer >= {lo}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be an integer >= 0")
    task_list = [str(t) for t in tasks] if tasks is not None else None
    if task_list is not None and not task_list:
        raise ConfigError("tasks is empty; give task ids or None (tasks drawn from seeds)")
    if n is None:
        if task_list is None:
            raise ConfigError("give n (rows) or a task list")
        n = len(task_list)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n={n!r} must be an integer >= 1")
    kwargs = dict(env_kwargs or {})
    if split is not None:
        kwargs["split"] = split
    cls = _env_class(env_id)
    _check_kwargs(env_id, cls, kwargs)
    try:
        kwargs_json = json.dumps(kwargs, sort_keys=True)
        options_json = json.dumps(dict(reset_options or {}), sort_keys=True)
    except TypeError as e:
        raise ConfigError(f"env_kwargs / reset_options must be JSON-serialisable: {e}") from e
    if check:
        _check_resets(env_id, kwargs, dict(reset_options or {}), sorted(set(task_list)) if task_list else None, seed)
    system = getattr(getattr(cls, "agent_prompt", None), "system", "") or ""
    rows = []
    for i in range(n):
        task = task_list[i % len(task_list)] if task_list is not None else ""
        what = f"task {task}" if task else f"the task drawn with seed {seed + i}"
        rows.append({
            "data_source": data_source or env_id,
            "agent_name": agent_name or AGENT_NAMES[mode],
            "prompt": [{"role": "system", "content": system},
                       {"role": "user", "content": f"{env_id}: {what}. The environment sends the first observation "
                                                   "when the episode starts."}],
            "ability": "agent",
            "reward_model": {"style": "env", "ground_truth": task},
            "extra_info": {"index": i, "env_id": row_env_id, "seed": seed + i, "task_id": task, "split": split or "",
                           "reset_options": options_json, "env_kwargs": kwargs_json, "mode": mode,
                           "max_turns": max_turns, "history": history},
        })
    import pyarrow as pa
    import pyarrow.parquet as pq

    msg = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([
        ("data_source", pa.string()), ("agent_name", pa.string()), ("prompt", pa.list_(msg)), ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("env_id", pa.string()), ("seed", pa.int64()),
                                  ("task_id", pa.string()), ("split", pa.string()), ("reset_options", pa.string()),
                                  ("env_kwargs", pa.string()), ("mode", pa.string()), ("max_turns", pa.int64()),
                                  ("history", pa.int64())])),
    ])
    out = Path(out_path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, out)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentfly-gym dataset",
                                description="Write a verl parquet data set of agentfly-gym episodes.")
    p.add_argument("env", help="environment id, e.g. Chess, ScienceWorld-v0, agentfly/ALFWorld-v0")
    p.add_argument("-o", "--out", required=True, help="parquet file to write")
    p.add_argument("-n", "--num", type=int, default=None, help="rows (default: the number of --tasks)")
    p.add_argument("--tasks", default=None, help="comma-separated task ids (reset option task_id)")
    p.add_argument("--tasks-file", default=None, help="file with one task id per line")
    p.add_argument("--split", default=None, help="the env's task split (ScienceWorld/ALFWorld/WebShop)")
    p.add_argument("--mode", choices=sorted(AGENT_NAMES), default="chain")
    p.add_argument("--seed", type=int, default=0, help="row i resets with seed+i")
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--history", type=int, default=3, help="step mode: past steps shown in each prompt")
    p.add_argument("--env-kwargs", default=None, help='JSON object of env constructor arguments, e.g. \'{"mode": "puzzle"}\'')
    p.add_argument("--reset-options", default=None, help="JSON object of extra reset options")
    p.add_argument("--agent-name", default=None, help="override the agent loop name")
    p.add_argument("--no-check", action="store_true",
                   help="do not reset the env once per task to check tasks, split and options")
    return p


def _check_resets(env_id: str, kwargs: dict[str, Any], options: dict[str, Any], tasks: list[str] | None,
                  seed: int) -> None:
    """Reset ``env_id`` once per task (or once with ``seed``) and end the episode at once.

    Runs on the library's background loop, so it also works when called from a running event loop.
    """
    import gymnasium

    from agentfly_gym.errors import AgentFlyError
    from agentfly_gym.resources import ResourceManager

    async def run() -> None:
        async with ResourceManager() as manager:
            try:
                env = gymnasium.make(env_id, manager=manager, **kwargs).unwrapped
            except TypeError as e:
                raise ConfigError(f"{env_id}: {e}") from None
            try:
                for task in tasks or [None]:
                    opts = dict(options, task_id=task) if task is not None else dict(options)
                    try:
                        await env.areset(seed=seed, options=opts or None)
                    except AgentFlyError as e:
                        what = f"task {task!r}" if task is not None else f"reset options {options}"
                        raise ConfigError(f"{env_id} rejects {what}: {e}") from e
                    await env.aend_episode()
            finally:
                await env.aclose()

    from agentfly_gym.utils.aio import run_sync

    run_sync(run())


def dataset_main(args: Sequence[str] | None = None) -> int:
    """CLI entry (``agentfly-gym dataset ...``): parse ``args`` (None: ``sys.argv[1:]``), write
    the data set, print its path.  Returns 0, or 2 on a configuration error (message on stderr)."""
    import sys

    ns = _parser().parse_args(args)
    try:
        tasks = None
        if ns.tasks:
            tasks = [t.strip() for t in ns.tasks.split(",") if t.strip()]
        if ns.tasks_file:
            lines = Path(ns.tasks_file).read_text().splitlines()
            tasks = (tasks or []) + [t.strip() for t in lines if t.strip() and not t.startswith("#")]

        def obj(text: str | None, what: str) -> dict[str, Any] | None:
            return None if text is None else json_object(text, what)

        path = build_dataset(ns.env, tasks, ns.num, ns.out, mode=ns.mode, split=ns.split, seed=ns.seed,
                             max_turns=ns.max_turns, history=ns.history,
                             env_kwargs=obj(ns.env_kwargs, "--env-kwargs"),
                             reset_options=obj(ns.reset_options, "--reset-options"), agent_name=ns.agent_name,
                             check=not ns.no_check)
    except (ConfigError, DataNotFoundError, OSError) as e:
        print(f"agentfly-gym dataset: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
