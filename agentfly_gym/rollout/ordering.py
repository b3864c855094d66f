"""Predicted rollout lengths, and the longest-first start order they give.

When rollouts outnumber the slots (the runner's ``concurrency`` or a pool's ``max_instances``), the order
in which they start decides how long the batch takes: started in arrival order, a long rollout that starts
last keeps the batch waiting while the other slots idle; started longest first (list scheduling, LPT) the
last wave is short.  The lengths are not known in advance, but RL training replays tasks (a GRPO group
plays one task several times, and tasks come back every epoch), so a task's earlier rollouts predict its
next ones.  :class:`RolloutLengths` keeps that prediction::

    lengths = RolloutLengths(path=run_dir / "lengths.json")   # kept across calls; reloaded by a resumed run
    runner = TaskRunner(policy, chat, lengths=lengths)         # learns from every finished trajectory

A user's own estimate can stand in: ``RolloutLengths(estimate={"task-a": 120.0})`` or a callable of the
task key; it is asked first, and what was observed fills in where it returns None.

Where rollouts are not started by one loop that sees them all (verl calls its agent loop once per trajectory,
all of a batch at once), :class:`StartGate` gives the same order: every rollout that arrives within one turn of
the event loop waits, and they are let in longest-predicted first (at most ``limit`` at a time, when given).

A saved estimate (:meth:`RolloutLengths.save`) is JSON, written atomically (a temporary file renamed), and merged
with what is in the file under a lock, so several processes (verl's agent-loop workers) can keep one file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..limits import check_int
from ..resources.priority import DEFAULT_AGE_BOUND_S, serve_order
from ..utils.files import atomic_path

__all__ = ["RolloutLengths", "StartGate", "longest_first", "as_lengths", "length_key"]

log = logging.getLogger(__name__)

Estimate = Callable[[str], "float | None"] | Mapping[str, float]


class RolloutLengths:
    """Per task key, a running estimate of a rollout's wall time (seconds) and turns.

    Args:
        estimate: the user's own prediction of a task key's seconds: a mapping or a callable returning a
            number or None; consulted before what was observed.
        path: a JSON file to load at construction (when it exists) and to write by :meth:`save`.
        alpha: weight of a new observation in the running mean (exponential moving average; the first
            observation of a key is taken as is), in (0, 1]: the policy changes during training, so recent
            rollouts count more.

    Raises:
        ConfigError: ``alpha`` out of range, or a ``path`` that holds something else than a saved estimate.
    """

    VERSION = 1

    def __init__(self, estimate: Estimate | None = None, *, path: str | Path | None = None,
                 alpha: float = 0.5) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"alpha={alpha!r} must lie in (0, 1]")
        if estimate is not None and not callable(estimate) and not isinstance(estimate, Mapping):
            raise ConfigError(f"estimate must be a mapping or a callable of the task key, got {type(estimate).__name__}")
        self.estimate = estimate
        self.alpha = alpha
        self.path = Path(path) if path is not None else None
        self._seen: dict[str, dict[str, float]] = {}  # key -> {"seconds", "turns", "n"}
        self._dirty: set[str] = set()  # keys observed since the last load or save (they win a merge)
        if self.path is not None and self.path.exists():
            self._seen = _read(self.path)

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, key: str, seconds: float, turns: int | float | None = None) -> None:
        """Record a finished rollout of ``key`` that took ``seconds`` (wall) and ``turns`` turns."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._dirty.add(key)
        old = self._seen.get(key)
        if old is None:
            self._seen[key] = {"seconds": float(seconds), "turns": float(turns or 0), "n": 1}
            return
        a = self.alpha
        old["seconds"] += a * (float(seconds) - old["seconds"])
        if turns is not None:
            old["turns"] += a * (float(turns) - old["turns"])
        old["n"] += 1

    def observe_trajectory(self, key: str, traj: Any) -> None:
        """Record a finished :class:`~agentfly_gym.rollout.trajectory.Trajectory` of ``key`` (its
        ``timings["wall"]`` and number of turns); a trajectory that failed (``error`` set) is not a length."""
        if getattr(traj, "error", None):
            return
        wall = (getattr(traj, "timings", None) or {}).get("wall")
        if wall is not None:
            self.observe(key, wall, len(traj.turns))

    def predict(self, key: str) -> float | None:
        """Predicted seconds of a rollout of ``key``: the user's estimate, else the running mean, else None."""
        if self.estimate is not None:
            got = self.estimate(key) if callable(self.estimate) else self.estimate.get(key)
            if got is not None:
                return float(got)
        seen = self._seen.get(key)
        return seen["seconds"] if seen is not None else None

    def priority(self, key: str | None) -> float | None:
        """The acquisition priority of a rollout of ``key`` (None: no key): :meth:`predict`, else the mean
        of the observed seconds of every key (so a task never seen is not served after every known one),
        else None (nothing known: FIFO)."""
        got = self.predict(key) if key is not None else None
        if got is not None or key is None or not self._seen:
            return got
        return sum(v["seconds"] for v in self._seen.values()) / len(self._seen)

    def predict_turns(self, key: str) -> float | None:
        """Running mean of the turns of ``key``'s rollouts (None: none seen)."""
        seen = self._seen.get(key)
        return seen["turns"] if seen is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.VERSION, "alpha": self.alpha, "tasks": {k: dict(v) for k, v in self._seen.items()}}

    def load(self, path: str | Path) -> RolloutLengths:
        """Take in what the saved estimate at ``path`` holds (when it exists), e.g. a resumed run's; what this
        object observed since its last load or save wins.  Returns self.

        Raises:
            ConfigError: ``path`` holds something else than a saved estimate (nothing is changed then).
        """
        path = Path(path)
        if path.exists():
            self._seen = {**_read(path), **{k: self._seen[k] for k in self._dirty}}
        return self

    def save(self, path: str | Path | None = None) -> Path | None:
        """Write the observed estimates as JSON to ``path`` (default: the constructor's; None: nothing).

        The file is written atomically (a temporary file beside it, flushed, renamed) under an exclusive lock
        of its folder, merged with what it holds: keys observed here since the last load or save take this
        object's values, the others keep the file's (written there by another process), and this object
        takes the merged view.  A file that cannot be read back is replaced, with a warning.

        Raises:
            OSError: the file cannot be written (the previous file is untouched).
        """
        path = Path(path) if path is not None else self.path
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.parent):
            merged = dict(self._seen)
            if path.exists():
                try:
                    theirs = _read(path)
                except ConfigError as e:
                    log.warning("%s; replacing it with this run's estimate", e)
                else:
                    merged = {**theirs, **{k: v for k, v in self._seen.items() if k in self._dirty or k not in theirs}}
            data = {"version": self.VERSION, "alpha": self.alpha, "tasks": {k: dict(v) for k, v in merged.items()}}
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, sort_keys=True)
        self._seen, self._dirty = merged, set()
        return path

    def order(self, keys: Sequence[str | None]) -> tuple[list[int], list[float | None]]:
        """The start order of rollouts of ``keys`` (see :func:`longest_first`) and each one's priority: its
        predicted seconds, the mean of the known ones where unknown or without a key (None: a task drawn at
        random; all None when nothing is known: FIFO)."""
        preds = [None if k is None else self.predict(k) for k in keys]
        known = [p for p in preds if p is not None]
        mean = sum(known) / len(known) if known else None
        return longest_first(preds), [mean if p is None else p for p in preds]


def _read(path: Path) -> dict[str, dict[str, float]]:
    """The per-key estimates a saved file holds.

    Raises:
        ConfigError: the file is not a saved :class:`RolloutLengths` of this version (not JSON, another
            format, a number that is not finite).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != RolloutLengths.VERSION:
            raise ValueError(f"version {data.get('version') if isinstance(data, dict) else None!r}, "
                             f"expected {RolloutLengths.VERSION}")
        seen = {str(k): {"seconds": float(v["seconds"]), "turns": float(v["turns"]), "n": int(v["n"])}
                for k, v in data["tasks"].items()}
        if not all(0 <= v["seconds"] < math.inf and 0 <= v["turns"] < math.inf and v["n"] >= 0
                   for v in seen.values()):
            raise ValueError("a number that is negative or not finite")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # nested too deep: corrupt
        raise ConfigError(f"{path} is not a saved RolloutLengths ({type(e).__name__}: {e}); remove or move "
                          f"it, or keep the estimate elsewhere") from None
    return seen


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` of ``folder`` (its directory descriptor) for the block: one writer of a saved
    estimate at a time, across processes (no lock file is left behind)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def length_key(env_id: str, task_id: Any = None, seed: int | None = None) -> str | None:
    """The key a rollout's length is predicted by: ``"ENV_ID/TASK_ID"``, ``"ENV_ID/seed=SEED"`` when there is
    no task id, None when there is neither (a task drawn at random: nothing to predict from)."""
    if task_id not in (None, ""):
        return f"{env_id}/{task_id}"
    return f"{env_id}/seed={seed}" if seed is not None else None


class StartGate:
    """Lets concurrently started rollouts begin longest-predicted first.

    A rollout waits in :meth:`admit`; the rollouts waiting are let in on the event loop's next turn (so every
    rollout started in one turn, as verl starts a batch, is ranked together), larger ``priority`` first (ties
    and None in arrival order; one that has waited ``age_bound`` seconds goes first), and at most ``limit`` of
    them are inside at once (None: no limit: the order of the start is all it gives; the priority then also
    ranks the rollouts' waiting acquisitions, see :mod:`agentfly_gym.resources.priority`).  It belongs to the
    event loop of its first use.

    Args:
        limit: most rollouts inside at once (None: no limit).
        age_bound: seconds after which a waiting rollout is let in in arrival order before prioritised ones.
        on_idle: called (no arguments) when the last rollout inside leaves and none waits: the end of a batch.

    Raises:
        ConfigError: ``limit`` not None nor an integer >= 1.
    """

    def __init__(self, limit: int | None = None, *, age_bound: float | None = DEFAULT_AGE_BOUND_S,
                 on_idle: Callable[[], Any] | None = None) -> None:
        check_int("limit", limit, optional=True)
        self.limit, self.age_bound, self.on_idle = limit, age_bound, on_idle
        self.inside = 0
        self._waiters: list[tuple[asyncio.Future, float | None, float]] = []
        self._scheduled = False

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def admit(self, priority: float | None = None) -> AsyncIterator[None]:
        """``async with gate.admit(p):`` waits for this rollout's turn, and holds its place while inside.

        Raises:
            asyncio.CancelledError: cancelled while waiting (its place, if granted, passes on).
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        entry = (fut, None if priority is None else float(priority), time.monotonic())
        self._waiters.append(entry)
        self._schedule(loop)
        try:
            await fut
        except asyncio.CancelledError:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif fut.done() and not fut.cancelled():  # let in just as it was cancelled: pass its place on
                self._leave(loop)
            raise
        try:
            yield
        finally:
            self._leave(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._waiters and (self.limit is None or self.inside < self.limit):
            entry = serve_order(self._waiters, lambda e: (e[1], e[2]), now=time.monotonic(),
                                age_bound=self.age_bound)[0]
            self._waiters.remove(entry)
            self.inside += 1
            entry[0].set_result(None)  # resumed in this order: the loop runs callbacks first in, first out

    def _leave(self, loop: asyncio.AbstractEventLoop) -> None:
        self.inside -= 1
        if self._waiters:
            self._schedule(loop)
        elif self.inside == 0 and self.on_idle is not None:
            try:
                self.on_idle()
            except Exception:  # noqa: BLE001 - a failed save must not fail the rollout that left last
                log.warning("the start gate's on_idle callback failed", exc_info=True)


def longest_first(predictions: Sequence[float | None]) -> list[int]:
    """Indices of ``predictions`` longest first; the order is stable (ties keep arrival order), and a
    rollout without a prediction counts as the mean of the known ones (all unknown: arrival order)."""
    known = [p for p in predictions if p is not None]
    if not known:
        return list(range(len(predictions)))
    mean = sum(known) / len(known)
    filled = [mean if p is None else p for p in predictions]
    return sorted(range(len(filled)), key=lambda i: -filled[i])


def as_lengths(value: Any) -> RolloutLengths | None:
    """A :class:`RolloutLengths` from itself, a mapping or callable estimate, a JSON path, or None (None).

    Raises:
        ConfigError: anything else.
    """
    if value is None or isinstance(value, RolloutLengths):
        return value
    if isinstance(value, (str, Path)):
        return RolloutLengths(path=value)
    if callable(value) or isinstance(value, Mapping):
        return RolloutLengths(value)
    raise ConfigError(f"lengths must be a RolloutLengths, an estimate (mapping or callable) or a JSON path, "
                      f"got {type(value).__name__}")
