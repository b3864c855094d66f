"""The summary of a run (``summary.json``): counts, success, rewards, turns, tokens, time and resource metrics."""

from __future__ import annotations

import logging
import statistics
from typing import Any

from ..resources.protocol import Manager
from .trajectory import Trajectory

__all__ = ["REWARD_ERROR_WARN_SHARE", "summarize"]

log = logging.getLogger(__name__)

#: Share of trajectories whose configured reward failed (``reward_error``) above which the summary warns.
REWARD_ERROR_WARN_SHARE = 0.5


def summarize(trajectories: list[Trajectory], wall_s: float, manager: Manager | None = None) -> dict[str, Any]:
    """Counts, success, mean reward, turns, tokens, wall time, trajectories/s, and per-pool resource metrics.

    Also ``reward_errors`` (trajectories whose reward function gave no score: ``reward_error`` set; a configured
    reward such as an LLM judge, or a tool env's ``reward``),
    ``reply_truncated`` (trajectories whose last reply was cut at ``max_tokens``) and ``warnings`` (a list
    of sentences; one when more than :data:`REWARD_ERROR_WARN_SHARE` of the trajectories have a
    ``reward_error``: their rewards are defaults, not judgements; it is logged at WARNING too).
    """
    n = len(trajectories)
    per_env: dict[str, dict[str, Any]] = {}
    for env_id in sorted({t.env_id for t in trajectories}):
        ts = [t for t in trajectories if t.env_id == env_id]
        per_env[env_id] = {"trajectories": len(ts), "success_rate": sum(t.success for t in ts) / len(ts),
                           "mean_reward": statistics.fmean(t.reward for t in ts),
                           "mean_turns": statistics.fmean(t.num_turns for t in ts),
                           "errors": sum(1 for t in ts if t.error)}
    pools = manager.metrics() if manager is not None else {}
    summary = {
        "trajectories": n,
        "success_rate": (sum(t.success for t in trajectories) / n) if n else 0.0,
        "mean_reward": statistics.fmean(t.reward for t in trajectories) if n else 0.0,
        "mean_turns": statistics.fmean(t.num_turns for t in trajectories) if n else 0.0,
        "sampled_tokens": sum(t.num_sampled_tokens for t in trajectories),
        "total_tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories),
        "errors": sum(1 for t in trajectories if t.error),
        "reward_errors": sum(1 for t in trajectories if getattr(t, "reward_error", None)),
        "reply_truncated": sum(1 for t in trajectories if getattr(t, "reply_truncated", False)),
        "warnings": [],
        "wall_s": wall_s,
        "trajectories_per_s": n / wall_s if wall_s > 0 else 0.0,
        "generate_s": sum(t.timings.get("generate", 0.0) for t in trajectories),
        "env_s": sum(t.timings.get("env", 0.0) for t in trajectories),
        "per_env": per_env,
        "resources": {
            # .get: a Ray pool whose actor could not be asked (dead node) reports what it last saw
            "started": sum(p.get("started", 0) for p in pools.values()),
            "reused": sum(p.get("reused", 0) for p in pools.values()),
            "max_in_use": sum(p.get("max_in_use", 0) for p in pools.values()),
            "mean_acquire_wait_s": (sum(p.get("acquire_wait_total", 0.0) for p in pools.values())
                                    / max(1, sum(p.get("acquired", 0) for p in pools.values()))),
            "pools": pools,
        },
    }
    if n and summary["reward_errors"] > REWARD_ERROR_WARN_SHARE * n:
        first = next(t.reward_error for t in trajectories if getattr(t, "reward_error", None))
        msg = (f"the reward function gave no score for {summary['reward_errors']} of {n} trajectories: their rewards "
               f"are defaults, not judgements (first: {first})")
        summary["warnings"].append(msg)
        log.warning("%s", msg)
    return summary
