"""Chain rollout: one growing token sequence per trajectory, sampled ids kept verbatim.

The sequence is ``prompt_ids`` followed, for each turn, by

1. the ids the policy sampled, exactly as returned (mask 1, with logprobs);
2. the ids that close the assistant message if the policy did not sample the template's
   end-of-turn token (mask 0);
3. the ids of the next observation message and generation prompt, obtained by incremental
   chat-template rendering (:meth:`ChatTokenizer.append_ids`: the suffix of a render that
   starts right after a special token, so it tokenizes independently of the past) (mask 0).

Past turns are never decoded and re-encoded (AgentFly's re-tokenization drift, mission.md).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..envs.base import AgentFlyEnv
from .policies.base import ActionPolicy, SamplingParams, TextPolicy, check_policy, take_turn
from .trajectory import Trajectory
from .turns import act_and_record, append_reply, fail_trajectory, finish_trajectory

__all__ = ["run_chain_episode", "budget_reached"]


def budget_reached(traj: Trajectory, sampling: SamplingParams, max_context_tokens: int | None,
                   max_response_tokens: int | None) -> bool:
    """Whether a chain may not take another turn: its next turn could exceed ``max_context_tokens``
    (prompt + response + ``sampling.max_tokens`` tokens), or its response already holds
    ``max_response_tokens`` tokens (None: no such limit)."""
    if max_context_tokens is not None and \
            len(traj.prompt_ids) + len(traj.response_ids) + sampling.max_tokens > max_context_tokens:
        return True
    return max_response_tokens is not None and len(traj.response_ids) >= max_response_tokens


def _cut_to_cap(traj: Trajectory, max_context_tokens: int | None) -> int:
    """Drop the mask-0 tokens at the end of ``traj``'s response that take the chain past
    ``max_context_tokens`` (never a sampled one, nor the prompt), count them in ``traj.context_cut``
    and return how many were dropped."""
    if max_context_tokens is None:
        return 0
    over = len(traj.prompt_ids) + len(traj.response_ids) - max_context_tokens
    n = 0
    while n < over and n < len(traj.response_mask) and traj.response_mask[-1 - n] == 0:
        n += 1
    if n:
        del traj.response_ids[-n:], traj.response_mask[-n:], traj.response_logprobs[-n:]
        traj.context_cut += n
    return n


async def run_chain_episode(env: AgentFlyEnv, policy: TextPolicy | ActionPolicy, chat, *, env_id: str = "",
                            sampling: SamplingParams | None = None, max_turns: int = 10,
                            max_context_tokens: int | None = None, max_response_tokens: int | None = None,
                            seed: int | None = None,
                            options: dict[str, Any] | None = None, trajectory_id: str | None = None,
                            group_id: str | None = None, keep_on_error: bool = False) -> Trajectory:
    """Play one episode of ``env`` with ``policy`` in chain mode and return its :class:`Trajectory`.

    Args:
        env: an unwrapped :class:`AgentFlyEnv` (its episode scope is the rollout scope).
        policy: a :class:`TextPolicy` (token ids) or an :class:`ActionPolicy` (scripted actions,
            tokenized with ``chat.action_ids`` and stored with mask 1 and NaN logprobs).
        chat: a :class:`~agentfly_gym.rollout.chat.ChatTokenizer` for the policy's tokenizer.
        sampling: sampling parameters for a TextPolicy.
        max_turns: most policy turns; the episode is truncated after them.
        max_context_tokens: a hard cap on the chain (prompt + response tokens) once a turn is taken:
            stop (truncated, status ``token_budget``) when the next turn could exceed it (prompt + response
            + ``sampling.max_tokens``), and cut what the chain appends without sampling (an observation
            message, the end-of-turn id closing a reply) at the cap, counting the tokens left out in
            ``context_cut``.  A first prompt already longer than the cap is kept whole and the episode ends
            before its first turn.  None for no limit.
        max_response_tokens: stop (truncated) before a turn once the response holds at least this
            many tokens (a trainer's response budget; the policy caps each reply to what is left);
            None for no limit.
        seed, options: passed to ``env.areset``.
        keep_on_error: an exception raised after the reset (by the policy, or by the env instead of
            reporting ``info["error"]``) ends the episode and the trajectory is returned with what was
            played, ``error`` set, truncated, ``status="error"`` (:func:`~.turns.fail_trajectory`);
            False: it propagates.

    The env's episode is always ended before returning, also on error or cancellation.
    """
    sampling = sampling or SamplingParams()
    t_start = time.monotonic()
    prompt = env.agent_prompt
    check_policy(policy)
    try:
        t0 = time.monotonic()
        obs, info = await env.areset(seed=seed, options=options)
        reset_s = time.monotonic() - t0
        messages = [{"role": "system", "content": prompt.system},
                    {"role": "user", "content": prompt.first_message(obs)}]
        traj = Trajectory(trajectory_id=trajectory_id or uuid.uuid4().hex[:12], group_id=group_id or "",
                          env_id=env_id or env.env_name, task_id=str(info.get("task_id", "")), seed=seed,
                          mode="chain", prompt_ids=list(chat.prompt_ids(messages, tools=prompt.tools) if prompt.tools
                                                      else chat.prompt_ids(messages)),
                          scope_id=getattr(env, "scope_id", ""))
        traj.messages = messages
        terminated = truncated = budget = False
        try:
            for turn_idx in range(max_turns):
                if budget_reached(traj, sampling, max_context_tokens, max_response_tokens):
                    truncated = budget = True
                    break
                t0 = time.monotonic()
                sampled, logprobs, finish, reply = await take_turn(policy, chat, traj.prompt_ids + traj.response_ids,
                                                                   sampling, obs, info, env)
                gen_s = time.monotonic() - t0
                append_reply(traj, chat, sampled, logprobs)
                _cut_to_cap(traj, max_context_tokens)
                messages.append({"role": "assistant", "content": reply})
                _, obs, _, terminated, truncated, info = await act_and_record(env, traj, reply, sampled, finish,
                                                                              gen_s)
                if terminated or truncated:
                    break
                if turn_idx == max_turns - 1:
                    truncated = True
                    break
                new = prompt.turn_messages(obs, info)  # a user message; a tool env's role "tool" messages
                messages.extend(new)
                traj.extend(chat.append_ids(new, tools=prompt.tools) if prompt.tools else chat.append_ids(new), 0)
                if _cut_to_cap(traj, max_context_tokens):
                    truncated = budget = True  # no room left for another turn
                    break
        except Exception as e:
            if not keep_on_error:
                raise
            return fail_trajectory(traj, e, info=info, t_start=t_start, reset_s=reset_s)
        return finish_trajectory(traj, terminated=terminated, truncated=truncated, info=info, t_start=t_start,
                                 reset_s=reset_s, token_budget=budget)
    finally:
        await env.aend_episode()
