"""Tool calls in a model family's native format: parsing replies, choosing the format from a chat template,
and describing tools to a template that has no ``tools`` support.

Formats (:data:`FORMATS`), as the families' chat templates teach them:

* ``"hermes"`` (Hermes, Qwen2.5/Qwen3, SmolLM3, many others): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; several blocks = several calls.
* ``"llama3"`` (Llama-3.1/3.2/3.3 JSON tool calling): the reply is a JSON object
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``); several calls are separated by
  ``;`` (``"arguments"`` is accepted for ``"parameters"``).
* ``"mistral"``: ``[TOOL_CALLS]`` followed by a JSON list ``[{"name": ..., "arguments": {...}, "id": ...}]``
  (v3 tokenizers), or by ``name[ARGS]{...}`` per call (v11+ tokenizers).  Policies decode replies without special
  tokens, so a reply that IS a JSON list of calls is read as one too.
* ``"auto"``: the format whose marker the reply holds (``[TOOL_CALLS]``, ``<tool_call>``), else Llama-3's JSON when
  the reply is a JSON object with a ``"name"`` (or a list of them).

A reply with no call is an answer.  A reply that tries to call a tool and fails (an unclosed block, broken JSON,
no name) is a :class:`ToolCallError`, whose message tells the model what was wrong.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ToolError

__all__ = ["FORMATS", "ToolCall", "ToolCallError", "parse_tool_calls", "format_tool_call", "detect_tool_format",
           "hermes_tool_prompt"]

FORMATS = ("auto", "hermes", "llama3", "mistral")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_ARGS_RE = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call parsed from a reply.

    Attributes:
        name: the tool's name as the model wrote it.
        arguments: the arguments (a dict when well formed; anything else is reported by the tool).
        id: the call id the model gave (Mistral), else ``""``.
    """

    name: str
    arguments: Any
    id: str = ""


class ToolCallError(ToolError, ValueError):
    """A reply tried to call a tool but the call is malformed; the message says what was wrong (for the model)."""


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"{what} is not valid JSON ({e.msg} at character {e.pos}): {text[:200]!r}") from None
    except RecursionError:  # hostile nesting ("[[[[..."): a malformed call, not a crash
        raise ToolCallError(f"{what} is nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer past Python's digit limit (sys.set_int_max_str_digits)
        raise ToolCallError(f"{what} cannot be read: {e}") from None


def _call(obj: Any, what: str, args_keys: Sequence[str]) -> ToolCall:
    if not isinstance(obj, dict):
        raise ToolCallError(f"{what} must be a JSON object with \"name\" and \"arguments\", got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError(f"{what} has no \"name\" (a string): {json.dumps(obj)[:200]}")
    args: Any = {}
    for k in args_keys:
        if k in obj:
            args = obj[k]
            break
    if isinstance(args, str):  # some models (and OpenAI's wire format) send the arguments as a JSON string
        stripped = args.strip()
        args = _loads(stripped, f"the arguments of {name!r}") if stripped else {}
    call_id = obj.get("id")
    return ToolCall(name=name, arguments=args, id=call_id if isinstance(call_id, str) else "")


def _parse_hermes(text: str) -> list[ToolCall]:
    calls = []
    i = text.find(_HERMES_OPEN)
    while i >= 0:
        j = text.find(_HERMES_CLOSE, i)
        if j < 0:
            body = text[i + len(_HERMES_OPEN):].strip()
            # a reply cut at the end of the JSON (a stop on </tool_call>) is still a whole call
            try:
                calls.append(_call(json.loads(body), f"tool call {len(calls) + 1}", ("arguments", "parameters")))
                break
            except (ValueError, RecursionError):  # JSONDecodeError and ToolCallError are ValueErrors
                raise ToolCallError(f"tool call {len(calls) + 1} opens {_HERMES_OPEN} but never closes it with "
                                    f"{_HERMES_CLOSE}") from None
        body = text[i + len(_HERMES_OPEN):j].strip()
        calls.append(_call(_loads(body, f"tool call {len(calls) + 1}"), f"tool call {len(calls) + 1}",
                           ("arguments", "parameters")))
        i = text.find(_HERMES_OPEN, j + len(_HERMES_CLOSE))
    return calls


def _json_objects(text: str) -> list[Any]:
    """The JSON values of ``text``: one value, or several separated by ``;`` (Llama-3's parallel calls)."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise ToolCallError("the tool call is nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer past Python's digit limit
        raise ToolCallError(f"the tool call cannot be read: {e}") from None
    dec = json.JSONDecoder()
    out, pos = [], 0
    while pos < len(text):
        try:
            obj, end = dec.raw_decode(text, pos)
        except RecursionError:
            raise ToolCallError("the tool call is nested too deeply to read") from None
        except json.JSONDecodeError as e:
            raise ToolCallError(f"the tool call is not valid JSON ({e.msg} at character {e.pos}): {text[:200]!r}") from None
        except ValueError as e:  # e.g. an integer past Python's digit limit
            raise ToolCallError(f"the tool call cannot be read: {e}") from None
        out.append(obj)
        pos = end
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
    return out


def _parse_llama3(text: str, *, strict: bool) -> list[ToolCall]:
    body = text.strip()
    tagged = body.startswith(_PYTHON_TAG)
    if tagged:
        body = body[len(_PYTHON_TAG):].strip()
    if not body.startswith(("{", "[")):
        if tagged:
            raise ToolCallError(f"{_PYTHON_TAG} must be followed by a JSON object {{\"name\": ..., \"parameters\": ...}}")
        return []
    try:
        values = _json_objects(body)
    except ToolCallError:
        if tagged or strict or '"name"' in body:
            raise
        return []
    flat: list[Any] = []
    for v in values:
        flat.extend(v if isinstance(v, list) else [v])
    if not (tagged or strict) and not all(isinstance(v, dict) and "name" in v for v in flat):
        return []  # a JSON answer, not a call
    return [_call(v, f"tool call {k + 1}", ("parameters", "arguments")) for k, v in enumerate(flat)]


def _parse_mistral(text: str, *, strict: bool) -> list[ToolCall]:
    i = text.find(_MISTRAL)
    if i < 0:
        body = text.strip()
        if body.startswith("[") and not strict:
            try:
                values = json.loads(body)
            except (ValueError, RecursionError):  # not a call list (JSONDecodeError is a ValueError)
                return []
            if isinstance(values, list) and values and all(isinstance(v, dict) and "name" in v for v in values):
                return [_call(v, f"tool call {k + 1}", ("arguments", "parameters")) for k, v in enumerate(values)]
        return []
    calls: list[ToolCall] = []
    for part in text[i:].split(_MISTRAL)[1:]:
        body = part.strip()
        if not body:
            raise ToolCallError(f"{_MISTRAL} is followed by no call")
        m = _MISTRAL_ARGS_RE.match(part)
        if m:  # v11+: name[ARGS]{...}
            args = _loads(part[m.end():].strip(), f"the arguments of {m.group(1)!r}")
            calls.append(_call({"name": m.group(1), "arguments": args}, f"tool call {len(calls) + 1}", ("arguments",)))
            continue
        values = _loads(body, f"the tool calls after {_MISTRAL}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ToolCallError(f"{_MISTRAL} is followed by an empty list")
        calls += [_call(v, f"tool call {len(calls) + k + 1}", ("arguments", "parameters")) for k, v in enumerate(values)]
    return calls


def parse_tool_calls(text: str, tool_format: str = "auto") -> list[ToolCall]:
    """The tool calls in a model's reply, in the order written.

    Args:
        text: the reply (decoded text).
        tool_format: one of :data:`FORMATS`.

    Returns:
        The calls (empty: the reply is an answer).

    Raises:
        ToolCallError: the reply tries to call a tool but the call is malformed (the message says how).
        ValueError: an unknown ``tool_format``.
    """
    if tool_format == "hermes":
        return _parse_hermes(text)
    if tool_format == "llama3":
        return _parse_llama3(text, strict=False)
    if tool_format == "mistral":
        return _parse_mistral(text, strict=False)
    if tool_format != "auto":
        raise ValueError(f"tool_format={tool_format!r} is not one of {FORMATS}")
    if _MISTRAL in text:
        return _parse_mistral(text, strict=True)
    if _HERMES_OPEN in text or _HERMES_CLOSE in text:
        if _HERMES_OPEN not in text:
            raise ToolCallError(f"{_HERMES_CLOSE} without an opening {_HERMES_OPEN}")
        return _parse_hermes(text)
    calls = _parse_llama3(text, strict=False)
    return calls or _parse_mistral(text, strict=False)


def format_tool_call(name: str, arguments: Mapping[str, Any], tool_format: str = "hermes") -> str:
    """A reply that calls tool ``name`` with ``arguments`` in ``tool_format`` (the inverse of
    :func:`parse_tool_calls`: it parses back to this one call); for scripted experts and tests.

    Args:
        name: the tool's name.
        arguments: its arguments (JSON-serialisable).
        tool_format: one of :data:`FORMATS` (``"auto"`` writes Hermes).

    Raises:
        ValueError: an unknown ``tool_format``.
    """
    if tool_format not in FORMATS:
        raise ValueError(f"tool_format={tool_format!r} is not one of {FORMATS}")
    if tool_format == "llama3":
        return json.dumps({"name": name, "parameters": dict(arguments)}, ensure_ascii=False)
    if tool_format == "mistral":
        return _MISTRAL + json.dumps([{"name": name, "arguments": dict(arguments)}], ensure_ascii=False)
    return f"{_HERMES_OPEN}\n{json.dumps({'name': name, 'arguments': dict(arguments)}, ensure_ascii=False)}\n{_HERMES_CLOSE}"


def detect_tool_format(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches: ``"mistral"`` (``[TOOL_CALLS]``), ``"hermes"``
    (``<tool_call>``), ``"llama3"`` (``<|python_tag|>`` / the ``ipython`` role), else ``"hermes"`` (what
    :func:`hermes_tool_prompt` teaches a template without tool support)."""
    t = chat_template or ""
    if _MISTRAL in t:
        return "mistral"
    if _HERMES_OPEN in t:
        return "hermes"
    if _PYTHON_TAG in t or "ipython" in t:
        return "llama3"
    return "hermes"


def hermes_tool_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """Text describing ``tools`` (OpenAI function schemas) in the Hermes format, as Qwen's templates write it
    into the system message; for templates that ignore ``tools=`` (see
    :meth:`~agentfly_gym.rollout.chat.ChatTokenizer.prompt_ids`)."""
    lines = ["# Tools", "", "You may call one or more functions to assist with the user query.", "",
             "You are provided with function signatures within <tools></tools> XML tags:", "<tools>"]
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    lines += ["</tools>", "",
              "For each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:",
              "<tool_call>", '{"name": <function-name>, "arguments": <args-json-object>}', "</tool_call>"]
    return "\n".join(lines)
