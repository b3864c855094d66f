"""Chain rollout with a chat policy (an OpenAI-compatible endpoint): the conversation goes out as messages, each
reply comes back as text (and native tool calls), and the env is stepped with it.

The trajectory keeps ``messages`` and ``turns`` as any other.  Its token fields are filled only when they are
faithful: every reply came with the server's prompt ids and sampled ids (vLLM's ``return_token_ids``) and each
next prompt starts with the previous prompt followed by the sampled ids (the server did not re-render a past
reply differently).  Then the chain is ``prompt_ids`` = the first prompt, and per turn the sampled ids (mask 1,
their logprobs, NaN where none) and the rest of the next prompt (mask 0: the end of the assistant message, the
observation).  Otherwise the trajectory is ``text_only`` with empty token fields, and the training paths refuse
it (:func:`~agentfly_gym.rollout.trajectory.require_token_ids`): ids re-tokenized from text would drift.

Native tool calls: a reply's ``tool_calls`` are written into the reply text in the env's tool format
(:func:`~agentfly_gym.tools.formats.format_tool_call`; Hermes unless the env says otherwise), which the env
parses as any model's reply; the conversation sent back to the endpoint keeps the assistant message's native
``tool_calls`` and answers each with a ``role: "tool"`` message under its call id.  Calls the model wrote into its
text instead (a server without native tool calling) are run by the env all the same, and their results go back as
``role: "user"`` messages: an OpenAI-compatible API refuses a tool message that answers no native call.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from .policies.base import SamplingParams
from .trajectory import Trajectory
from .turns import act_and_record, fail_trajectory, finish_trajectory

__all__ = ["reply_text", "run_chat_episode"]

log = logging.getLogger(__name__)


def reply_text(reply: Any, tool_format: str = "hermes") -> str:
    """The reply as the env reads it: its content, then each native tool call written in ``tool_format``
    (a call whose arguments are not a JSON object is written with its raw text, so the env reports it as a
    malformed call to the model)."""
    from ..tools.formats import format_tool_call

    parts = [reply.text] if reply.text else []
    for call in reply.tool_calls:
        try:
            args = json.loads(call["arguments"] or "{}")
        except ValueError:
            args = None
        if isinstance(args, dict):
            parts.append(format_tool_call(call["name"], args, tool_format))
        else:
            parts.append(f'<tool_call>\n{{"name": {json.dumps(call["name"])}, "arguments": {call["arguments"]}}}\n</tool_call>')
    return "\n".join(parts)


def _assistant_message(reply: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.text or ""}
    if reply.tool_calls:
        msg["tool_calls"] = [{"id": c["id"] or f"call_{k}", "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for k, c in enumerate(reply.tool_calls)]
    return msg


def _answer_calls(reply: Any, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The env's messages for a step, sent back so that each native call gets a ``role: "tool"`` answer under
    its own id (the env numbers calls itself; they are matched by position)."""
    if not reply.tool_calls:
        return [m if m.get("role") != "tool" else {"role": "user", "content": m.get("content", "")} for m in new]
    out, tools = [], [m for m in new if m.get("role") == "tool"]
    for k, call in enumerate(reply.tool_calls):
        content = tools[k].get("content", "") if k < len(tools) else "Error: the call was not run"
        out.append({"role": "tool", "tool_call_id": call["id"] or f"call_{k}", "content": content})
    out += [m for m in new if m.get("role") != "tool"]
    return out


class _Tokens:
    """Builds the chain's token fields from the server's ids while they stay faithful (module docstring)."""

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.ok = True
        self.end: list[int] | None = None  # the last prompt + sampled ids

    def add(self, reply: Any, turn: int) -> None:
        if not self.ok:
            return
        prompt, sampled = reply.prompt_token_ids, reply.token_ids
        if prompt is None or sampled is None:
            self._drop("the endpoint returned no token ids")
            return
        t = self.traj
        if self.end is None:
            t.prompt_ids = list(prompt)
        elif prompt[:len(self.end)] != self.end:
            self._drop(f"the server rendered turn {turn}'s prompt with other ids than it sampled before")
            return
        else:
            t.extend(prompt[len(self.end):], 0)
        t.extend(sampled, 1, reply.logprobs)
        self.end = list(prompt) + list(sampled)

    def _drop(self, why: str) -> None:
        self.ok = False
        t = self.traj
        t.text_only = True
        t.prompt_ids, t.response_ids, t.response_mask, t.response_logprobs = [], [], [], []
        log.debug("trajectory %s is text-only: %s", t.trajectory_id, why)


async def run_chat_episode(env: Any, policy: Any, *, env_id: str = "", sampling: SamplingParams | None = None,
                           max_turns: int = 10, seed: int | None = None, options: dict[str, Any] | None = None,
                           trajectory_id: str | None = None, group_id: str | None = None,
                           keep_on_error: bool = False) -> Trajectory:
    """Play one episode of ``env`` with the chat policy ``policy`` (chain mode) and return its trajectory.

    Args:
        env: an unwrapped :class:`~agentfly_gym.envs.base.AgentFlyEnv`.
        policy: a :class:`~agentfly_gym.rollout.policies.base.ChatPolicy` (``await policy.complete(messages,
            tools=..., sampling=...)``).
        sampling, max_turns, seed, options, trajectory_id, group_id, keep_on_error: as in
            :func:`~agentfly_gym.rollout.chain.run_chain_episode` (an endpoint that fails after its retries
            raises :class:`~agentfly_gym.rollout.policies.endpoint_policy.EndpointError`: with ``keep_on_error``
            the trajectory ends with ``status="error"``).

    The env's episode is always ended before returning, also on error or cancellation.
    """
    sampling = sampling or SamplingParams()
    t_start = time.monotonic()
    prompt = env.agent_prompt
    tools = list(prompt.tools or ())
    tool_format = getattr(env, "tool_format", "hermes")
    try:
        t0 = time.monotonic()
        obs, info = await env.areset(seed=seed, options=options)
        reset_s = time.monotonic() - t0
        messages: list[dict[str, Any]] = [{"role": "system", "content": prompt.system},
                                          {"role": "user", "content": prompt.first_message(obs)}]
        traj = Trajectory(trajectory_id=trajectory_id or uuid.uuid4().hex[:12], group_id=group_id or "",
                          env_id=env_id or env.env_name, task_id=str(info.get("task_id", "")), seed=seed,
                          mode="chain", prompt_ids=[], scope_id=getattr(env, "scope_id", ""))
        traj.messages = messages
        tokens = _Tokens(traj)
        terminated = truncated = False
        try:
            for turn_idx in range(max_turns):
                t0 = time.monotonic()
                reply = await policy.complete(messages, tools=tools, sampling=sampling)
                gen_s = time.monotonic() - t0
                tokens.add(reply, turn_idx)
                text = reply_text(reply, tool_format)
                messages.append(_assistant_message(reply))
                finish = "length" if reply.finish_reason == "length" else "stop"
                _, obs, _, terminated, truncated, info = await act_and_record(
                    env, traj, text, reply.token_ids or [], finish, gen_s)
                if terminated or truncated:
                    break
                if turn_idx == max_turns - 1:
                    truncated = True
                    break
                messages.extend(_answer_calls(reply, prompt.turn_messages(obs, info)))
        except Exception as e:
            if not keep_on_error:
                raise
            if not traj.turns:
                tokens._drop("the episode failed before a reply")
            return fail_trajectory(traj, e, info=info, t_start=t_start, reset_s=reset_s)
        if not traj.turns:
            tokens._drop("no reply")
        return finish_trajectory(traj, terminated=terminated, truncated=truncated, info=info, t_start=t_start,
                                 reset_s=reset_s)
    finally:
        await env.aend_episode()
