"""OpenAI chat messages in and out of the gateway: reading a request's messages (hostile input), the form the chat
template renders, the canonical form the stitcher compares, and the assistant message built from sampled ids.

A request's ``messages`` follow OpenAI's Chat Completions format (``role`` ``system`` / ``developer`` / ``user`` /
``assistant`` / ``tool``; ``content`` a string, ``None`` or a list of ``{"type": "text", "text": ...}`` parts;
an assistant's ``tool_calls`` as ``[{"id", "type": "function", "function": {"name", "arguments": JSON string}}]``).
Anything else is a :class:`BadRequest` whose message names the offending field (the HTTP layer answers it in
OpenAI's error shape).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import AgentFlyError, ConfigError

__all__ = [
    "BadRequest",
    "Message",
    "as_bad_request",
    "read_messages",
    "read_tools",
    "reply_message",
    "template_messages",
    "tools_key",
]

ROLES = ("system", "developer", "user", "assistant", "tool")


class BadRequest(AgentFlyError):
    """A request the gateway refuses; answered as OpenAI's error object with ``status`` (400 by default).

    Attributes:
        status: the HTTP status code.
        param: the request field at fault (OpenAI's ``param``), or None.
        code: OpenAI's error ``code`` (e.g. ``"context_length_exceeded"``), or None.
        kind: OpenAI's error ``type`` (``"invalid_request_error"`` unless said otherwise).
    """

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@contextlib.contextmanager
def as_bad_request(param: str | None = None) -> Iterator[None]:
    """Answer a :class:`~agentfly_gym.errors.ConfigError` raised inside (the project's checks of a value:
    :func:`~agentfly_gym.limits.check_int`, :func:`~agentfly_gym.data.task_draw.check_seed`, ...) as a 400
    :class:`BadRequest` with the same message, at fault ``param``."""
    try:
        yield
    except ConfigError as e:
        raise BadRequest(str(e), param=param) from None


@dataclasses.dataclass(frozen=True)
class Message:
    """One chat message, canonical: what the stitcher compares (tool-call ids left out: agents rename them).

    Attributes:
        role: ``system`` / ``user`` / ``assistant`` / ``tool`` (``developer`` is read as ``system``).
        content: the text (text parts joined; ``None`` read as ``""``).
        tool_calls: an assistant's calls as ``(name, arguments)`` pairs, the arguments as canonical JSON text
            (sorted keys) when they parse, else as sent.
        name: the ``name`` field of a message (a tool result's tool name), or ``""``.
        tool_call_ids: the ids of the calls (assistant) or the id answered (tool), as sent; not compared.
    """

    role: str
    content: str
    tool_calls: tuple[tuple[str, str], ...] = ()
    name: str = ""
    tool_call_ids: tuple[str, ...] = dataclasses.field(default=(), compare=False)


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") \
                    and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}.content[{k}] is a {kind!r} part; this gateway serves a text model and "
                                 "reads text parts only ({\"type\": \"text\", \"text\": ...})", param=f"{where}.content")
        return "".join(parts)
    raise BadRequest(f"{where}.content must be a string, null or a list of text parts, got {type(content).__name__}",
                     param=f"{where}.content")


def _canonical_arguments(args: Any) -> str:
    if isinstance(args, str):
        try:
            return json.dumps(json.loads(args), sort_keys=True, ensure_ascii=False)
        except (ValueError, RecursionError):
            return args
    try:
        return json.dumps(args, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(args)


def _tool_calls(calls: Any, where: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    if calls is None:
        return (), ()
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls must be a list, got {type(calls).__name__}", param=f"{where}.tool_calls")
    out, ids = [], []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"{where}.tool_calls[{k}] must be {{\"type\": \"function\", \"function\": {{\"name\": str, "
                             "\"arguments\": str}}}}", param=f"{where}.tool_calls")
        out.append((fn["name"], _canonical_arguments(fn.get("arguments", "{}"))))
        ids.append(str(call.get("id") or ""))
    return tuple(out), tuple(ids)


def read_messages(messages: Any) -> list[Message]:
    """The canonical :class:`Message` list of a request's ``messages``.

    Raises:
        BadRequest: not a non-empty list of message objects, an unknown role, a content of another kind than
            text, a malformed tool call (the message names the field, e.g. ``messages[2].role``).
    """
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of message objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object, got {type(m).__name__}", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}.role={role!r} is not one of {list(ROLES)}", param=f"{where}.role")
        calls, ids = _tool_calls(m.get("tool_calls"), where) if role == "assistant" else ((), ())
        if role == "tool":
            ids = (str(m.get("tool_call_id") or ""),)
        name = m.get("name")
        out.append(Message(role="system" if role == "developer" else role, content=_text(m.get("content"), where),
                           tool_calls=calls, name=name if isinstance(name, str) else "", tool_call_ids=ids))
    return out


def read_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A request's ``tools`` (OpenAI function schemas) as the template receives them, or None for none.

    Raises:
        BadRequest: not a list of ``{"type": "function", "function": {"name": str, ...}}`` objects.
    """
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest(f"tools must be a list, got {type(tools).__name__}", param="tools")
    for k, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise BadRequest(f"tools[{k}] must be {{\"type\": \"function\", \"function\": {{\"name\": str, ...}}}}",
                             param="tools")
    return [{"type": "function", "function": dict(t["function"])} for t in tools]


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    """A string equal for equal tool lists (canonical JSON)."""
    return json.dumps(list(tools), sort_keys=True, default=str) if tools else ""


def template_messages(messages: Sequence[Message], *, renders_tools: bool) -> list[dict[str, Any]]:
    """``messages`` in the form Hugging Face chat templates read: ``{"role", "content"}``, an assistant's calls as
    ``tool_calls`` with ``arguments`` an object (Qwen's templates also take a string).  A template that ignores
    tools (``renders_tools`` False) gets each call written into the assistant's content in the Hermes format, the
    format the gateway's tool prompt teaches it (:func:`~agentfly_gym.tools.formats.hermes_tool_prompt`)."""
    from ..tools.formats import format_tool_call

    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "tool" and m.name:
            d["name"] = m.name
        if m.tool_calls:
            calls = []
            for name, args in m.tool_calls:
                try:
                    parsed: Any = json.loads(args)
                except (ValueError, RecursionError):
                    parsed = args
                calls.append((name, parsed))
            if renders_tools:
                d["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
            else:
                text = "\n".join(format_tool_call(n, a if isinstance(a, dict) else {"arguments": a}) for n, a in calls)
                d["content"] = f"{m.content}\n{text}".lstrip("\n") if m.content else text
        out.append(d)
    return out


def reply_message(text: str, *, tools: Sequence[dict[str, Any]] | None, tool_format: str,
                  parse_calls: bool = True) -> tuple[dict[str, Any], Message, str]:
    """The assistant message of a reply: ``(OpenAI message, canonical Message, finish hint)``.

    With ``tools`` (and ``parse_calls``), tool calls written in ``tool_format`` are parsed out of ``text``
    (:func:`~agentfly_gym.tools.formats.parse_tool_calls`): the message's ``content`` is the text outside the
    calls (None when empty), ``tool_calls`` the calls (ids ``call_<random hex>``, arguments a JSON string) and
    the hint ``"tool_calls"``.  A malformed call (the model's fault) leaves the whole text as content.
    """
    from ..tools.formats import ToolCallError, parse_tool_calls

    calls = []
    if tools and parse_calls:
        try:
            calls = parse_tool_calls(text, tool_format)
        except ToolCallError:
            calls = []
    if not calls:
        return {"role": "assistant", "content": text}, Message("assistant", text), ""
    content = _outside_calls(text, tool_format)
    wire = []
    for c in calls:
        args = c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments, ensure_ascii=False)
        wire.append({"id": c.id or f"call_{secrets.token_hex(12)}", "type": "function",
                     "function": {"name": c.name, "arguments": args}})
    canon = Message("assistant", content, tuple((c.name, _canonical_arguments(c.arguments)) for c in calls),
                    tool_call_ids=tuple(w["id"] for w in wire))
    return {"role": "assistant", "content": content or None, "tool_calls": wire}, canon, "tool_calls"


def _outside_calls(text: str, tool_format: str) -> str:
    """The text of a reply before its first tool call (Hermes blocks, Mistral's marker); "" for a reply that is
    only a call (Llama-3's JSON)."""
    for marker in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"):
        i = text.find(marker)
        if i >= 0:
            return text[:i].strip()
    return "" if tool_format in ("llama3", "auto", "mistral") else text.strip()
