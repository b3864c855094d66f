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

__all__ = ["FORMAT_HELP", "TOOLS", "ActionParseError", "ToolCall", "parse_action"]


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

_FUNC_RE = re.compile(r"<function\s*=\s*([^>\s]+)\s*>(.*?)</function>", re.DOTALL)
_FUNC_OPEN_RE = re.compile(r"<function\s*=\s*([^>\s]+)\s*>(.*)\Z", re.DOTALL)
_PARAM_RE = re.compile(r"<parameter\s*=\s*([^>\s]+)\s*>(.*?)</parameter>", re.DOTALL)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


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
    calls = _FUNC_RE.findall(text)
    if not calls:
        m = _FUNC_OPEN_RE.search(text)
        if m is None:
            return None
        raise ActionParseError(f"the XML tool call <function={m.group(1)}> has no closing </function>. {FORMAT_HELP}")
    name, body = calls[-1]
    params = {k.strip(): _trim(v) for k, v in _PARAM_RE.findall(body)}
    return name.strip(), params


def _json_candidates(text: str) -> list[Any]:
    found: list[Any] = []
    blocks = _TOOL_CALL_RE.findall(text)
    for b in blocks or [text]:
        b = b.strip()
        try:
            found.append(json.loads(b))
            continue
        except (json.JSONDecodeError, ValueError):
            pass
        dec = json.JSONDecoder()
        for i, ch in enumerate(b):
            if ch != "{":
                continue
            try:
                obj, _ = dec.raw_decode(b, i)
            except (json.JSONDecodeError, ValueError):
                continue
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
        except json.JSONDecodeError as e:
            raise ActionParseError(f"the JSON tool call's \"arguments\" string is not valid JSON ({e}). {FORMAT_HELP}") from None
    if not isinstance(args, dict):
        raise ActionParseError(f"the JSON tool call's \"arguments\" must be an object, got {type(args).__name__}. {FORMAT_HELP}")
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
            except (TypeError, ValueError):
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
    name, args = parsed
    name = _ALIASES.get(name, name)
    if name not in TOOLS:
        raise ActionParseError(f"unknown tool {name!r}; valid tools: {sorted(TOOLS)}. {FORMAT_HELP}")
    required, optional = TOOLS[name]
    unknown = sorted(set(args) - set(required) - set(optional))
    if unknown:
        raise ActionParseError(f"tool {name!r} has no parameter(s) {unknown}; valid: {list(required + optional)}")
    missing = [k for k in required if k not in args]
    if missing:
        raise ActionParseError(f"tool {name!r} is missing required parameter(s) {missing}")
    return ToolCall(name, _coerce(name, args))
