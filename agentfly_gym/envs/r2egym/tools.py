"""R2E-Gym's tools as tools of :mod:`agentfly_gym.tools`: ``search``, ``file_editor``, ``execute_bash``, ``finish``.

:func:`r2e_tools` gives them as :class:`~agentfly_gym.tools.Tool` objects, each declaring the episode's container as
its resource (``resources={"box": spec}``, rollout scope: the container the environment prepared at reset, the
same one on every turn).  The R2E-Gym environment runs them in both of its action formats: R2E-Gym's XML
(``<function=...>``, the default) and the model family's native tool calls (``tool_format="native"``), where the
chat template renders their schemas (``tools=``) and a result goes back as a ``role: "tool"`` message.

Their schemas (:data:`SCHEMAS`) are upstream R2E-Gym's function-calling definitions verbatim
(``r2egym/agenthub/tools/__init__.py``, used when its agent runs with ``use_fn_calling=True``; keys in upstream's
order, so a chat template renders the same text), in upstream's order of the tools.  They are given to
:class:`~agentfly_gym.tools.Tool` as they are, not rebuilt from the functions' signatures by ``@tool``
(transformers' ``get_json_schema`` would mark optional arguments ``"nullable"``, which upstream's do not have, and
importing transformers would slow the first reset of the XML env by seconds).

What a tool returns is what the XML action of the same call observes, byte for byte (``file_editor`` and
``search`` run :mod:`.r2e_tools` inside the container; ``execute_bash`` runs ``bash -c``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from ...resources.containers.api import ContainerResource
from ...resources.spec import ContainerSpec
from ...tools.tool import Tool
from .actions import ToolCall, check_call
from .local_tasks import TESTBED
from .testbed import TOOL_SCRIPT, TOOLS_DIR

__all__ = ["SCHEMAS", "TOOL_NAMES", "r2e_tools", "run_r2e_tool"]

#: The tools in upstream's order (``tools = [search_tool, file_editor, bash_execute_tool, finish_tool]``).
TOOL_NAMES = ("search", "file_editor", "execute_bash", "finish")

_MAX_ARGV_PAYLOAD = 100_000  # bytes of base64 passed on the command line; larger payloads go through a file

# upstream's tool descriptions, verbatim (r2egym/agenthub/tools/__init__.py)
_FILE_EDITOR_DESCRIPTION = """Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep
* The `create` command cannot be used if the specified `path` already exists as a file
* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`
* The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to include enough context in `old_str` to make it unique
* The `new_str` parameter should contain the edited lines that should replace the `old_str`
"""  # noqa: E501

_BASH_DESCRIPTION = """
Description: Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. For example: `python my_script.py`
"""

_SEARCH_DESCRIPTION = """
Description: Search for a term in either a directory or a single file.

Behavior:
* If `--path` points to a directory (default is `.`), we recursively search all non-hidden files and directories.
* If `--path` points to a file, we run `grep -n` on that file to find line numbers containing the search term.
* If more than 100 files match (directory search scenario), the tool will stop listing and inform you to narrow your search.
* If no files are found that match your search term, the tool will inform you of that as well.

**Parameters:**
  1. **search_term** (`string`, required): The term to search for in files.
  2. **path** (`string`, optional): The file or directory in which to search. If not provided, defaults to the current directory (i.e., `.`).
"""  # noqa: E501

_FINISH_DESCRIPTION = """
"A simple finish tool with a 'submit' command.\n\n"
"Notes about the `submit` command:\n"
"* When invoked with `--result`, the provided string is used for submitting required task results.\n"
"* If no `--result` is provided, it defaults to an empty string.\n\n"
"**Parameters:**\n"
"  1. **command** (`string`, required): The command to run. Currently allowed option is: `submit`.\n"
"     - Allowed value: [`submit`]\n"
"  2. **result** (`string`, optional): The result text to submit. Defaults to an empty string.\n"
"""


#: tool name -> upstream's OpenAI function schema, verbatim (key order included)
SCHEMAS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "search": {"type": "function", "function": {
        "name": "search", "description": _SEARCH_DESCRIPTION,
        "parameters": {"type": "object", "properties": {
            "search_term": {"description": "The term to search for in files.", "type": "string"},
            "path": {"description": "The file or directory to search in. Defaults to `.` if not specified.",
                     "type": "string"}},
            "required": ["search_term"]}}},
    "file_editor": {"type": "function", "function": {
        "name": "file_editor", "description": _FILE_EDITOR_DESCRIPTION,
        "parameters": {"type": "object", "properties": {
            "command": {"description": "The command to run. Allowed options are: `view`, `create`, `str_replace`, "
                                       "`insert`, `undo_edit`.",
                        "enum": ["view", "create", "str_replace", "insert", "undo_edit"], "type": "string"},
            "path": {"description": "Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`.",
                     "type": "string"},
            "file_text": {"description": "Required for the `create` command, contains the content of the file to be "
                                         "created.", "type": "string"},
            "old_str": {"description": "Required for the `str_replace` command, specifies the string in `path` to "
                                       "replace.", "type": "string"},
            "new_str": {"description": "Optional for the `str_replace` command to specify the replacement string. "
                                       "Required for the `insert` command to specify the string to insert.",
                        "type": "string"},
            "insert_line": {"description": "Required for the `insert` command. The `new_str` will be inserted AFTER "
                                           "the line specified.", "type": "integer"},
            "view_range": {"description": "Optional for the `view` command when `path` points to a file. Specifies "
                                          "the line range to view. E.g., [11, 12] shows lines 11 and 12. Indexing "
                                          "starts at 1. Use [start_line, -1] to show all lines from `start_line` to "
                                          "the end.", "type": "array", "items": {"type": "integer"}},
            "concise": {"description": "Optional for the `view` command. If `True`, displays a concise skeletal view "
                                       "of the file. Very useful for localization tasks. Highly recommended for large "
                                       "files.", "type": "boolean"}},
            "required": ["command", "path"]}}},
    "execute_bash": {"type": "function", "function": {
        "name": "execute_bash", "description": _BASH_DESCRIPTION,
        "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string", "description": "The command (and optional arguments) to execute. For example: "
                                                     "'python my_script.py'"}},
            "required": ["cmd"]}}},
    "finish": {"type": "function", "function": {
        "name": "finish", "description": _FINISH_DESCRIPTION,
        "parameters": {"type": "object", "properties": {
            "command": {"description": "The command to run. Currently only `submit` is supported.", "type": "string",
                        "enum": ["submit"]},
            "result": {"description": "Optional. The result text to submit. Defaults to an empty string if not "
                                      "provided.", "type": "string"}},
            "required": ["command"]}}},
})


def _given(**kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


async def run_r2e_tool(box: ContainerResource, call: ToolCall, *, bash_timeout: float, max_output: int,
                       env: Mapping[str, str] | None = None) -> str:
    """The observation of one checked R2E-Gym tool call (not ``finish``) run in ``box``.

    Args:
        box: the episode's container (``/testbed`` prepared, the tool script at ``TOOL_SCRIPT``).
        call: the call, checked and coerced (:func:`~.actions.check_call`).
        bash_timeout: seconds an ``execute_bash`` command may run (killed then); the editor and search get
            ``max(60, bash_timeout)``.
        max_output: characters of output kept.
        env: environment variables of the command (upstream images: their ``PATH``).

    Returns:
        The observation text, as R2E-Gym's tools write it (an error is an observation starting ``ERROR:``).

    Raises:
        ResourceError: the container died (from ``box.exec``).
    """
    env = dict(env or {})
    if call.name == "execute_bash":
        if "\x00" in call.arguments["cmd"]:  # no argv can hold it; both backends would raise deep inside
            return ("ERROR: the command contains a NUL byte (\\x00), which a shell command line cannot hold; "
                    "remove it and call execute_bash again.")
        r = await box.exec(["bash", "-c", call.arguments["cmd"]], timeout=bash_timeout, workdir=TESTBED, env=env,
                           max_output=max_output)
        if r.timed_out:
            return (f"The command took too long to execute (>{bash_timeout:g}s) and was killed.\n"
                    f"Partial output:\n{r.output}")
        return f"Exit code: {r.exit_code}\nExecution output of [execute_bash]:\n{r.output}"
    args = dict(call.arguments)
    if call.name == "search":
        args.setdefault("path", TESTBED)
    payload = json.dumps({"tool": call.name, "args": args}).encode("utf-8")
    b64 = base64.b64encode(payload).decode("ascii")
    if len(b64) <= _MAX_ARGV_PAYLOAD:
        argv = ["python3", TOOL_SCRIPT, b64]
    else:
        await box.put_files({f"{TOOLS_DIR}/payload.json": payload})
        argv = ["python3", TOOL_SCRIPT, "--file", f"{TOOLS_DIR}/payload.json"]
    r = await box.exec(argv, timeout=max(60.0, bash_timeout), workdir=TESTBED, env=env, max_output=max_output + 1000)
    if r.timed_out:
        return f"ERROR: the {call.name} tool did not finish within its time limit and was killed."
    if r.exit_code != 0:
        return f"ERROR: the {call.name} tool failed (exit {r.exit_code}):\n{r.output}"
    return f"Execution output of [{call.name}]:\n{r.output}"


def r2e_tools(spec: ContainerSpec, *, bash_timeout: float = 90.0, max_output: int = 10_000,
              env: Mapping[str, str] | None = None) -> list[Tool]:
    """R2E-Gym's four tools, in upstream's order (:data:`TOOL_NAMES`), running in the container of ``spec``.

    Each tool but ``finish`` declares ``resources={"box": spec}`` (rollout scope: the episode's container, the
    same on every turn); the R2E-Gym environment prepares that container at reset (``/testbed`` and the tool
    script).  Arguments are checked and coerced by R2E-Gym's rules (:func:`~.actions.check_call`; a bad one
    raises :class:`~.actions.ActionParseError`).  ``finish`` ends the episode (``finish=True``); the environment
    grades then.  No tool has a timeout of its own: ``execute_bash`` is killed after ``bash_timeout`` seconds.

    Args:
        spec: the container spec of the episode (e.g. ``R2EGymEnv.container_spec(task)``).
        bash_timeout, max_output: as :func:`run_r2e_tool`'s.
        env: environment variables of the tools' commands.

    Returns:
        ``[search, file_editor, execute_bash, finish]`` as :class:`~agentfly_gym.tools.Tool` objects; their
        ``schema`` is upstream R2E-Gym's function-calling definition (:data:`SCHEMAS`).
    """
    box_spec = MappingProxyType({"box": spec})

    async def run(name: str, args: dict[str, Any], box: ContainerResource) -> str:
        return await run_r2e_tool(box, check_call(name, args), bash_timeout=bash_timeout, max_output=max_output,
                                  env=env)

    async def search(search_term: str, box: ContainerResource, path: str | None = None) -> str:
        return await run("search", _given(search_term=search_term, path=path), box)

    async def file_editor(command: Literal["view", "create", "str_replace", "insert", "undo_edit"], path: str,
                          box: ContainerResource, file_text: str | None = None, old_str: str | None = None,
                          new_str: str | None = None, insert_line: int | None = None,
                          view_range: list[int] | None = None, concise: bool | None = None) -> str:
        return await run("file_editor", _given(command=command, path=path, file_text=file_text, old_str=old_str,
                                               new_str=new_str, insert_line=insert_line, view_range=view_range,
                                               concise=concise), box)

    async def execute_bash(cmd: str, box: ContainerResource) -> str:
        return await run("execute_bash", {"cmd": cmd}, box)

    def finish(command: Literal["submit"] = "submit", result: str | None = None) -> str | None:
        return result  # what a plain tool env scores; the R2E-Gym env grades instead

    fns = {"search": search, "file_editor": file_editor, "execute_bash": execute_bash, "finish": finish}
    return [Tool(fn=fns[name], name=name, description=SCHEMAS[name]["function"]["description"],
                 schema=SCHEMAS[name], resources=MappingProxyType({}) if name == "finish" else box_spec,
                 scope="rollout", timeout=None, finish=name == "finish") for name in TOOL_NAMES]
