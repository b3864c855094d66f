"""Tool calls of the R2E-Gym agent: parsing the action text into a :class:`ToolCall`.

Two action formats are accepted (one tool call per action):

1. R2E-Gym's XML function-call format (``r2egym/agenthub/agent``)::

       <function=file_editor>
       <parameter=command>str_replace</parameter>
       <parameter=path>/testbed/pkg/mod.py</parameter>
       <parameter=old_str>return a - b</parameter>
       <parameter=new_str>return a + b</parameter>
       </function>

   One leading and one trailing newline of each parameter value are dropped (so a value
   may sit on its own lines); all other whitespace is kept.

2. A JSON tool call, bare or inside ``<tool_call>...</tool_call>`` (the Hermes/Qwen style)::

       {"name": "execute_bash", "arguments": {"cmd": "pytest -q"}}

   ``"arguments"`` may also be called ``"parameters"``, and may be a JSON string.

When the text holds several calls the last one is used.  Tools and their parameters are
those of R2E-Gym: ``file_editor`` (command, path, file_text, old_str, new_str,
insert_line, view_range, concise), ``search`` (search_term, path), ``execute_bash``
(cmd), ``finish`` (command, result; alias ``submit``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from ...errors import AgentFlyError

__all__ = ["FORMAT_HELP", "TOOLS", "ActionParseError", "ToolCall", "check_call", "parse_action"]


class ActionParseError(AgentFlyError, ValueError):
    """The action text holds no valid tool call; the message says what is wrong and what is valid."""


#: tool -> (required parameters, optional parameters)
TOOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "file_editor": (("command", "path"), ("file_text", "old_str", "new_str", "insert_line", "view_range", "concise")),
    "search": (("search_term",), ("path",)),
    "execute_bash": (("cmd",), ()),
    "finish": ((), ("command", "result")),
}
_ALIASES = {"submit": "finish", "bash": "execute_bash", "str_replace_editor": "file_editor"}
_EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")

FORMAT_HELP = (
    "Call exactly one tool per action, either in XML form:\n"
    "<function=execute_bash>\n<parameter=cmd>ls /testbed</parameter>\n</function>\n"
    "or as JSON: {\"name\": \"execute_bash\", \"arguments\": {\"cmd\": \"ls /testbed\"}}\n"
    "Tools: file_editor(command, path, file_text, old_str, new_str, insert_line, view_range, concise), "
    "search(search_term, path), execute_bash(cmd), finish()."
)

# Parsing is linear in the action's length (it runs on the event loop): regexes only find opening
# tags, whose names are bounded, and the body of a block ends at the first closing tag after it
# (str.find), as with a lazy ``(.*?)``; a lazy body regex takes seconds on a repeated
# ``<function=a>`` with no closing tag.  JSON is scanned within a budget, and nesting too deep
# for the decoder is a parse error.
_MAX_NAME = 256
_FUNC_OPEN_RE = re.compile(rf"<function\s*=\s*([^>\s]{{1,{_MAX_NAME}}})\s*>")
_PARAM_OPEN_RE = re.compile(rf"<parameter\s*=\s*([^>\s]{{1,{_MAX_NAME}}})\s*>")
_TOOL_CALL_OPEN_RE = re.compile(r"<tool_call>")
_OBJECT_START_RE = re.compile(r"\{\s*\"")  # where an object with a "name" key can start
_JSON_SCAN_FACTOR = 8  # characters the JSON decoder may read per character of the action
_JSON_MAX_FAILURES = 1000  # failed decodes per block (each costs O(position): the error counts lines)


def find_blocks(text: str, opening: re.Pattern[str], closing: str) -> list[tuple[re.Match[str], str]]:
    """Non-overlapping ``opening ... closing`` blocks of ``text``, left to right, as ``(opening match, body)``.

    The same blocks as ``re.findall(opening.pattern + "(.*?)" + re.escape(closing), text, re.DOTALL)``
    when ``opening`` cannot match across a ``closing``, in time linear in ``len(text)``.
    """
    out: list[tuple[re.Match[str], str]] = []
    pos = 0
    while True:
        m = opening.search(text, pos)
        if m is None:
            return out
        end = text.find(closing, m.end())
        if end < 0:  # no later opening can be closed either
            return out
        out.append((m, text[m.end():end]))
        pos = end + len(closing)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: ``"file_editor"``, ``"search"``, ``"execute_bash"`` or ``"finish"``.
        arguments: parameter name -> value (str, except ``insert_line`` (int),
            ``view_range`` (list of two ints) and ``concise`` (bool)).
    """

    name: str
    arguments: dict[str, Any]


def _trim(value: str) -> str:
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    return value


def _from_xml(text: str) -> tuple[str, dict[str, Any]] | None:
    calls = find_blocks(text, _FUNC_OPEN_RE, "</function>")
    if not calls:
        m = _FUNC_OPEN_RE.search(text)
        if m is None:
            return None
        raise ActionParseError(f"the XML tool call <function={m.group(1)}> has no closing </function>. {FORMAT_HELP}")
    head, body = calls[-1]
    params = {k.group(1).strip(): _trim(v) for k, v in find_blocks(body, _PARAM_OPEN_RE, "</parameter>")}
    return head.group(1).strip(), params


def _too_deep() -> ActionParseError:
    return ActionParseError(f"the JSON tool call is nested too deeply to decode. {FORMAT_HELP}")


def _json_candidates(text: str) -> list[Any]:
    found: list[Any] = []
    blocks = [body for _, body in find_blocks(text, _TOOL_CALL_OPEN_RE, "</tool_call>")]
    dec = json.JSONDecoder()
    for b in blocks or [text]:
        b = b.strip()
        try:
            found.append(json.loads(b))
            continue
        except RecursionError:
            raise _too_deep() from None
        except ValueError:
            pass
        # each '{"' may start a call; the decoder reads a bounded number of characters in all
        budget, failures = _JSON_SCAN_FACTOR * len(b), 0
        m = _OBJECT_START_RE.search(b)
        while m is not None and budget > 0 and failures < _JSON_MAX_FAILURES:
            i = m.start()
            try:
                obj, end = dec.raw_decode(b, i)
            except RecursionError:
                raise _too_deep() from None
            except json.JSONDecodeError as e:
                budget -= max(e.pos - i, 1)
                failures += 1
                m = _OBJECT_START_RE.search(b, i + 1)
                continue
            budget -= end - i
            # objects inside a call are not calls
            m = _OBJECT_START_RE.search(b, end if isinstance(obj, dict) and "name" in obj else i + 1)
            if isinstance(obj, dict) and "name" in obj:
                found.append(obj)
    return [o for o in found if isinstance(o, dict) and "name" in o]


def _from_json(text: str) -> tuple[str, dict[str, Any]] | None:
    if "{" not in text:
        return None
    objs = _json_candidates(text)
    if not objs:
        return None
    obj = objs[-1]
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except RecursionError:
            raise _too_deep() from None
        except ValueError as e:
            raise ActionParseError(f"the JSON tool call's \"arguments\" string is not valid JSON ({e}). {FORMAT_HELP}") from None
    if not isinstance(args, dict):
        raise ActionParseError(f"the JSON tool call's \"arguments\" must be an object, got {type(args).__name__}. {FORMAT_HELP}")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no command line or file name can hold
        json.dumps(args, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        bad = e.object[e.start:e.end].encode("unicode_escape").decode("ascii")
        raise ActionParseError(f"the JSON tool call's arguments contain {bad}, a lone surrogate that is not valid "
                               f"Unicode text; write the character itself or leave it out. {FORMAT_HELP}") from None
    return str(obj["name"]), dict(args)


def _coerce(name: str, args: dict[str, Any]) -> dict[str, Any]:
    out = dict(args)
    if name == "file_editor":
        cmd = out.get("command")
        if cmd not in _EDITOR_COMMANDS:
            raise ActionParseError(f"file_editor command={cmd!r} is not one of {list(_EDITOR_COMMANDS)}")
        if "insert_line" in out:
            try:
                out["insert_line"] = int(str(out["insert_line"]).strip())
            except ValueError:
                raise ActionParseError(f"insert_line={out['insert_line']!r} must be an integer line number") from None
        if "view_range" in out:
            vr = out["view_range"]
            if isinstance(vr, str):
                parts = vr.strip().strip("[]()").replace(",", " ").split()
            else:
                parts = list(vr) if isinstance(vr, (list, tuple)) else [vr]
            try:
                ints = [int(p) for p in parts]
            except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e999 or Infinity
                ints = []
            if len(ints) != 2:
                raise ActionParseError(f"view_range={vr!r} must be two integers like [10, 40] (use -1 as end for 'to the end')")
            out["view_range"] = ints
        if "concise" in out:
            out["concise"] = str(out["concise"]).strip().lower() in ("true", "1", "yes")
        for key in ("path", "file_text", "old_str", "new_str"):
            if key in out and not isinstance(out[key], str):
                out[key] = str(out[key])
        if isinstance(out.get("path"), str):
            out["path"] = out["path"].strip()
    elif name in ("search", "execute_bash"):
        for k, v in list(out.items()):
            if not isinstance(v, str):
                out[k] = str(v)
        if name == "search" and "path" in out:
            out["path"] = out["path"].strip()
    return out


def parse_action(text: str) -> ToolCall:
    """The tool call in ``text`` (XML or JSON form, see the module docstring).

    Raises:
        ActionParseError: no call found, an unknown tool, an unknown or missing parameter,
            or a parameter of the wrong type; the message names the problem and the valid formats.
    """
    if not isinstance(text, str) or not text.strip():
        raise ActionParseError(f"the action is empty. {FORMAT_HELP}")
    parsed = _from_xml(text)
    if parsed is None:
        parsed = _from_json(text)
    if parsed is None:
        raise ActionParseError(f"no tool call found in the action. {FORMAT_HELP}")
    return check_call(*parsed)


def check_call(name: str, args: dict[str, Any], *, format_help: str = FORMAT_HELP) -> ToolCall:
    """The call of tool ``name`` (an alias is resolved) with ``args`` checked and coerced by R2E-Gym's rules:
    what :func:`parse_action` applies to the call it finds, and the R2E-Gym env to a native tool call.

    Args:
        name: the tool's name as the model wrote it.
        args: parameter name -> value.
        format_help: the text that follows the message of an unknown tool (how to call one).

    Raises:
        ActionParseError: an unknown tool, an unknown or missing parameter, or a parameter of the wrong type.
    """
    name = _ALIASES.get(name, name)
    if name not in TOOLS:
        raise ActionParseError(f"unknown tool {name!r}; valid tools: {sorted(TOOLS)}. {format_help}")
    required, optional = TOOLS[name]
    unknown = sorted(set(args) - set(required) - set(optional))
    if unknown:
        raise ActionParseError(f"tool {name!r} has no parameter(s) {unknown}; valid: {list(required + optional)}")
    missing = [k for k in required if k not in args]
    if missing:
        raise ActionParseError(f"tool {name!r} is missing required parameter(s) {missing}")
    return ToolCall(name, _coerce(name, args))
