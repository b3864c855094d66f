"""The results of an evaluation: per task and per environment, pass@1..k, success and mean reward with 95%
bootstrap intervals, and the infrastructure errors counted apart.

Definitions (``results.json`` holds them as written here):

* A sample is one played trajectory of a task.  A sample whose ``status`` is ``"error"`` (a dead container, an
  endpoint's 5xx after retries, a reward function that gave no score) is an *error*: it is counted in
  ``errors`` and left out of every score, never scored as reward 0.  The other samples are *scored*: n per task.
* ``success`` is the trajectory's ``success`` flag (the env's ``won``); c per task.
* Per task: ``pass@j`` (j = 1..min(n, k)) is :func:`~agentfly_gym.eval.stats.pass_at_k` ``(n, c, j)``;
  ``success`` and ``mean_reward`` are means over its scored samples, with bootstrap intervals over the samples.
* Per env (and ``overall``, over every env's tasks): each task weighs the same.  ``pass@j`` is the mean of the
  per-task values over the tasks with n >= j (``tasks_scored@j`` says how many); ``success`` and
  ``mean_reward`` are means of the per-task means, with bootstrap intervals that resample tasks (the samples
  of one task are not independent draws of the env's score).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .stats import DEFAULT_CONFIDENCE, bootstrap_ci, pass_at_k

__all__ = ["group_result", "is_error", "summarize_eval", "task_result"]


def is_error(traj: Any) -> bool:
    """Whether a trajectory is an infrastructure error (its ``status`` is ``"error"`` or its reward failed)."""
    from ..rollout.trajectory import episode_status

    return episode_status(traj) == "error" or bool(getattr(traj, "reward_error", None))


def _ci(values: Sequence[float], seed: int) -> list[float] | None:
    if not values:
        return None
    lo, hi = bootstrap_ci(values, seed=seed)
    return [lo, hi]


def task_result(samples: Sequence[Any], k: int, *, seed: int = 0) -> dict[str, Any]:
    """One task's result from its samples (trajectories; see the module docstring).

    Returns:
        ``{"samples", "n", "c", "errors", "pass@1".."pass@min(n,k)", "success", "success_ci", "mean_reward",
        "mean_reward_ci"}`` (the means and intervals None when n is 0).
    """
    scored = [t for t in samples if not is_error(t)]
    n, c = len(scored), sum(1 for t in scored if t.success)
    out: dict[str, Any] = {"samples": len(samples), "n": n, "c": c, "errors": len(samples) - n}
    for j in range(1, min(n, k) + 1):
        out[f"pass@{j}"] = pass_at_k(n, c, j)
    wins = [1.0 if t.success else 0.0 for t in scored]
    rewards = [float(t.reward) for t in scored]
    out["success"] = statistics.fmean(wins) if wins else None
    out["success_ci"] = _ci(wins, seed)
    out["mean_reward"] = statistics.fmean(rewards) if rewards else None
    out["mean_reward_ci"] = _ci(rewards, seed + 1)
    return out


def group_result(tasks: Mapping[str, Mapping[str, Any]], k: int, *, seed: int = 0) -> dict[str, Any]:
    """A group's (an env's, or all envs') result from its tasks' results (see the module docstring)."""
    scored = [r for r in tasks.values() if r["n"] > 0]
    out: dict[str, Any] = {"tasks": len(tasks), "tasks_scored": len(scored),
                           "samples": sum(r["samples"] for r in tasks.values()),
                           "scored_samples": sum(r["n"] for r in tasks.values()),
                           "errors": sum(r["errors"] for r in tasks.values())}
    for j in range(1, k + 1):
        vals = [r[f"pass@{j}"] for r in tasks.values() if f"pass@{j}" in r]
        out[f"pass@{j}"] = statistics.fmean(vals) if vals else None
        out[f"tasks_scored@{j}"] = len(vals)
    vals = [r[f"pass@{k}"] for r in tasks.values() if f"pass@{k}" in r]
    out[f"pass@{k}_ci"] = _ci(vals, seed + 2)
    for key, s in (("success", seed), ("mean_reward", seed + 1)):
        vals = [r[key] for r in scored]
        out[key] = statistics.fmean(vals) if vals else None
        out[f"{key}_ci"] = _ci(vals, s)
    return out


def summarize_eval(samples: Mapping[str, Mapping[str, Sequence[Any]]], k: int, *, seed: int = 0,
                   meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole ``results.json`` dict.

    Args:
        samples: per env id, per task label, its trajectories.
        k: samples per task asked for.
        seed: the bootstrap's seed.
        meta: extra top-level keys (model, split, settings).

    Returns:
        ``{**meta, "k", "confidence", "pass@1".."pass@k" (overall), "overall": {...}, "envs": {env_id: {...,
        "per_task": {task: {...}}}}}``.
    """
    envs: dict[str, Any] = {}
    every: dict[str, Any] = {}
    for env_id, by_task in samples.items():
        per_task = {task: task_result(trajs, k, seed=seed) for task, trajs in by_task.items()}
        envs[env_id] = {**group_result(per_task, k, seed=seed), "per_task": per_task}
        every.update({f"{env_id}\t{t}": r for t, r in per_task.items()})
    overall = group_result(every, k, seed=seed)
    out: dict[str, Any] = dict(meta or {})
    out.update({"k": k, "confidence": DEFAULT_CONFIDENCE})
    out.update({f"pass@{j}": overall[f"pass@{j}"] for j in range(1, k + 1)})
    out["overall"] = overall
    out["envs"] = envs
    return _finite(out)


def _finite(value: Any) -> Any:
    """NaN -> None, recursively (results.json is strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
