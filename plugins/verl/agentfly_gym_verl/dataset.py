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

Splits: without a task list, the rows' tasks are drawn from the env's task list of ``split`` (every env that
lists its tasks, :meth:`atask_ids`: Chess puzzles, WebShop goals, ALFWorld games, ScienceWorld variations,
R2E-Gym and tool-env rows), and every row records its concrete ``task_id``.  The split names common to every
env are ``train`` (the default), ``validation`` and ``test``; they never share a task.  A training and a
validation file drawn from two splits share nothing; ``exclude=`` (``--exclude train.parquet``) keeps a file's
tasks out of the draw, and :func:`shared_tasks` (``agentfly-gym dataset check a.parquet b.parquet``) finds the
tasks two files share.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentfly_gym.data.task_draw import DEFAULT_SPLIT, check_draw, check_seed, draw_tasks, env_class
from agentfly_gym.errors import ConfigError, DataNotFoundError
from agentfly_gym.limits import check_int
from agentfly_gym.utils.jsonargs import json_object

__all__ = ["build_dataset", "dataset_main", "shared_tasks", "AGENT_NAMES", "DEFAULT_SPLIT"]

#: agent_name per mode (entries of ``agent_loops.yaml``).
AGENT_NAMES = {"chain": "agentfly_chain", "step": "agentfly_step"}


def build_dataset(env_id: str, tasks: Sequence[str | int] | None = None, n: int | None = None,
                  out_path: str | os.PathLike = "train.parquet", *, mode: str = "chain", split: str | None = None,
                  seed: int = 0, max_turns: int = 10, history: int = 3, env_kwargs: dict[str, Any] | None = None,
                  reset_options: dict[str, Any] | None = None, agent_name: str | None = None,
                  data_source: str | None = None, check: bool = True,
                  exclude: Sequence[str | os.PathLike] = (), overwrite: bool = False) -> Path:
    """Write a verl parquet data set of ``n`` episodes of ``env_id``.

    Args:
        env_id: a registered env (``"Chess"``, ``"ScienceWorld-v0"``, ``"agentfly/ALFWorld-v0"``).
        tasks: task ids, one row each (reset option ``task_id``: a Lichess PuzzleId, a
            ScienceWorld ``"boil:3"``, an ALFWorld game id, a WebShop goal index); with ``n``,
            the first ``n`` (cycled when ``n`` is larger).  None: ``n`` tasks drawn from the env's
            task list of ``split`` (see :func:`agentfly_gym.data.task_draw.list_tasks`), each row recording its task id; an env
            that lists no tasks (Chess play mode, a user's env without ``atask_ids``) draws the task
            from the row's seed and the row's ``task_id`` stays empty (a warning says so).
        n: rows; required when ``tasks`` is None.
        out_path: the parquet file to write (parent folders are created).
        mode: ``"chain"`` or ``"step"`` (sets ``agent_name`` and ``extra_info["mode"]``).
        split: the env's task split (constructor argument ``split`` of Chess, ScienceWorld, ALFWorld,
            WebShop): ``"train"``, ``"validation"``, ``"test"`` (every env's names), or the env's own
            (``"dev"``, ``"valid_unseen"``, ``"all"``, ...).  None: :data:`DEFAULT_SPLIT` (``"train"``)
            for an env with a ``split`` argument when the tasks are drawn, else the env's default.
        seed: row ``i`` resets with seed ``seed + i``; the draw of tasks is a permutation by ``seed``
            (without repeats until the split's tasks are used up).
        exclude: parquet files written by this function whose (env id, task id) pairs the draw leaves out;
            with a task list, a listed task in one of them is refused.  A file's rows without a task id
            cannot be excluded (a warning says so).
        max_turns: most policy turns per episode; history: step mode's shown (action, observation) pairs.
        env_kwargs: constructor arguments of the env for every row (checked against its signature).
        reset_options: extra reset options for every row.
        agent_name: override the loop name (default ``agentfly_chain`` / ``agentfly_step``).
        data_source: default the full env id (verl groups validation metrics by it).
        check: reset the env once per distinct task (once with a seed when there is no task list)
            with these kwargs and options, so a bad task id, split or option fails here rather than
            during training.  Costs one episode start per distinct task (e.g. ~1 s per ScienceWorld task).
        overwrite: replace ``out_path`` when it exists (CLI ``--overwrite``); without it an existing file is
            refused before anything runs, as ``agentfly-gym rollout`` refuses a folder that holds a run.  The
            file is written under a temporary name and renamed when complete (a reader never sees a part).

    Returns:
        The written path.

    Raises:
        ConfigError: an unknown env, bad mode/numbers, constructor arguments the env does not take,
            (with ``check``) a task id, split or reset option the env rejects, a listed task that an
            ``exclude`` file holds, a split with no task left after ``exclude``, an ``exclude`` file that does not
            exist, ``out_path`` that is also an ``exclude`` file, or (without ``overwrite``) ``out_path`` that exists.
        DataNotFoundError: (with ``check``) the env's data is missing.
        OSError: the file cannot be written (a full disk); the message names it, and no part of it is left.
    """
    from agentfly_gym.registration import normalize_env_id

    # a user's "package.module:make_env" stays in the rows, so that every worker process registers the env again
    row_env_id = env_id if ":" in env_id else None
    env_id = normalize_env_id(env_id)
    row_env_id = row_env_id or env_id
    if mode not in AGENT_NAMES:
        raise ConfigError(f"mode={mode!r} is not one of {list(AGENT_NAMES)}")
    seed = check_seed(seed)  # a plain int in the rows (a NumPy integer would be one there too)
    for name, v, lo in (("max_turns", max_turns, 1), ("history", history, 0)):
        check_int(name, v, minimum=lo)
    if _same_file(out_path, exclude):
        raise ConfigError(f"{out_path} is both the output and an --exclude file: writing it would replace the data "
                          "set whose tasks are to be left out; write to another file")
    _check_out(Path(out_path).expanduser(), overwrite)  # before the draw, which may start the env
    try:
        json.dumps([env_kwargs or {}, reset_options or {}])  # before the draw, which may start the env
    except TypeError as e:
        raise ConfigError(f"env_kwargs / reset_options must be JSON-serialisable: {e}") from e
    draw = draw_tasks(env_id, tasks, n, split=split, seed=seed, env_kwargs=env_kwargs,
                      excluded=_excluded(exclude, row_env_id, env_id),
                      excluded_from=f"the excluded data set(s) {[str(p) for p in exclude]}")
    n, split, kwargs = draw.n, draw.split, draw.env_kwargs
    try:
        kwargs_json = json.dumps(kwargs, sort_keys=True)
        options_json = json.dumps(dict(reset_options or {}), sort_keys=True)
    except TypeError as e:
        raise ConfigError(f"env_kwargs / reset_options must be JSON-serialisable: {e}") from e
    if check:
        check_draw(draw, seed, dict(reset_options or {}))
    system = getattr(getattr(env_class(env_id), "agent_prompt", None), "system", "") or ""
    rows = []
    for i in range(n):
        task = draw.task(i)
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
    from agentfly_gym.utils.files import atomic_path

    out = Path(out_path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    _check_out(out, overwrite)  # again: the checks above take a while
    try:
        with atomic_path(out) as tmp:  # a unique temporary name, flushed to disk, then renamed: never a part
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    except OSError as e:  # a full disk: name the file, and say that nothing half-written was left
        state = "left as it was" if out.exists() else "not created"
        raise OSError(e.errno, f"could not write {out} ({e.strerror or e}); it was {state}") from e
    _warn_siblings(out, exclude)
    return out


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an existing ``out`` unless ``overwrite``; a folder is refused always."""
    if out.is_dir():
        raise ConfigError(f"{out} is a folder; -o/--out names the parquet file to write")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it (in code: overwrite=True), or "
                          "choose another -o/--out")


def _warn_siblings(out: Path, exclude: Sequence[str | os.PathLike]) -> None:
    """Warn when ``out`` shares tasks with another data set of this tool in its folder (a training and a
    validation file written side by side from the same split), unless that file was excluded."""
    skip = {Path(p).expanduser().resolve() for p in exclude} | {out.resolve()}
    others = [p for p in sorted(out.parent.glob("*.parquet")) if p.resolve() not in skip][:32]
    for other in others:
        try:
            shared = shared_tasks(out, other)["common"]
        except ConfigError:
            continue  # not a data set of this tool
        if shared:
            warnings.warn(f"{out} shares {len(shared)} task(s) with {other} (e.g. {[t for _, t in shared[:3]]}): "
                          "draw a validation or test set from another split (--split validation) or leave the "
                          f"other file's tasks out (--exclude {other})", stacklevel=3)


def _same_file(path: str | os.PathLike, others: Sequence[str | os.PathLike]) -> bool:
    """Whether ``path`` names one of ``others`` (a path that cannot be resolved, a symlink loop, names nothing)."""
    def resolved(p: str | os.PathLike) -> Path | None:
        try:
            return Path(p).expanduser().resolve()
        except (OSError, RuntimeError):
            return None
    here = resolved(path)
    return here is not None and here in {resolved(x) for x in others}


def _read_keys(path: str | os.PathLike) -> tuple[set[tuple[str, str]], int]:
    """The (env id, task id) pairs of a data set written by :func:`build_dataset`, and its rows without a task id."""
    import pyarrow.parquet as pq

    try:
        is_file = Path(path).expanduser().is_file()
    except (OSError, RuntimeError):  # a symlink loop, a name too long
        is_file = False
    if not is_file:
        raise ConfigError(f"{path}: no such data set file" + (" (a folder)" if Path(path).is_dir() else ""))
    takes = "--exclude and `dataset check` take the parquet files written by agentfly-gym dataset"
    try:
        names = pq.read_schema(Path(path).expanduser()).names
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not a parquet file ({type(e).__name__}); {takes}") from None
    if "extra_info" not in names:  # one line, not pyarrow's dump of the file's whole schema
        what = ("a rollout run's trajectories file" if {"trajectory_id", "task_id"} <= set(names)
                else f"a parquet file without an extra_info column (columns: {', '.join(names[:6])}"
                     f"{', ...' if len(names) > 6 else ''})")
        raise ConfigError(f"{path} is {what}, not a data set written by agentfly-gym dataset; {takes}")
    try:
        info = pq.read_table(Path(path).expanduser(), columns=["extra_info"]).column("extra_info").to_pylist()
    except (OSError, KeyError, ValueError) as e:
        raise ConfigError(f"{path} is not a data set written by agentfly-gym dataset: {e}") from e
    if not all(r is None or isinstance(r, dict) for r in info):
        raise ConfigError(f"{path} has an extra_info column that does not hold records (a data set written by "
                          f"agentfly-gym dataset holds its env_id and task_id there); {takes}")
    keys = {(str(r.get("env_id") or ""), str(r["task_id"])) for r in info if r and r.get("task_id")}
    return keys, sum(1 for r in info if not (r and r.get("task_id")))


def _excluded(paths: Sequence[str | os.PathLike], *env_ids: str) -> set[str]:
    """The task ids of ``env_ids`` (the row's env id and the registered one) in the data sets ``paths``."""
    out: set[str] = set()
    for p in paths:
        keys, unknown = _read_keys(p)
        if unknown:
            warnings.warn(f"{p}: {unknown} row(s) record no task id (drawn from seeds); they cannot be excluded",
                          stacklevel=3)
        out |= {t for e, t in keys if e in env_ids}
    return out


def shared_tasks(a: str | os.PathLike, b: str | os.PathLike) -> dict[str, Any]:
    """The tasks two data sets share.

    Returns:
        ``{"common": [(env id, task id), ...] (sorted), "unknown": (rows of a, rows of b) without a task id}``;
        rows without a task id (drawn from seeds) are not comparable.

    Raises:
        ConfigError: a file is not such a data set.
    """
    ka, ua = _read_keys(a)
    kb, ub = _read_keys(b)
    return {"common": sorted(ka & kb), "unknown": (ua, ub)}


def _check_main(args: Sequence[str]) -> int:
    import sys

    p = argparse.ArgumentParser(prog="agentfly-gym dataset check",
                                description="Exit 1 when two or more data sets share a task (env id, task id).")
    p.add_argument("files", nargs="+", help="parquet files written by agentfly-gym dataset")
    ns = p.parse_args(args)
    rc = 0
    try:
        for i, a in enumerate(ns.files):
            for b in ns.files[i + 1:]:
                res = shared_tasks(a, b)
                n = len(res["common"])
                print(f"{a} & {b}: {n} shared task(s)" + (f", e.g. {[t for _, t in res['common'][:5]]}" if n else ""))
                if any(res["unknown"]):
                    print(f"  warning: rows without a task id (not comparable): {res['unknown'][0]} in {a}, "
                          f"{res['unknown'][1]} in {b}", file=sys.stderr)
                rc = 1 if n else rc
    except ConfigError as e:
        print(f"agentfly-gym dataset check: error: {e}", file=sys.stderr)
        return 2
    return rc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentfly-gym dataset", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s ENV -o OUT [options]\n       %(prog)s check A.parquet B.parquet ...",
        description="Write a verl parquet data set of agentfly-gym episodes.",
        epilog="subcommand:\n"
               "  check A.parquet B.parquet ...\n"
               "                        print the tasks each pair of data sets shares; exit 1 when any pair shares\n"
               "                        one (e.g. a training and a validation set), 0 when none, 2 on an unreadable\n"
               "                        file (agentfly-gym dataset check --help)")
    p.add_argument("env", help="environment id, e.g. Chess, ScienceWorld-v0, agentfly/ALFWorld-v0")
    p.add_argument("-o", "--out", required=True, help="parquet file to write (an existing file is refused unless "
                                                      "--overwrite is given)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("-n", "--num", type=int, default=None, help="rows (default: the number of --tasks)")
    p.add_argument("--tasks", default=None, help="comma-separated task ids (reset option task_id)")
    p.add_argument("--tasks-file", default=None, help="file with one task id per line")
    p.add_argument("--split", default=None,
                   help="the env's task split: train (default), validation, test, or the env's own names")
    p.add_argument("--exclude", action="append", default=[], metavar="PARQUET",
                   help="leave out the tasks of this data set (repeatable), e.g. --exclude train.parquet")
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


def dataset_main(args: Sequence[str] | None = None) -> int:
    """CLI entry (``agentfly-gym dataset ...``): parse ``args`` (None: ``sys.argv[1:]``), write
    the data set, print its path.  Returns 0, or 2 on a configuration error (message on stderr).

    ``agentfly-gym dataset check A.parquet B.parquet ...`` prints the tasks each pair shares and returns 1
    when any pair shares one (0 when none, 2 on an unreadable file)."""
    import sys

    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["check"]:
        return _check_main(args[1:])
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
                             check=not ns.no_check, exclude=ns.exclude, overwrite=ns.overwrite)
    except (ConfigError, DataNotFoundError, OSError) as e:
        print(f"agentfly-gym dataset: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
