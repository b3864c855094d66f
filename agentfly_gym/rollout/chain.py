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
from .trajectory import Trajectory, Turn

__all__ = ["run_chain_episode", "info_summary", "act_and_record", "finish_trajectory"]

_INFO_KEYS = ("task_id", "step", "score", "won", "error")


def info_summary(info: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able standard keys of an env info dict."""
    return {k: info[k] for k in _INFO_KEYS if k in info}


async def act_and_record(env: AgentFlyEnv, traj: Trajectory, reply: str, sampled: list[int], finish: str,
                         gen_s: float) -> tuple[str, str, float, bool, bool, dict[str, Any]]:
    """Parse the action in ``reply``, step ``env`` with it, and record the turn in ``traj`` (shared by
    chain and step mode): the reward is added to the return, a :class:`Turn` with the timings is
    appended, and a handled fault is kept as ``traj.error``.

    Returns:
        ``(action, observation, reward, terminated, truncated, info)``.
    """
    action = env.agent_prompt.parse_action(reply)
    t0 = time.monotonic()
    obs, reward, terminated, truncated, info = await env.astep(action)
    env_s = time.monotonic() - t0
    traj.reward += reward
    traj.turns.append(Turn(reply=reply, action=action, observation=obs, reward=reward, terminated=terminated,
                           truncated=truncated, sampled_tokens=len(sampled), finish_reason=finish,
                           generate_s=gen_s, env_s=env_s, info=info_summary(info)))
    if info.get("error"):
        traj.error = str(info["error"])
    return action, obs, reward, terminated, truncated, info


def finish_trajectory(traj: Trajectory, *, terminated: bool, truncated: bool, info: dict[str, Any], t_start: float,
                      reset_s: float, token_budget: bool = False) -> Trajectory:
    """Set how the episode ended, its success, its ``status`` and its timings (seconds; summed over
    the turns).

    ``status`` (see :data:`~agentfly_gym.rollout.trajectory.STATUSES`): ``error`` if a fault was
    recorded, ``interrupted`` if the last generation was aborted by the server, ``token_budget``
    if ``token_budget`` (the episode was stopped by a token limit), else ``complete`` when the env
    terminated it and ``truncated`` otherwise.
    """
    traj.terminated, traj.truncated = terminated, truncated
    if traj.error:
        traj.status = "error"
    elif traj.turns and traj.turns[-1].finish_reason == "aborted":
        traj.status = "interrupted"
    elif token_budget and not terminated:
        traj.status = "token_budget"
    else:
        traj.status = "complete" if terminated else "truncated"
    traj.success = bool(info.get("won", False))
    traj.timings = {"wall": time.monotonic() - t_start, "generate": sum(t.generate_s for t in traj.turns),
                    "env": sum(t.env_s for t in traj.turns), "reset": reset_s}
    return traj


async def run_chain_episode(env: AgentFlyEnv, policy: TextPolicy | ActionPolicy, chat, *, env_id: str = "",
                            sampling: SamplingParams | None = None, max_turns: int = 10,
                            max_context_tokens: int | None = None, max_response_tokens: int | None = None,
                            seed: int | None = None,
                            options: dict[str, Any] | None = None, trajectory_id: str | None = None,
                            group_id: str | None = None) -> Trajectory:
    """Play one episode of ``env`` with ``policy`` in chain mode and return its :class:`Trajectory`.

    Args:
        env: an unwrapped :class:`AgentFlyEnv` (its episode scope is the rollout scope).
        policy: a :class:`TextPolicy` (token ids) or an :class:`ActionPolicy` (scripted actions,
            tokenized with ``chat.action_ids`` and stored with mask 1 and NaN logprobs).
        chat: a :class:`~agentfly_gym.rollout.chat.ChatTokenizer` for the policy's tokenizer.
        sampling: sampling parameters for a TextPolicy.
        max_turns: most policy turns; the episode is truncated after them.
        max_context_tokens: stop (truncated) when the next turn could exceed this many tokens
            (prompt + response + ``sampling.max_tokens``); None for no limit.
        max_response_tokens: stop (truncated) before a turn once the response holds at least this
            many tokens (a trainer's response budget; the policy caps each reply to what is left);
            None for no limit.
        seed, options: passed to ``env.areset``.

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
                          mode="chain", prompt_ids=list(chat.prompt_ids(messages)))
        terminated = truncated = budget = False
        for turn_idx in range(max_turns):
            if max_context_tokens is not None and \
                    len(traj.prompt_ids) + len(traj.response_ids) + sampling.max_tokens > max_context_tokens:
                truncated = budget = True
                break
            if max_response_tokens is not None and len(traj.response_ids) >= max_response_tokens:
                truncated = budget = True
                break
            t0 = time.monotonic()
            sampled, logprobs, finish, reply = await take_turn(policy, chat, traj.prompt_ids + traj.response_ids,
                                                               sampling, obs, info, env)
            gen_s = time.monotonic() - t0
            traj.extend(sampled, 1, logprobs)
            traj.extend(chat.close_assistant_ids(sampled), 0)
            messages.append({"role": "assistant", "content": reply})
            _, obs, _, terminated, truncated, info = await act_and_record(env, traj, reply, sampled, finish, gen_s)
            if terminated or truncated:
                break
            if turn_idx == max_turns - 1:
                truncated = True
                break
            user = {"role": "user", "content": prompt.turn_message(obs)}
            messages.append(user)
            traj.extend(chat.append_ids([user]), 0)
        traj.messages = messages
        return finish_trajectory(traj, terminated=terminated, truncated=truncated, info=info, t_start=t_start,
                                 reset_s=reset_s, token_budget=budget)
    finally:
        await env.aend_episode()
