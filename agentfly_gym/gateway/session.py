"""A gateway session: one rollout's calls, recorded as token-id segments.

Each chat-completion call of a session renders a prompt (ids P), samples a reply (ids G, logprobs) and is stitched:

* if P extends the ids of an open segment (its prompt ids + response ids, P[:n] equal to them), the call is
  APPENDED to that segment: ``P[n:]`` (the end-of-turn id that closes the last reply where it did not sample one,
  the new messages, the generation prompt) joins the response with mask 0, then G with mask 1 and its logprobs;
* otherwise (the agent rewrote its history: dropped reasoning, summarised, reordered, or its full render of its own
  earlier reply differs from what was sampled) a new segment starts with prompt ids P and response G.

How P is built: when the request's messages extend a segment's conversation (its messages and the assistant
message the gateway returned, compared in canonical form, :class:`~.messages.Message`) with non-assistant
messages and the same tools, P is that segment's ids + :meth:`ChatTokenizer.close_assistant_ids` +
:meth:`ChatTokenizer.append_ids` of the new messages: the sampled ids are reused, never decoded and re-encoded
(the incremental method of the env's chain mode).  Otherwise P is a full render of the messages with the tools
(:meth:`ChatTokenizer.prompt_ids`).  Either way P is exactly the prompt the policy was given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import math
import secrets
import time
from collections.abc import Sequence
from typing import Any

from .messages import BadRequest, Message, template_messages, tools_key

__all__ = ["CallRecord", "Segment", "Session"]


@dataclasses.dataclass
class Segment:
    """One stitched chain of calls.

    Attributes:
        prompt_ids: the first call's prompt ids (length P).
        response_ids: everything after it (length R): sampled ids (mask 1) and the context appended between
            calls (mask 0).
        response_mask: 1 for sampled ids, 0 for context (length R).
        logprobs: the policy's logprob per sampled id (0.0 at mask 0; NaN where the policy reports none).
        num_calls: calls in this segment.
        messages: the canonical conversation so far, ending with the last assistant reply.
        tools_key: the tools of its calls (canonical JSON; "" for none).
        last_sampled: the last call's sampled ids (to close the assistant turn).
    """

    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    response_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    num_calls: int = 0
    messages: list[Message] = dataclasses.field(default_factory=list)
    tools_key: str = ""
    last_sampled: list[int] = dataclasses.field(default_factory=list)

    def ids(self) -> list[int]:
        """Prompt ids + response ids."""
        return self.prompt_ids + self.response_ids

    def add_reply(self, sampled: Sequence[int], logprobs: Sequence[float] | None) -> None:
        lps = list(logprobs) if logprobs is not None else [math.nan] * len(sampled)
        self.response_ids += [int(t) for t in sampled]
        self.response_mask += [1] * len(sampled)
        self.logprobs += [float(x) for x in lps]
        self.last_sampled = [int(t) for t in sampled]
        self.num_calls += 1

    def to_json(self) -> dict[str, Any]:
        """``{"prompt_ids", "response_ids", "response_mask", "logprobs", "num_calls"}`` (NaN logprobs as null)."""
        return {"prompt_ids": list(self.prompt_ids), "response_ids": list(self.response_ids),
                "response_mask": list(self.response_mask),
                "logprobs": [x if math.isfinite(x) else None for x in self.logprobs], "num_calls": self.num_calls}


@dataclasses.dataclass
class CallRecord:
    """What one call did.

    Attributes:
        segment: the index of the segment it was recorded in.
        appended: True when it extended that segment, False when it started it.
        incremental: True when its prompt was built from the segment's ids (no render of the past).
        prompt_tokens, sampled_tokens: lengths (tokens).
        finish_reason: OpenAI's finish reason (``stop`` / ``length`` / ``tool_calls``).
        seconds: the call's wall time, queueing included.
    """

    segment: int
    appended: bool
    incremental: bool
    prompt_tokens: int
    sampled_tokens: int
    finish_reason: str
    seconds: float


class Session:
    """One rollout's session: an unguessable id and api key, a turn limit, the recorded segments.

    Args:
        max_turns: most chat-completion calls; the next one is refused (HTTP 403, code ``turn_limit_reached``).
        metadata: JSON-able data of the caller (task id, group id), returned with the trajectory.

    Attributes:
        id: the session id (URL-safe, 128 bits of randomness).
        api_key: the session's bearer token (256 bits); compared in constant time.
        segments, calls: what was recorded.
        closed: set by :meth:`close`; a closed session answers no more calls (its trajectory stays readable).
    """

    def __init__(self, *, max_turns: int = 32, metadata: dict[str, Any] | None = None) -> None:
        from ..limits import check_int

        max_turns = check_int("max_turns", max_turns)
        self.id = secrets.token_urlsafe(16)
        self.api_key = "afg-" + secrets.token_urlsafe(32)
        self.max_turns = max_turns
        self.metadata = dict(metadata or {})
        self.segments: list[Segment] = []
        self.calls: list[CallRecord] = []
        self.closed = False
        self.created = time.time()
        self._pending = 0
        self.lock = asyncio.Lock()  # calls of one session are recorded one at a time

    def check_key(self, key: str | None) -> bool:
        """Whether ``key`` is this session's api key (constant-time comparison)."""
        return isinstance(key, str) and hmac.compare_digest(key.encode(), self.api_key.encode())

    def close(self) -> None:
        """Refuse further calls (the rollout is over)."""
        self.closed = True

    def take_turn(self) -> None:
        """Count a call against the turn limit before it runs.

        Raises:
            BadRequest: the session is closed (403, code ``session_closed``) or its ``max_turns`` calls are used
                (403, code ``turn_limit_reached``).
        """
        if self.closed:
            raise BadRequest("this session is closed: its rollout has ended", status=403, code="session_closed",
                             kind="permission_error")
        if len(self.calls) + self._pending >= self.max_turns:
            raise BadRequest(f"this session's turn limit ({self.max_turns} calls) is reached", status=403,
                             code="turn_limit_reached", kind="permission_error")
        self._pending += 1

    def release_turn(self) -> None:
        """A counted call ended without being recorded (it failed before sampling)."""
        self._pending = max(0, self._pending - 1)

    def plan_prompt(self, messages: list[Message], tools: list[dict[str, Any]] | None, chat: Any
                    ) -> tuple[list[int], bool]:
        """``(prompt ids, incremental)`` of a call (see the module docstring).

        Raises:
            TokenizationError: the template cannot render ``messages`` (an error of the agent's request).
        """
        key = tools_key(tools)
        for seg in reversed(self.segments):
            n = len(seg.messages)
            new = messages[n:]
            if seg.tools_key != key or len(messages) <= n or messages[:n] != seg.messages \
                    or any(m.role == "assistant" for m in new):
                continue
            try:
                tail = chat.append_ids(template_messages(new, renders_tools=chat.renders_tools), tools=tools)
            except Exception:  # noqa: BLE001  (a template that cannot extend with these roles: render in full)
                break
            return seg.ids() + chat.close_assistant_ids(seg.last_sampled) + tail, True
        rendered = chat.prompt_ids(template_messages(messages, renders_tools=chat.renders_tools), tools=tools)
        return rendered, False

    def record(self, prompt_ids: list[int], sampled: Sequence[int], logprobs: Sequence[float] | None,
               messages: list[Message], reply: Message, tools: list[dict[str, Any]] | None, *, incremental: bool,
               finish_reason: str, seconds: float) -> CallRecord:
        """Stitch one call into the segments (see the module docstring) and return its record.

        Raises:
            BadRequest: the session was closed while the call was sampling (403, ``session_closed``): its rollout
                has ended and taken its segments, which must not change afterwards; the reply is dropped.
        """
        self._pending = max(0, self._pending - 1)
        if self.closed:
            raise BadRequest("this session was closed while the reply was sampled: its rollout has ended",
                             status=403, code="session_closed", kind="permission_error")
        key = tools_key(tools)
        target = None
        for i in range(len(self.segments) - 1, -1, -1):
            full = self.segments[i].ids()
            if len(prompt_ids) >= len(full) and prompt_ids[:len(full)] == full:
                target = i
                break
        if target is None:
            self.segments.append(Segment(prompt_ids=list(prompt_ids), tools_key=key))
            target = len(self.segments) - 1
            appended = False
        else:
            seg = self.segments[target]
            extra = prompt_ids[len(seg.ids()):]
            seg.response_ids += extra
            seg.response_mask += [0] * len(extra)
            seg.logprobs += [0.0] * len(extra)
            seg.tools_key = key
            appended = True
        seg = self.segments[target]
        seg.add_reply(sampled, logprobs)
        seg.messages = list(messages) + [reply]
        rec = CallRecord(segment=target, appended=appended, incremental=incremental, prompt_tokens=len(prompt_ids),
                         sampled_tokens=len(sampled), finish_reason=finish_reason, seconds=seconds)
        self.calls.append(rec)
        return rec

    @property
    def num_rewritten(self) -> int:
        """Calls that started a segment after the first call (the agent rewrote its history)."""
        return sum(1 for c in self.calls[1:] if not c.appended)

    def trajectory(self) -> dict[str, Any]:
        """The recorded trajectory as JSON: ``{"session_id", "segments": [Segment.to_json()], "calls": [...],
        "num_calls", "num_segments", "num_appended", "num_rewritten", "num_incremental", "closed", "metadata"}``;
        ``num_rewritten`` counts calls that started a segment after the first (history rewritten)."""
        return {"session_id": self.id, "segments": [s.to_json() for s in self.segments],
                "calls": [dataclasses.asdict(c) for c in self.calls], "num_calls": len(self.calls),
                "num_segments": len(self.segments), "num_appended": sum(c.appended for c in self.calls),
                "num_rewritten": self.num_rewritten,
                "num_incremental": sum(c.incremental for c in self.calls), "closed": self.closed,
                "metadata": self.metadata}
