"""Gateway rollouts as trainer rows: each segment a chain-mode :class:`~agentfly_gym.rollout.trajectory.Trajectory`.

A segment has the layout of the env's own chain mode (prompt ids, then sampled ids with mask 1 and their logprobs,
the context between calls with mask 0 and logprob 0.0), so the trainers' existing readers take it unchanged:
:meth:`AgentFlyRollout.to_trl <agentfly_gym.bridges.trl.AgentFlyRollout.to_trl>` (TRL) and the verl plugin's
:func:`agentfly_gym_verl.gateway.gateway_outputs`.

``join="rows"``: one row per segment, each carrying the rollout's reward (a rewritten history gives several rows of
one rollout, as step mode gives several rows of one episode; they share ``trajectory_id`` prefix and
``group_id``).  ``join="chain"``: one row, the single chain of a rollout whose calls all joined exactly; a rollout
with several segments is refused (:class:`~agentfly_gym.errors.ConfigError`), since segments that did not join
cannot be one sequence without training on ids the policy never saw in that order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..rollout.trajectory import Trajectory

__all__ = ["JOINS", "segment_rows"]

JOINS = ("rows", "chain")


def _segment(seg: Any, key: str) -> list:
    return list(seg[key] if isinstance(seg, dict) else getattr(seg, key))


def segment_rows(rollouts: Sequence[Any], *, join: str = "rows", env_id: str = "gateway") -> list[Trajectory]:
    """Chain-mode trajectories of gateway rollouts (see the module docstring).

    Args:
        rollouts: :class:`~.agents.AgentRollout` objects (or their :meth:`~.agents.AgentRollout.to_json` dicts).
        join: ``"rows"`` or ``"chain"``.
        env_id: the ``env_id`` the rows carry.

    Returns:
        Rows in rollout order (a rollout's segments in the order they started).  A rollout with no segment (its
        agent failed before its first call) gives one row with no response (the TRL bridge and the verl plugin
        turn it into a one-token row that trains nothing), its ``error`` and ``status`` kept.

    Raises:
        ConfigError: an unknown ``join``; with ``"chain"``, a rollout of several segments.
    """
    if join not in JOINS:
        raise ConfigError(f"join={join!r} is not one of {JOINS}")
    out = []
    for r in rollouts:
        get = r.get if isinstance(r, dict) else (lambda k, default=None, _r=r: getattr(_r, k, default))
        segments = list(get("segments", []) or [])
        if join == "chain" and len(segments) > 1:
            raise ConfigError(f"rollout {get('trajectory_id')} has {len(segments)} segments (its agent rewrote its "
                              "history), not one chain; use join='rows'")
        tid, status, error = str(get("trajectory_id", "")), str(get("status", "") or ""), get("error")
        common: dict[str, Any] = {
            "group_id": str(get("group_id", "")), "env_id": env_id, "task_id": str(get("task_id", "")), "seed": None,
            "mode": "chain", "reward": float(get("reward", 0.0)), "error": error,
            "status": status if status in ("complete", "truncated", "error") else "",
            "terminated": status == "complete", "truncated": status == "truncated",
            "reward_error": get("reward_error")}
        if not segments:
            out.append(Trajectory(trajectory_id=tid, prompt_ids=[], **common))
            continue
        for k, seg in enumerate(segments):
            lps = [math.nan if x is None else float(x) for x in _segment(seg, "logprobs")]
            mask = _segment(seg, "response_mask")
            traj = Trajectory(trajectory_id=tid if len(segments) == 1 else f"{tid}/{k}",
                              prompt_ids=_segment(seg, "prompt_ids"), response_ids=_segment(seg, "response_ids"),
                              response_mask=mask, response_logprobs=lps, **common)
            out.append(traj)
    return out
