"""Gateway rollouts (:mod:`agentfly_gym.gateway`) as verl ``AgentLoopOutput`` rows.

Each segment of a rollout (or its one chain, ``join="chain"``) becomes one output with the conventions of the
plugin's chain mode (:mod:`.agent_loop`): ``prompt_ids`` the segment's prompt (its newest ``prompt_length`` ids;
``prompt_truncated`` says when older ones were left out), ``response_ids`` / ``response_mask`` /
``response_logprobs`` the segment's response cut to ``response_length`` and ending on a sampled id (verl puts the
reward on the last response token), ``reward_score`` the rollout's reward on every row, ``extra_fields`` with the
keys of :data:`.agent_loop.EXTRA_FIELD_DEFAULTS` (``mode`` ``"gateway"``, ``step`` the segment's index).  A
rollout without any segment (its agent failed before its first call) is one row of the end-of-turn id with mask
0: it trains nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from agentfly_gym.gateway.rows import segment_rows

from .agent_loop import _extra_fields, end_on_sampled, response_logprobs

__all__ = ["gateway_outputs"]


def gateway_outputs(rollouts: Sequence[Any], *, eot_token_id: int, response_length: int, prompt_length: int,
                    join: str = "rows", want_logprobs: bool = True) -> list[AgentLoopOutput]:
    """verl rows of gateway rollouts (see the module docstring).

    Args:
        rollouts: :class:`~agentfly_gym.gateway.AgentRollout` objects or their JSON dicts.
        eot_token_id: the chat template's end-of-turn id (``ChatTokenizer.eot_token_id``).
        response_length, prompt_length: verl's ``rollout.response_length`` / ``rollout.prompt_length`` (tokens).
        join: ``"rows"`` (one row per segment) or ``"chain"`` (one per rollout; several segments refused).
        want_logprobs: fill ``response_logprobs`` (0.0 at mask-0 ids and where the policy reported none).

    Raises:
        ConfigError: see :func:`~agentfly_gym.gateway.rows.segment_rows`.
    """
    outs = []
    for traj in segment_rows(rollouts, join=join):
        prompt = list(traj.prompt_ids[-prompt_length:]) or [int(eot_token_id)]
        ids = list(traj.response_ids[:response_length])
        mask = list(traj.response_mask[:response_length])
        lps = list(traj.response_logprobs[:response_length])
        end_on_sampled(ids, mask, lps, eot_token_id)
        step = int(traj.trajectory_id.rpartition("/")[2]) if "/" in traj.trajectory_id else 0
        status = traj.status or ("error" if traj.error else "complete")
        if sum(traj.response_mask[response_length:]) and status in ("complete", "truncated"):
            status = "token_budget"
        extra = _extra_fields(trajectory_id=traj.trajectory_id, group_id=traj.group_id, env_id=traj.env_id,
                              task_id=traj.task_id, mode="gateway", step=step, env_return=float(traj.reward),
                              step_reward=float(traj.reward), success=traj.reward > 0, error=traj.error or "",
                              terminated=traj.terminated, truncated=traj.truncated, status=status,
                              prompt_truncated=len(traj.prompt_ids) > prompt_length,
                              prompt_cut=max(0, len(traj.prompt_ids) - prompt_length),
                              response_truncated=len(traj.response_ids) > response_length,
                              reward_extra_info={"acc": 1.0 if traj.reward > 0 else 0.0})
        turns = 0
        prev = 0
        for m in traj.response_mask:
            turns += m and not prev
            prev = m
        outs.append(AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=mask,
                                    response_logprobs=response_logprobs(lps, mask, want_logprobs),
                                    reward_score=float(traj.reward), num_turns=max(1, 2 * turns),
                                    metrics=AgentLoopMetrics(), extra_fields=extra))
    return outs
