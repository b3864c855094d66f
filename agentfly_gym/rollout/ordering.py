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
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["RolloutLengths", "longest_first", "as_lengths"]

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
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, key: str, seconds: float, turns: int | float | None = None) -> None:
        """Record a finished rollout of ``key`` that took ``seconds`` (wall) and ``turns`` turns."""
        if not math.isfinite(seconds) or seconds < 0:
            return
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

    def predict_turns(self, key: str) -> float | None:
        """Running mean of the turns of ``key``'s rollouts (None: none seen)."""
        seen = self._seen.get(key)
        return seen["turns"] if seen is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.VERSION, "alpha": self.alpha, "tasks": {k: dict(v) for k, v in self._seen.items()}}

    def save(self, path: str | Path | None = None) -> Path | None:
        """Write the observed estimates as JSON to ``path`` (default: the constructor's; None: nothing),
        atomically (a temporary file renamed)."""
        path = Path(path) if path is not None else self.path
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".lengths-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.as_dict(), f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            tasks = data["tasks"]
            self._seen = {str(k): {"seconds": float(v["seconds"]), "turns": float(v["turns"]), "n": int(v["n"])}
                          for k, v in tasks.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path} is not a saved RolloutLengths ({type(e).__name__}: {e})") from None

    def order(self, keys: Sequence[str]) -> tuple[list[int], list[float | None]]:
        """The start order of rollouts of ``keys`` (see :func:`longest_first`) and each one's priority: its
        predicted seconds, the mean of the known ones where unknown (all None when nothing is known: FIFO)."""
        preds = [self.predict(k) for k in keys]
        known = [p for p in preds if p is not None]
        mean = sum(known) / len(known) if known else None
        return longest_first(preds), [mean if p is None else p for p in preds]


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
