"""Run an evaluation: every chosen task of every env played exactly k times, concurrently, saved as it goes, and
resumed where it stopped.

The output folder holds

* ``eval.json``: what was evaluated (model, envs, splits, tasks, k, sampling, limits); a later run into the
  folder must evaluate the same model with the same settings (tasks and k may grow) or it is refused;
* ``progress.jsonl``: one line per finished sample (``{"env_id", "task", "sample", "trajectory": {...}}``),
  appended and flushed as each finishes, so a crashed or interrupted run loses only the samples in flight;
* when the run ends: ``trajectories.parquet`` / ``trajectories.jsonl`` (as ``agentfly-gym rollout`` writes them:
  :func:`~agentfly_gym.rollout.trajectory.save_trajectories`), ``results.json``
  (:func:`~agentfly_gym.eval.results.summarize_eval`), ``report.md`` and ``pass_at_k.png``
  (:mod:`agentfly_gym.eval.report`).

While it runs, the folder is locked (:func:`~agentfly_gym.rollout.outputs.folder_lock`, the lock of a rollout
run): a second process evaluating into it is refused with a message naming the first.

Resume: a sample (env, task, j) already in ``progress.jsonl`` without an infrastructure error is not played
again; one that ended in an error (:func:`~agentfly_gym.eval.results.is_error`) is played again, and the
latest line of a sample wins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..limits import EpisodeLimits, check_int
from ..rollout.policies.base import SamplingParams
from ..rollout.trajectory import Trajectory
from .plan import EnvTasks
from .results import is_error, summarize_eval

__all__ = ["MANIFEST_NAME", "MAX_SAMPLES", "PROGRESS_NAME", "RESULTS_NAME", "EvalConfig", "EvalResult", "arun_eval"]

log = logging.getLogger(__name__)

MANIFEST_NAME = "eval.json"
PROGRESS_NAME = "progress.jsonl"
RESULTS_NAME = "results.json"
#: The most samples (tasks x k, over every env) one evaluation plays: each is held in memory until the end.
MAX_SAMPLES = 1_000_000


@dataclasses.dataclass
class EvalConfig:
    """What to evaluate.

    Attributes:
        plans: per env, its tasks (:func:`~agentfly_gym.eval.plan.plan_tasks`).
        k: samples per task (>= 1); sample j of a listed task resets with seed ``seed + j``.
        model: how the policy is named in the outputs (e.g. ``"openai:gpt-4.1-mini"``, ``"smollm2"``).
        max_concurrency: most episodes in flight at once.
        max_turns: most policy turns per episode (the older way; ``limits`` holds it).
        limits: the episode's :class:`~agentfly_gym.limits.EpisodeLimits` (None: ``max_turns`` and the defaults).
        sampling: how replies are sampled.
        seed: the first reset seed, and the bootstrap's seed.
        output_dir: the folder (None: nothing saved, nothing resumed).
        mode: ``"chain"`` or ``"step"`` (a chat endpoint plays chain).

    Raises:
        ConfigError: a bad ``k``, ``max_concurrency`` or ``max_turns``, no env, or more than
            :data:`MAX_SAMPLES` samples (tasks x k).
    """

    plans: list[EnvTasks]
    k: int = 1
    model: str = ""
    max_concurrency: int = 8
    max_turns: int | None = None
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    seed: int = 0
    output_dir: str | Path | None = None
    mode: str = "chain"
    limits: EpisodeLimits | None = None

    def __post_init__(self) -> None:
        from ..data.task_draw import check_seed

        if not self.plans:
            raise ConfigError("an evaluation needs at least one environment", field="plans")
        self.k = check_int("k", self.k)
        n_tasks = sum(len(p.tasks) for p in self.plans)
        if n_tasks * self.k > MAX_SAMPLES:
            raise ConfigError(f"k={self.k} with {n_tasks} task(s) is {n_tasks * self.k} samples; an evaluation plays "
                              f"at most {MAX_SAMPLES} (lower -k or --tasks)", field="k")
        self.max_concurrency = check_int("max_concurrency", self.max_concurrency)
        self.limits = EpisodeLimits.merge(self.limits, max_turns=self.max_turns)
        self.max_turns = self.limits.max_turns
        check_seed(self.seed, "seed")
        if self.seed + self.k - 1 >= 2**63:
            raise ConfigError(f"seed={self.seed} with k={self.k}: the last sample's seed is past 2**63 - 1")
        ids = [p.env_id for p in self.plans]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"an env is named twice: {ids}")

    def settings(self) -> dict[str, Any]:
        """What must not change between a run and its resumption."""
        return {"model": self.model, "mode": self.mode, "max_turns": self.max_turns, "seed": self.seed,
                "limits": self.limits.to_dict(),
                "sampling": self.sampling.to_dict(),
                "envs": {p.env_id: {"split": p.split, "env_kwargs": p.env_kwargs} for p in self.plans}}


@dataclasses.dataclass
class EvalResult:
    """``results`` (the ``results.json`` dict), the trajectories per env and task, what this call played, and the
    written paths by kind."""

    results: dict[str, Any]
    samples: dict[str, dict[str, list[Trajectory]]]
    played: int
    paths: dict[str, Path] = dataclasses.field(default_factory=dict)


def _key(env_id: str, task: str, j: int) -> tuple[str, str, int]:
    return (env_id, task, int(j))


def _checked(traj: Trajectory) -> Trajectory:
    """``traj`` if the fields the scores read have their types (a hand-edited or corrupted line may not).

    Raises:
        TypeError: a reward that is not a finite number, a success that is not a bool, a status that is not a str.
    """
    reward = traj.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise TypeError(f"reward={reward!r} is not a finite number")
    if not isinstance(traj.success, bool) or not isinstance(traj.status, str):
        raise TypeError(f"success={traj.success!r} / status={traj.status!r} are not a bool and a str")
    return traj


def _jsonable(settings: Any) -> Any:
    return json.loads(json.dumps(settings, default=str))


def _check_manifest(out: Path, config: EvalConfig) -> None:
    """Write ``eval.json``, or check that the folder's describes the same evaluation.

    Raises:
        ConfigError: the folder holds another evaluation (the message names what differs).
    """
    path = out / MANIFEST_NAME
    mine = _jsonable(config.settings())
    if path.exists():
        try:
            theirs = json.loads(path.read_text(encoding="utf-8")).get("settings")
        except (ValueError, AttributeError) as e:
            raise ConfigError(f"{path} is not an evaluation's manifest ({e}); use another --output-dir") from None
        if theirs != mine:
            keys = sorted(k for k in set(mine) | set(theirs or {}) if (theirs or {}).get(k) != mine.get(k))
            raise ConfigError(f"--output-dir {out} holds an evaluation with other settings ({', '.join(keys)} "
                              f"differ: there {[(theirs or {}).get(k) for k in keys]}, here {[mine.get(k) for k in keys]}"
                              "); give another --output-dir to evaluate these settings")
    from ..utils.files import atomic_path

    manifest = {"settings": mine, "k": config.k,
                "tasks": {p.env_id: p.tasks for p in config.plans}}
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def _check_foreign(out: Path) -> None:
    """Refuse a folder that holds another command's run (``agentfly-gym rollout``'s files without an ``eval.json``):
    the evaluation would overwrite its ``trajectories.parquet``.

    Raises:
        ConfigError: naming the folder and what it holds.
    """
    from ..rollout.outputs import RUN_FILES

    if (out / MANIFEST_NAME).exists():
        return
    held = [name for name in (*RUN_FILES, PROGRESS_NAME, RESULTS_NAME) if (out / name).exists()]
    if held:
        raise ConfigError(f"--output-dir {out} holds {held} but no {MANIFEST_NAME}: another command's run, not an "
                          "evaluation; give another --output-dir (nothing there was changed)")


def _load_progress(out: Path) -> dict[tuple[str, str, int], Trajectory]:
    """The latest trajectory of each sample in ``progress.jsonl`` (a torn last line, from a crash, is skipped)."""
    path = out / PROGRESS_NAME
    done: dict[tuple[str, str, int], Trajectory] = {}
    if not path.exists():
        return done
    with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is one bad line, not a failed resume
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key = _key(rec["env_id"], rec["task"], rec["sample"])
                traj = _checked(Trajectory.from_record(rec["trajectory"]))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                log.warning("%s line %d is not a finished sample (%s); it is played again", path, n, e)
                continue
            done[key] = traj
    return done


async def arun_eval(config: EvalConfig, policy: Any, chat: Any, *, manager: Any = None,
                    progress: bool = True) -> EvalResult:
    """Play what is missing of ``config`` and summarize every sample (see the module docstring).

    Args:
        config: the evaluation.
        policy: a TextPolicy, ActionPolicy or ChatPolicy (an endpoint).
        chat: the policy's :class:`~agentfly_gym.rollout.chat.ChatTokenizer` (None for a ChatPolicy).
        manager: a resource manager (left open); None: one is made (``AGENTFLY_GYM_MANAGER``) and closed here.
        progress: show a progress bar.

    Returns:
        :class:`EvalResult`.

    Raises:
        ConfigError: the output folder holds another evaluation.
        OutputBusyError: another process is evaluating into the output folder.
        asyncio.CancelledError: when cancelled (finished samples are already saved in ``progress.jsonl``).
    """
    out = Path(config.output_dir) if config.output_dir is not None else None
    if out is None:
        return await _play(config, policy, chat, None, manager=manager, progress=progress)
    from ..rollout.outputs import folder_lock

    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out):  # a second process evaluating into the folder is refused, naming this one
        return await _play(config, policy, chat, out, manager=manager, progress=progress)


async def _play(config: EvalConfig, policy: Any, chat: Any, out: Path | None, *, manager: Any,
                progress: bool) -> EvalResult:
    from ..rollout.episode import play_episode

    done: dict[tuple[str, str, int], Trajectory] = {}
    if out is not None:
        _check_foreign(out)
        _check_manifest(out, config)
        done = _load_progress(out)
    todo = [(p, task, j) for p in config.plans for task in p.tasks for j in range(config.k)
            if (t := done.get(_key(p.env_id, task, j))) is None or is_error(t)]
    own = manager is None
    if own:
        from ..resources.select import manager_from_environment

        manager = manager_from_environment()
    sem = asyncio.Semaphore(config.max_concurrency)
    # one short line per finished episode, flushed at once so a crash loses nothing finished (too small to hand
    # to a thread)
    sink = open(out / PROGRESS_NAME, "a", encoding="utf-8") if out is not None else None  # noqa: ASYNC230, SIM115
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="eval", unit="episode", smoothing=0)

    async def one(plan: EnvTasks, task: str, j: int) -> None:
        task_id, seed = plan.reset_of(task)
        async with sem:
            traj = await play_episode(
                plan.env_id, policy, chat, mode=config.mode, manager=manager, env_kwargs=plan.env_kwargs,
                sampling=config.sampling, limits=config.limits,
                seed=seed if seed is not None else config.seed + j,
                options={"task_id": task_id} if task_id is not None else None,
                trajectory_id=f"{plan.env_id.rsplit('/', 1)[-1]}/{task}/{j}", group_id=f"{plan.env_id}/{task}")
        done[_key(plan.env_id, task, j)] = traj
        if sink is not None:
            rec = {"env_id": plan.env_id, "task": task, "sample": j, "trajectory": traj.to_record()}
            sink.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            sink.flush()
        if bar is not None:
            bar.update(1)

    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(one(p, task, j)) for p, task, j in todo]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if sink is not None:
            sink.close()
        if bar is not None:
            bar.close()
        if own:
            await manager.aclose()
    samples = {p.env_id: {task: [done[_key(p.env_id, task, j)] for j in range(config.k)] for task in p.tasks}
               for p in config.plans}
    meta = {"model": config.model, "splits": {p.env_id: p.split for p in config.plans},
            "settings": _jsonable(config.settings()), "played_now": len(todo),
            "wall_s": time.monotonic() - t0,
            "text_only": any(t.text_only for by in samples.values() for ts in by.values() for t in ts)}
    results = summarize_eval(samples, config.k, seed=config.seed, meta=meta)
    result = EvalResult(results=results, samples=samples, played=len(todo))
    if out is not None:
        result.paths = _save(out, results, samples)
    return result


def _save(out: Path, results: dict[str, Any], samples: dict[str, dict[str, list[Trajectory]]]) -> dict[str, Path]:
    from ..rollout.trajectory import save_trajectories
    from ..utils.files import atomic_path
    from .report import write_report

    trajs: Sequence[Trajectory] = [t for by in samples.values() for ts in by.values() for t in ts]
    paths = dict(save_trajectories(trajs, out))
    paths["results"] = out / RESULTS_NAME
    with atomic_path(paths["results"]) as tmp:
        Path(tmp).write_text(json.dumps(results, indent=2, allow_nan=False), encoding="utf-8")
    paths.update(write_report(results, out))
    return paths
