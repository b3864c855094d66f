"""One episode, end to end: make the env, play it in chain or step mode, record the trajectory,
turn a failure into a trajectory, release the episode's resources.

:func:`play_episode` is what the runner (:func:`~agentfly_gym.rollout.runner.run_rollouts`,
``agentfly-gym rollout``) and the verl plugin (``agentfly_gym_verl.agent_loop``) call for every
trajectory.  The two turn loops live in :mod:`.chain` (one growing token sequence) and :mod:`.step`
(one fresh prompt and one training row per env step); the recording both share lives in
:mod:`.turns`.  Multi-agent games (:mod:`.multiagent`) have their own loop over a PettingZoo env but
record turns with the same helpers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import Any

import gymnasium

from ..errors import ConfigError
from ..limits import EpisodeLimits
from .chain import run_chain_episode
from .env_needs import policy_env_kwargs
from .policies.base import ActionPolicy, SamplingParams, TextPolicy, is_chat_policy
from .step import run_step_episode
from .trajectory import Trajectory

__all__ = ["MODES", "play_episode"]

log = logging.getLogger(__name__)

#: The rollout modes: one sequence per trajectory, or one row per env step.
MODES = ("chain", "step")


async def play_episode(env_id: str, policy: TextPolicy | ActionPolicy, chat: Any, *, mode: str = "chain",
                       manager: Any = None, env_kwargs: dict[str, Any] | None = None,
                       sampling: SamplingParams | None = None, limits: EpisodeLimits | None = None,
                       seed: int | None = None, options: dict[str, Any] | None = None,
                       trajectory_id: str | None = None, group_id: str | None = None, on_error: str = "record",
                       max_turns: int | None = None, history: int | None = None,
                       max_context_tokens: int | None = None, max_response_tokens: int | None = None,
                       max_prompt_tokens: int | None = None) -> Trajectory:
    """Play one episode of ``env_id`` with ``policy`` and return its :class:`Trajectory`.

    The env is made here (``gymnasium.make(env_id, manager=manager, **env_kwargs).unwrapped``), so
    its episode's rollout scope is this call: every resource it acquired is released when this
    returns, also on error or cancellation (``env.aclose()``).

    Args:
        env_id: a registered env id (full, e.g. ``"agentfly/Chess-v0"``: it is recorded as given).
        policy: a :class:`TextPolicy` (token ids), an :class:`ActionPolicy` (scripted actions) or a
            :class:`~agentfly_gym.rollout.policies.base.ChatPolicy` (an endpoint: messages in, a reply out; chain
            mode only, played by :func:`~agentfly_gym.rollout.chat_episode.run_chat_episode`).
        chat: a :class:`~agentfly_gym.rollout.chat.ChatTokenizer` for the policy's tokenizer (None for a
            ChatPolicy, which renders nothing itself).
        mode: ``"chain"`` (:func:`~agentfly_gym.rollout.chain.run_chain_episode`: one sequence,
            ``limits.max_context_tokens`` and ``limits.max_response_tokens`` apply) or ``"step"``
            (:func:`~agentfly_gym.rollout.step.run_step_episode`: one row per step, ``limits.history`` and
            ``limits.max_prompt_tokens`` apply).  Options of the other mode are ignored.
        manager: the :class:`~agentfly_gym.resources.ResourceManager` backing the env (None: the
            env's default).
        env_kwargs: constructor keyword arguments of the env (plus what ``policy`` needs of it and
            ``env_kwargs`` leaves unset: :func:`~agentfly_gym.rollout.env_needs.policy_env_kwargs`).
        limits: the episode's :class:`~agentfly_gym.limits.EpisodeLimits` (None: the defaults, 10 turns).
        max_turns, history, max_context_tokens, max_response_tokens, max_prompt_tokens: the older way to
            give limits; each one given (not None) replaces that field of ``limits``.
        sampling, seed, options, trajectory_id, group_id: as in the mode's function.
        on_error: ``"record"``: an exception is logged (WARNING) and returned as a trajectory with
            ``error="<ExceptionType>: <message>"`` and ``status="error"``: with nothing played when it
            came before or during the reset (a bad option, a resource that cannot start), else truncated
            with the turns (step rows) played so far (a policy or generation error);
            ``"raise"``: it propagates.  A fault the env handled itself (``info["error"]``) is never
            raised: the episode ends there and the trajectory keeps its turns, with ``error`` set and
            ``status="error"``.

    Raises:
        ConfigError: a bad ``mode``, ``on_error`` or limit, or step mode with a ChatPolicy (always raised).
        Exception: with ``on_error="raise"``, what making or playing the env raised.
        asyncio.CancelledError: when cancelled (the env is closed first).
    """
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r} is not one of {MODES}", field="mode")
    if on_error not in ("record", "raise"):
        raise ConfigError(f"on_error={on_error!r} is not one of ('record', 'raise')", field="on_error")
    limits = EpisodeLimits.merge(limits, max_turns=max_turns, history=history, max_context_tokens=max_context_tokens,
                                 max_response_tokens=max_response_tokens, max_prompt_tokens=max_prompt_tokens)
    chat_policy = is_chat_policy(policy)
    if chat_policy and mode != "chain":
        raise ConfigError(f"mode={mode!r}: a chat endpoint policy ({type(policy).__name__}) plays chain mode only "
                          "(step mode renders a fresh token prompt per step, which an endpoint does not take)",
                          field="mode")
    t0 = time.monotonic()
    env = None
    try:
        env = gymnasium.make(env_id, manager=manager, **policy_env_kwargs(policy, env_id, env_kwargs)).unwrapped
        common = dict(env_id=env_id, sampling=sampling, max_turns=limits.max_turns, seed=seed, options=options,
                      trajectory_id=trajectory_id, group_id=group_id, keep_on_error=on_error == "record")
        if chat_policy:
            from .chat_episode import run_chat_episode

            return await run_chat_episode(env, policy, **common)
        if mode == "chain":
            traj = await run_chain_episode(env, policy, chat, max_context_tokens=limits.max_context_tokens,
                                           max_response_tokens=limits.max_response_tokens, **common)
        else:
            traj = await run_step_episode(env, policy, chat, history=limits.history,
                                          max_prompt_tokens=limits.max_prompt_tokens, **common)
        return traj
    except asyncio.CancelledError:
        raise
    except Exception as e:
        if on_error == "raise":
            raise
        log.warning("trajectory %s (%s) failed: %s", trajectory_id, env_id, e)
        log.debug("%s", traceback.format_exc())
        return Trajectory(trajectory_id=trajectory_id or "", group_id=group_id or "", env_id=env_id, task_id="",
                          seed=seed, mode=mode, prompt_ids=[], error=f"{type(e).__name__}: {e}", status="error",
                          text_only=chat_policy,
                          timings={"wall": time.monotonic() - t0},
                          scope_id=getattr(env, "scope_id", "") if env is not None else "")
    finally:
        if env is not None:
            await env.aclose()
