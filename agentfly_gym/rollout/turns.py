"""Recording an episode into a :class:`~agentfly_gym.rollout.trajectory.Trajectory`, shared by chain
mode (:mod:`.chain`), step mode (:mod:`.step`) and multi-agent games (:mod:`.multiagent`): one acted
turn (parse the action, step the env, append a :class:`~agentfly_gym.rollout.trajectory.Turn`) and
the end of an episode (flags, status, timings).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..envs.base import AgentFlyEnv
from .trajectory import Trajectory, Turn

__all__ = ["info_summary", "append_reply", "act_and_record", "finish_trajectory", "fail_trajectory"]

log = logging.getLogger(__name__)

_INFO_KEYS = ("task_id", "step", "score", "won", "error")


def info_summary(info: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able standard keys of an env info dict."""
    return {k: info[k] for k in _INFO_KEYS if k in info}


def append_reply(traj: Trajectory, chat: Any, sampled: list[int], logprobs: list[float] | None) -> None:
    """Chain mode: append one reply to ``traj``'s response: the sampled ids verbatim (mask 1, their
    logprobs, NaN when the policy has none), then the ids closing the assistant message that the policy
    did not sample (``chat.close_assistant_ids``; mask 0, logprob 0.0).

    Raises:
        ValueError: ``logprobs`` is not None and its length differs from ``sampled``'s.
    """
    traj.extend(sampled, 1, logprobs)
    traj.extend(chat.close_assistant_ids(sampled), 0)


async def act_and_record(env: AgentFlyEnv, traj: Trajectory, reply: str, sampled: list[int], finish: str,
                         gen_s: float) -> tuple[str, str, float, bool, bool, dict[str, Any]]:
    """Parse the action in ``reply``, step ``env`` with it, and record the turn in ``traj`` (shared by
    chain and step mode): the reward is added to the return, a :class:`Turn` with the timings is
    appended, and a handled fault is kept as ``traj.error`` (a failed reward function, ``info["reward_error"]``,
    also as ``traj.reward_error``).

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
    if info.get("reward_error"):  # the env's reward function gave no score (e.g. a make_tool_env reward that raised)
        traj.reward_error = str(info["reward_error"])
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
    traj.reply_truncated = bool(traj.turns) and traj.turns[-1].finish_reason == "length"
    traj.timings = {"wall": time.monotonic() - t_start, "generate": sum(t.generate_s for t in traj.turns),
                    "env": sum(t.env_s for t in traj.turns), "reset": reset_s}
    return traj


def fail_trajectory(traj: Trajectory, error: Exception, *, info: dict[str, Any], t_start: float,
                    reset_s: float) -> Trajectory:
    """End ``traj`` after ``error`` was raised mid-episode (a policy or generation error, an env that
    raised instead of reporting ``info["error"]``), keeping what was played: ``error`` =
    ``"<ExceptionType>: <message>"``, truncated, ``status`` ``"error"`` (see :func:`finish_trajectory`);
    logged at WARNING."""
    log.warning("trajectory %s (%s) failed after %d turns: %s: %s", traj.trajectory_id, traj.env_id,
                len(traj.turns), type(error).__name__, error)
    traj.error = f"{type(error).__name__}: {error}"
    return finish_trajectory(traj, terminated=False, truncated=True, info=info, t_start=t_start, reset_s=reset_s)
