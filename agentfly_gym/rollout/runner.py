"""Run many trajectories as independent asyncio tasks with bounded concurrency.

Each trajectory is its own task with its own environment instance and rollout scope, so
a slow step in one never blocks the others (AgentFly's fully asynchronous rollout); the
shared :class:`~agentfly_gym.resources.ResourceManager` caps and reuses what backs them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import gymnasium

from ..errors import ConfigError
from ..limits import EpisodeLimits, check_int
from ..registration import normalize_env_id  # also re-exported here: its old home
from ..resources import teardown
from ..resources.priority import acquire_priority
from ..resources.protocol import Manager
from .episode import MODES, play_episode
from .policies.base import SamplingParams
from .outputs import IF_EXISTS, RunOutput, check_output_dir, run_output
from .summary import summarize
from .trajectory import Trajectory

__all__ = ["RolloutConfig", "RolloutResult", "check_config", "run_rollouts", "normalize_env_id", "LENGTHS_NAME",
           "ORDERS"]

log = logging.getLogger(__name__)

#: The file in a run's output folder that keeps the predicted rollout lengths (``order="longest"``).
LENGTHS_NAME = "lengths.json"
#: The start orders of :class:`RolloutConfig`.
ORDERS = ("longest", "arrival")


@dataclasses.dataclass
class RolloutConfig:
    """What to roll out.

    Attributes:
        env_ids: registered env ids (short names accepted); groups alternate between them.
        num_trajectories: total trajectories.
        group_size: trajectories per group; a group shares one task (same reset seed), as GRPO needs.
            ``num_trajectories`` must be a multiple of it (a smaller last group would bias its advantages
            silently), unless ``allow_partial_group``.
        concurrency: most trajectories in flight at once.
        limits: each episode's :class:`~agentfly_gym.limits.EpisodeLimits` (turns, token caps, step-mode
            history); None: built from ``max_turns``, ``max_context_tokens`` and ``history``.  After
            construction ``limits`` is always set, and those three fields mirror it.
        max_turns: most policy turns per trajectory (None: ``limits``' or 10); given, it replaces
            ``limits.max_turns`` (as ``max_context_tokens`` and ``history`` replace theirs), so to swap
            the limits of an existing config, ``dataclasses.replace(config, limits=new, max_turns=None,
            max_context_tokens=None, history=None)``.
        seed: group g resets with seed ``seed + g``.  None (the default): each :func:`run_rollouts` call draws
            a fresh seed (recorded in ``summary["config"]["seed"]``), so calling it again in a training loop
            plays new tasks; an int replays the same tasks.
        sampling: sampling parameters for model policies.
        max_context_tokens: token budget per chain (see :func:`run_chain_episode`).
        env_kwargs: per env id (full id), constructor kwargs.
        mode: ``"chain"`` (one sequence per trajectory) or ``"step"`` (one row per step).
        history: step mode: past (action, observation) pairs shown in each fresh prompt (None: ``limits``' or 3).
        output_dir: where to write trajectories and summary.json; None writes nothing.
        if_exists: when ``output_dir`` already holds a run: ``"fail"`` (refused before anything runs),
            ``"replace"`` (replaced once this run is complete) or ``"append"`` (added to); see
            :mod:`agentfly_gym.rollout.outputs`, which also keeps a second process out of the folder.
        reward: an episode reward from configuration (``"judge:..."``, ``"MODULE:FUNCTION"`` or an
            :class:`~agentfly_gym.rewards.configured.EpisodeReward`; see that module), or None: the env's return.
        allow_partial_group: let the last group be smaller than ``group_size``.
        lengths: predicted rollout lengths, keyed ``"ENV_ID/seed=SEED"`` (a
            :class:`~agentfly_gym.rollout.ordering.RolloutLengths`, a mapping or callable estimate, or a JSON
            path); every finished trajectory updates it (kept across calls with this config), whatever the
            ``order``.  None: a fresh one.  Tasks repeat only with a fixed ``seed``.
        order: ``"longest"`` (default): trajectories start longest-predicted first and their acquisitions carry
            that priority (nothing known: arrival order, FIFO acquisitions).  ``"arrival"``: arrival order and
            FIFO acquisitions.  Either way, with ``output_dir`` set and an estimate without a ``path`` of its own,
            the estimate is kept as :data:`LENGTHS_NAME` in the folder (read at the start, so a resumed or
            appended run keeps it; written atomically once the run's files are saved, also when interrupted), so
            an ``"arrival"`` run's observed lengths order a later ``"longest"`` run.  A folder's
            :data:`LENGTHS_NAME` that is not a saved estimate is refused, unless ``if_exists="replace"``: then it
            is ignored (a warning) and replaced.
        tasks: per env id, task ids to play in order: the i-th group of that env plays ``tasks[i % len(tasks)]``
            (reset option ``task_id``; no task repeats before all were played); an env not named draws its task
            from the group's seed.  None: every env draws from seeds.
    """

    env_ids: list[str]
    num_trajectories: int = 8
    group_size: int = 1
    concurrency: int = 8
    max_turns: int | None = None
    seed: int | None = None
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    max_context_tokens: int | None = None
    env_kwargs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    mode: str = "chain"
    history: int | None = None
    output_dir: str | Path | None = None
    reward: Any = None
    if_exists: str = "fail"
    allow_partial_group: bool = False
    lengths: Any = None
    order: str = "longest"
    limits: EpisodeLimits | None = None
    tasks: dict[str, list[str]] | None = None

    def __post_init__(self) -> None:
        if not self.env_ids:
            raise ConfigError("env_ids must name at least one environment", field="env_ids")
        self.env_ids = [normalize_env_id(e) for e in self.env_ids]
        self.env_kwargs = {normalize_env_id(k): dict(v) for k, v in self.env_kwargs.items()}
        for name in ("num_trajectories", "group_size", "concurrency"):
            check_int(name, getattr(self, name))
        self.limits = EpisodeLimits.merge(self.limits, max_turns=self.max_turns, history=self.history,
                                          max_context_tokens=self.max_context_tokens)
        self.max_turns, self.history = self.limits.max_turns, self.limits.history
        self.max_context_tokens = self.limits.max_context_tokens
        if self.num_trajectories % self.group_size and not self.allow_partial_group:
            raise ConfigError(f"num_trajectories={self.num_trajectories} is not a multiple of group_size={self.group_size}: "
                              f"the last group would hold {self.num_trajectories % self.group_size}; pass a multiple, or "
                              "allow_partial_group=True", field="num_trajectories")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"seed={self.seed!r} must be an integer or None (a fresh seed per run)", field="seed")
        if self.if_exists not in IF_EXISTS:
            raise ConfigError(f"if_exists={self.if_exists!r} is not one of {IF_EXISTS}", field="if_exists")
        if self.mode not in MODES:
            raise ConfigError(f"mode={self.mode!r} is not one of {MODES}", field="mode")
        if self.reward is not None:
            from ..rewards.configured import parse_reward

            self.reward = parse_reward(self.reward)
        from .ordering import RolloutLengths, as_lengths

        if self.order not in ORDERS:
            raise ConfigError(f"order={self.order!r} is not one of {ORDERS}", field="order")
        self.lengths = as_lengths(self.lengths)
        if self.lengths is None:  # observed whatever the order: an arrival run's lengths order a later run
            self.lengths = RolloutLengths()
        if self.tasks is not None:
            self.tasks = {normalize_env_id(k): [str(t) for t in v] for k, v in self.tasks.items()}
            empty = sorted(k for k, v in self.tasks.items() if not v)
            if empty or set(self.tasks) - set(self.env_ids):
                raise ConfigError(f"tasks must name rolled-out environments with at least one task id each: "
                                  f"{sorted(self.tasks)}; env_ids: {self.env_ids}", field="tasks")
        unused = sorted(set(self.env_kwargs) - set(self.env_ids))
        if unused:
            raise ConfigError(f"env_kwargs name environments that are not rolled out: {unused}; env_ids: {self.env_ids}",
                              field="env_kwargs")


@dataclasses.dataclass
class RolloutResult:
    """Trajectories in order of their index, and the summary dict (see :func:`summarize`)."""

    trajectories: list[Trajectory]
    summary: dict[str, Any]
    paths: dict[str, Path] = dataclasses.field(default_factory=dict)


async def _one(config: RolloutConfig, k: int, policy: Any, chat: Any, manager: Manager,
               out: RunOutput | None = None) -> Trajectory:
    g = k // config.group_size
    env_id = config.env_ids[g % len(config.env_ids)]
    # appending to a run: ids continue after its ids, so groups of different runs never share one
    first_k, first_g = (out.next_index, out.next_group) if out is not None else (0, 0)
    listed = (config.tasks or {}).get(env_id)
    options = {"task_id": listed[(g // len(config.env_ids)) % len(listed)]} if listed else None
    traj = await play_episode(env_id, policy, chat, mode=config.mode, manager=manager, options=options,
                              env_kwargs=config.env_kwargs.get(env_id, {}), sampling=config.sampling,
                              limits=config.limits, seed=config.seed + g,
                              trajectory_id=f"traj-{first_k + k:05d}", group_id=f"group-{first_g + g:05d}")
    if config.reward is not None:  # a judge / custom reward from configuration (never raises; skips failed ones)
        await config.reward.apply(traj, manager=manager)
    return traj


def _length_key(config: RolloutConfig, k: int) -> str:
    """Trajectory ``k``'s task as a length-prediction key: ``"ENV_ID/seed=SEED"``."""
    g = k // config.group_size
    return f"{config.env_ids[g % len(config.env_ids)]}/seed={config.seed + g}"


def check_config(config: RolloutConfig) -> None:
    """Build each environment once with its kwargs (no resource is started) so that a typo or a bad
    value fails before any rollout, and make sure the output folder may be written (writable, not being
    written by another process, and any run in it allowed by ``config.if_exists``).

    Raises:
        ConfigError: an env rejects its kwargs, or the output folder cannot be written.
        OutputExistsError: the output folder holds a run and ``config.if_exists`` is ``"fail"``.
        OutputBusyError: another process is writing the output folder.
        DataNotFoundError: an env's data is missing.
    """
    for env_id in config.env_ids:
        kwargs = config.env_kwargs.get(env_id, {})
        try:
            env = gymnasium.make(env_id, **kwargs)
        except TypeError as e:
            from ..registration import bad_kwargs_error

            raise bad_kwargs_error(env_id, kwargs, e) from None
        env.unwrapped.discard()  # nothing was acquired: closing needs no event loop
    if config.output_dir is not None:
        check_output_dir(config.output_dir, config.if_exists, mode=config.mode)
        path = _lengths_path(config)
        if path is not None and path.exists() and not _replaced(config):
            from .ordering import RolloutLengths

            RolloutLengths(path=path)  # a file that is not a saved estimate is refused before anything runs


def _lengths_path(config: RolloutConfig) -> Path | None:
    """Where the run keeps its predicted lengths: the estimate's own ``path``, else :data:`LENGTHS_NAME` in the
    output folder; None: not kept."""
    lengths = config.lengths
    if lengths is None:
        return None
    if lengths.path is not None:
        return lengths.path
    if config.output_dir is not None:
        return Path(config.output_dir) / LENGTHS_NAME
    return None


def _replaced(config: RolloutConfig) -> bool:
    """Whether the run replaces its output folder's files, the folder's :data:`LENGTHS_NAME` included: an
    unreadable one is then ignored and replaced, not refused (a path of the estimate's own is always read)."""
    return config.if_exists == "replace" and config.lengths is not None and config.lengths.path is None


def _load_kept(config: RolloutConfig, path: Path) -> None:
    """Take in the folder's saved estimate (checked readable by :func:`check_config`, unless replacing)."""
    try:
        config.lengths.load(path)
    except ConfigError as e:
        if not _replaced(config):
            raise
        log.warning("%s; ignored, and replaced by this run's estimate (the run replaces the folder's files)", e)


def _save_lengths(config: RolloutConfig) -> None:
    """Write the run's predicted lengths (see :func:`_lengths_path`); a failure is a warning, never an error:
    the run's trajectories are saved already."""
    path = _lengths_path(config)
    if path is None or not len(config.lengths):
        return
    try:
        config.lengths.save(path)
    except Exception as e:  # noqa: BLE001 - a full disk, a removed folder: the estimate is only an optimisation
        log.warning("could not save the rollout-length estimate to %s (%s: %s); the trajectories were saved, the "
                    "next run starts without it", path, type(e).__name__, e)


def _finish(config: RolloutConfig, trajectories: list[Trajectory], wall: float, manager: Manager,
            out: RunOutput | None, *, interrupted: bool = False) -> RolloutResult:
    """Summarize and (if ``out``) save ``trajectories`` (see :meth:`RunOutput.save`)."""
    summary = summarize(trajectories, wall, manager)
    summary["mode"] = config.mode
    summary["interrupted"] = interrupted
    summary["config"] = {"env_ids": config.env_ids, "num_trajectories": config.num_trajectories,
                         "group_size": config.group_size, "concurrency": config.concurrency,
                         "max_turns": config.max_turns, "limits": config.limits.to_dict(), "seed": config.seed,
                         "sampling": config.sampling.to_dict(),
                         "reward": config.reward.spec if config.reward is not None else None}
    result = RolloutResult(trajectories=trajectories, summary=summary)
    if out is not None:
        result.paths = out.save(trajectories, summary, interrupted=interrupted)
    return result


async def run_rollouts(config: RolloutConfig, policy: Any, chat: Any, *, manager: Manager | None = None,
                       progress: bool = True) -> RolloutResult:
    """Roll out ``config.num_trajectories`` trajectories concurrently and (optionally) save them.

    The config is checked first (:func:`check_config`), and the output folder is locked for the run (a
    second process is refused; see :mod:`agentfly_gym.rollout.outputs` for what happens to a run already
    there).  Files are written under temporary names and renamed when complete.  A trajectory that fails (e.g. no resource could be started) is kept with its ``error``
    set; it never stops the others.  If the run is cancelled (Ctrl-C under ``asyncio.run``),
    the trajectories finished so far are saved (``summary["interrupted"] = True``; in the sub-folder
    ``interrupted/`` when the folder holds a complete run, which is never replaced by a partial one) before the
    cancellation propagates, and every resource is released.  With ``manager=None`` a manager of the kind
    ``AGENTFLY_GYM_MANAGER`` names (local by default, see :mod:`agentfly_gym.resources.select`)
    is created and closed here; a given manager is left open.  For the length of the run a SIGTERM tears every
    manager's resources down before the process ends, unless the application handles SIGTERM itself (see
    :func:`agentfly_gym.resources.teardown.sigterm_teardown`); the previous handler is put back afterwards.

    Returns:
        RolloutResult with trajectories ordered by index and the summary dict (when appending, the folder's
        files and ``result.summary`` hold every run's trajectories; ``result.trajectories`` this run's).

    Raises:
        OutputExistsError, OutputBusyError, ConfigError: see :func:`check_config` (also: the output folder's
            :data:`LENGTHS_NAME` is not a saved estimate).
    """
    check_config(config)
    if config.seed is None:  # a fresh seed per call: a training loop calling again plays new tasks
        config = dataclasses.replace(config, seed=secrets.randbelow(2**31))
    with teardown.sigterm_teardown(), run_output(config.output_dir, config.if_exists, mode=config.mode) as out:
        return await _run_locked(config, policy, chat, out, manager=manager, progress=progress)


async def _run_locked(config: RolloutConfig, policy: Any, chat: Any, out: RunOutput | None, *,
                      manager: Manager | None, progress: bool) -> RolloutResult:
    own = manager is None
    if manager is None:  # AGENTFLY_GYM_MANAGER: local (default), ray or auto
        from ..resources.select import manager_from_environment

        manager = manager_from_environment()
    sem = asyncio.Semaphore(config.concurrency)
    finished: dict[int, Trajectory] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        # smoothing=0: the bar's rate is finished/elapsed, the summary's trajectories_per_s, not tqdm's moving
        # average of the last few updates (which differs widely on short runs)
        bar = tqdm(total=config.num_trajectories, desc="rollout", unit="traj", smoothing=0)

    lengths = config.lengths
    n = config.num_trajectories
    keys = [_length_key(config, k) for k in range(n)]
    kept = _lengths_path(config)
    if kept is not None and lengths.path is None:
        _load_kept(config, kept)  # a resumed run's estimate
    ordered = lengths is not None and config.order == "longest"
    start, preds = lengths.order(keys) if ordered else (list(range(n)), [None] * n)

    async def guarded(k: int) -> Trajectory:
        async with sem, acquire_priority(preds[k]):
            res = await _one(config, k, policy, chat, manager, out)
        finished[k] = res
        if lengths is not None:
            lengths.observe_trajectory(keys[k], res)
        log.info("trajectory %s (%s) finished: %d turns, reward %.3f%s", res.trajectory_id, res.env_id,
                 len(res.turns), res.reward, f", error: {res.error}" if res.error else "")
        if bar is not None:
            bar.update(1)
        return res

    t0 = time.monotonic()
    # created longest-predicted first (arrival order without a prediction): the semaphore admits in that order
    by_start = {k: asyncio.create_task(guarded(k)) for k in start}
    tasks = [by_start[k] for k in range(n)]
    try:
        # asyncio.wait, not gather: a cancellation reaches this task at once, so the finished trajectories
        # are saved before the running ones are torn down (a second Ctrl-C during that tear-down loses nothing)
        await asyncio.wait(tasks)
        trajectories = [t.result() for t in tasks]
        result = _finish(config, trajectories, time.monotonic() - t0, manager, out)
        _save_lengths(config)  # after the trajectories: a failure here loses nothing of the run
        return result
    except asyncio.CancelledError:
        if out is not None:
            partial = [finished[k] for k in sorted(finished)]
            # written even when nothing finished, so an earlier run's files in the folder are not mistaken
            # for this run's (a complete earlier run is kept: these go to interrupted/ then)
            saved = _finish(config, partial, time.monotonic() - t0, manager, out, interrupted=True)
            where = saved.paths["summary"].parent if saved.paths else config.output_dir
            log.warning("rollout interrupted: saved %d finished trajectories to %s", len(partial), where)
        _save_lengths(config)
        raise
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if bar is not None:
            bar.close()
        if own:
            await manager.aclose()
