"""Play explicit tasks now: the runner a training loop calls every step.

:func:`~agentfly_gym.rollout.runner.run_rollouts` draws its own tasks and seeds and writes a run
folder; a trainer instead has a batch of rows (env id, task id, seed), wants them played at once,
concurrently, with the weights it is training, and wants the same resource manager (simulators,
containers, judge servers kept warm) across thousands of steps.  :class:`TaskRunner` does that::

    runner = TaskRunner(policy, chat, max_turns=8, sampling=SamplingParams(max_tokens=64))
    trajs = runner.play([TaskRow("Chess-v0", task_id="tewjc", seed=0)] * 4)   # sync code
    trajs = await runner.aplay(rows)                                          # or from a coroutine
    runner.close()

Each row becomes one :class:`~agentfly_gym.rollout.trajectory.Trajectory` (returned in the order of the
rows), played by :func:`~agentfly_gym.rollout.episode.play_episode` with its own env instance; a
row that fails while it plays (an unknown task id, a dead resource, model output) is returned with ``error`` set,
never raised; rows naming an env id that is not registered are refused up front (``ConfigError``), before any
row plays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..limits import EpisodeLimits, check_int
from ..registration import normalize_env_id
from ..resources.priority import acquire_priority
from .episode import MODES, play_episode
from .ordering import RolloutLengths, as_lengths, length_key
from .policies.base import SamplingParams
from .trajectory import Trajectory

__all__ = ["TaskRow", "TaskRunner"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskRow:
    """One episode to play.

    Attributes:
        env_id: a registered env id (short names such as ``"Chess-v0"`` accepted).
        task_id: the env's task (passed as ``options={"task_id": ...}`` to its reset); None lets the env
            draw one from ``seed``.
        seed: the reset seed (None: unseeded).
        group_id: trajectories with the same group id share a task (GRPO groups); "" leaves it empty.
        options: more reset options of the env.
        env_kwargs: constructor arguments of this row's env (e.g. ``{"split": "validation"}``), over the
            runner's ``env_kwargs`` for its env id.
    """

    env_id: str
    task_id: str | None = None
    seed: int | None = None
    group_id: str = ""
    options: Mapping[str, Any] | None = None
    env_kwargs: Mapping[str, Any] | None = None

    @classmethod
    def coerce(cls, row: TaskRow | Mapping[str, Any] | Sequence[Any]) -> TaskRow:
        """A :class:`TaskRow` from itself, a mapping of its fields, or a tuple ``(env_id, task_id, seed)``.

        Raises:
            ConfigError: anything else.
        """
        if isinstance(row, TaskRow):
            return row
        if isinstance(row, Mapping):
            unknown = sorted(set(row) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise ConfigError(f"task row {dict(row)!r}: unknown keys {unknown}")
            return cls(**row)
        if isinstance(row, (tuple, list)) and 1 <= len(row) <= 3:
            return cls(*row)
        raise ConfigError(f"a task row is a TaskRow, a mapping or an (env_id, task_id, seed) tuple, got {row!r}")

    def length_key(self) -> str | None:
        """The key its rollouts' lengths are predicted by: ``"ENV_ID/TASK_ID"`` (``"ENV_ID/seed=SEED"`` when the
        row names no task; None when it names neither a task nor a seed: a task drawn at random, which predicts
        nothing, is not learned from, and starts as a row never seen does)."""
        return length_key(normalize_env_id(self.env_id), self.task_id, self.seed)

    def reset_options(self) -> dict[str, Any] | None:
        opts = dict(self.options or {})
        if self.task_id not in (None, ""):
            opts["task_id"] = self.task_id
        return opts or None


class TaskRunner:
    """Plays given task rows concurrently with one policy and one long-lived resource manager.

    Args:
        policy: a TextPolicy (e.g. :meth:`TransformersPolicy.from_model
            <agentfly_gym.rollout.policies.transformers_policy.TransformersPolicy.from_model>` on a trainer's
            live weights) or an ActionPolicy.
        chat: the :class:`~agentfly_gym.rollout.chat.ChatTokenizer` of the policy's tokenizer.
        manager: a :class:`~agentfly_gym.resources.ResourceManager` to use (left open by :meth:`close`);
            None: one is made on first use (the kind ``AGENTFLY_GYM_MANAGER`` names) and closed by :meth:`close`.
        mode: ``"chain"`` or ``"step"``.
        concurrency: most episodes in flight at once.
        sampling: as in :func:`~agentfly_gym.rollout.episode.play_episode`.
        limits: each episode's :class:`~agentfly_gym.limits.EpisodeLimits` (None: the defaults, 10 turns);
            kept as :attr:`limits`.
        max_turns, history, max_context_tokens, max_response_tokens, max_prompt_tokens: the older way to
            give limits; each one given (not None) replaces that field of ``limits``.
        env_kwargs: per env id, constructor keyword arguments.
        reward: a configured episode reward (``"judge:..."``, ``"MODULE:FUNCTION"``, an ``EpisodeReward``),
            applied to each finished trajectory; None keeps the env's return.
        lengths: predicted rollout lengths (a :class:`~agentfly_gym.rollout.ordering.RolloutLengths`, a user
            estimate: a mapping or callable of :meth:`TaskRow.length_key`, or a JSON path to keep them in);
            None: a fresh :class:`RolloutLengths`.  Each call starts its rows longest-predicted first (rows
            never seen keep their order) and gives each episode's acquisitions that priority, so the longest
            rollouts get scarce slots and instances first; every finished trajectory updates the estimate
            (saved to its ``path`` after each call, when it has one).  ``order="arrival"`` plays rows in
            their given order with FIFO acquisitions.

    Use either the sync API (:meth:`play`, :meth:`close`: on the library's background event loop) or the
    async one (:meth:`aplay`, :meth:`aclose`: in the caller's loop) on one runner, not both: the manager lives
    on the loop of its first use.

    Raises:
        ConfigError: a bad ``mode``, ``concurrency``, ``order`` or limit (``field`` names it).
    """

    def __init__(self, policy: Any, chat: Any, *, manager: Any = None, mode: str = "chain", concurrency: int = 8,
                 sampling: SamplingParams | None = None, limits: EpisodeLimits | None = None,
                 max_turns: int | None = None, history: int | None = None,
                 max_context_tokens: int | None = None, max_response_tokens: int | None = None,
                 max_prompt_tokens: int | None = None, env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 reward: Any = None, lengths: Any = None, order: str = "longest") -> None:
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r} is not one of {MODES}", field="mode")
        check_int("concurrency", concurrency)
        from ..rewards.configured import parse_reward

        self.policy, self.chat, self.mode, self.concurrency = policy, chat, mode, concurrency
        self.sampling = sampling or SamplingParams()
        self.limits = EpisodeLimits.merge(limits, max_turns=max_turns, history=history,
                                          max_context_tokens=max_context_tokens,
                                          max_response_tokens=max_response_tokens, max_prompt_tokens=max_prompt_tokens)
        self.env_kwargs = {normalize_env_id(k): dict(v) for k, v in (env_kwargs or {}).items()}
        self.reward = parse_reward(reward)
        if order not in ("longest", "arrival"):
            raise ConfigError(f"order={order!r} is not one of ('longest', 'arrival')", field="order")
        self.order = order
        given = as_lengths(lengths)
        self.lengths: RolloutLengths = given if given is not None else RolloutLengths()
        self._manager = manager
        self._own_manager = manager is None
        self._count = 0

    # the limits' fields, read as attributes of the runner, as before they moved into ``limits``
    max_turns = property(lambda self: self.limits.max_turns)
    history = property(lambda self: self.limits.history)
    max_context_tokens = property(lambda self: self.limits.max_context_tokens)
    max_response_tokens = property(lambda self: self.limits.max_response_tokens)
    max_prompt_tokens = property(lambda self: self.limits.max_prompt_tokens)

    @property
    def manager(self) -> Any:
        """The resource manager (None before the first :meth:`aplay` when the runner makes its own)."""
        return self._manager

    async def aplay(self, rows: Iterable[TaskRow | Mapping[str, Any] | Sequence[Any]], *,
                    sampling: SamplingParams | None = None) -> list[Trajectory]:
        """Play ``rows`` now, at most ``concurrency`` at once, and return one trajectory per row, in order.

        Trajectory ids are ``task-NNNNNN``, counted over the runner's life.  ``sampling`` overrides the
        runner's for this call.

        Raises:
            ConfigError: a row that is not a task row (before anything is played).
            asyncio.CancelledError: when cancelled (every episode's resources are released first).
        """
        rows = [TaskRow.coerce(r) for r in rows]
        envs = [normalize_env_id(r.env_id) for r in rows]
        if self._manager is None:
            from ..resources.select import manager_from_environment

            self._manager = manager_from_environment()
        sem = asyncio.Semaphore(self.concurrency)
        first, self._count = self._count, self._count + len(rows)
        sampling = sampling or self.sampling

        keys = [r.length_key() for r in rows]
        if self.order == "longest":
            start, preds = self.lengths.order(keys)
        else:
            start, preds = list(range(len(rows))), [None] * len(rows)

        async def one(k: int, row: TaskRow, env_id: str) -> Trajectory:
            async with sem, acquire_priority(preds[k]):
                traj = await play_episode(
                    env_id, self.policy, self.chat, mode=self.mode, manager=self._manager,
                    env_kwargs={**self.env_kwargs.get(env_id, {}), **dict(row.env_kwargs or {})} or None,
                    sampling=sampling, limits=self.limits, seed=row.seed,
                    options=row.reset_options(), trajectory_id=f"task-{first + k:06d}",
                    group_id=row.group_id)
                if keys[k] is not None:
                    self.lengths.observe_trajectory(keys[k], traj)
                if self.reward is not None:
                    await self.reward.apply(traj, manager=self._manager)
                return traj

        # created longest-predicted first: the semaphore admits its waiters in that order
        by_start = {k: asyncio.ensure_future(one(k, rows[k], envs[k])) for k in start}
        tasks = [by_start[k] for k in range(len(rows))]
        try:
            out = list(await asyncio.gather(*tasks))
            try:
                self.lengths.save()
            except OSError as e:  # a full disk must not cost the trainer this call's trajectories
                log.warning("could not save the rollout-length estimate (%s); the trajectories are returned", e)
            return out
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def play(self, rows: Iterable[TaskRow | Mapping[str, Any] | Sequence[Any]], *,
             sampling: SamplingParams | None = None) -> list[Trajectory]:
        """Sync :meth:`aplay` (runs on the library's background loop; call it from sync code only)."""
        from ..utils.aio import run_sync

        return run_sync(self.aplay(rows, sampling=sampling))

    async def aclose(self) -> None:
        """Close the manager if the runner made it (the policy is the caller's to close).  Idempotent."""
        manager, self._manager = self._manager, (None if self._own_manager else self._manager)
        if self._own_manager and manager is not None:
            await manager.aclose()

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        if self._own_manager and self._manager is not None:
            from ..utils.aio import run_sync

            run_sync(self.aclose())

    async def __aenter__(self) -> TaskRunner:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __enter__(self) -> TaskRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
