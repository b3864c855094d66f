"""R2E-Gym's tools as tools of ``agentfly_gym.tools`` and its native tool-call format, on a real local
task (the fixture repository ``minicalc-bug1``) in a real bubblewrap sandbox container (image "host"):

* the tools' schemas are upstream R2E-Gym's function-calling definitions (copied below from
  ``r2egym/agenthub/tools/__init__.py`` as the reference);
* one scripted sequence of calls gives the same observations and reward in XML and in native format;
* the expert scores 1.0 in each native family format, as in XML;
* native faults are observations (no call, a malformed call, an unknown tool, bad arguments);
* a chain rollout on the Qwen3 tokenizer renders the tools with the template and appends results as
  ``role: "tool"`` messages (no model needed: the env's expert plays).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentfly_gym.envs.r2egym import R2EGymEnv
from agentfly_gym.envs.r2egym.tools import TOOL_NAMES, r2e_tools
from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.resources.spec import ContainerSpec
from agentfly_gym.tools import Tool, format_tool_call, parse_tool_calls

FIXTURES = Path(__file__).parent / "fixtures" / "r2e"
OPS = "/testbed/minicalc/ops.py"
SANDBOX = {"backend": "sandbox", "image": "host"}

# upstream R2E-Gym's definitions (src/r2egym/agenthub/tools/__init__.py at 69bc953), verbatim
_EDITOR = """Custom editing tool for viewing, creating and editing files
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
_BASH = """
Description: Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. For example: `python my_script.py`
"""
_SEARCH = """
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
_FINISH = """
"A simple finish tool with a 'submit' command.\n\n"
"Notes about the `submit` command:\n"
"* When invoked with `--result`, the provided string is used for submitting required task results.\n"
"* If no `--result` is provided, it defaults to an empty string.\n\n"
"**Parameters:**\n"
"  1. **command** (`string`, required): The command to run. Currently allowed option is: `submit`.\n"
"     - Allowed value: [`submit`]\n"
"  2. **result** (`string`, optional): The result text to submit. Defaults to an empty string.\n"
"""
UPSTREAM = [
    {"type": "function", "function": {"name": "search", "description": _SEARCH, "parameters": {
        "type": "object", "properties": {
            "search_term": {"description": "The term to search for in files.", "type": "string"},
            "path": {"description": "The file or directory to search in. Defaults to `.` if not specified.",
                     "type": "string"}},
        "required": ["search_term"]}}},
    {"type": "function", "function": {"name": "file_editor", "description": _EDITOR, "parameters": {
        "type": "object", "properties": {
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
    {"type": "function", "function": {"name": "execute_bash", "description": _BASH, "parameters": {
        "type": "object", "properties": {
            "cmd": {"type": "string", "description": "The command (and optional arguments) to execute. For example: "
                                                     "'python my_script.py'"}},
        "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "finish", "description": _FINISH, "parameters": {
        "type": "object", "properties": {
            "command": {"description": "The command to run. Currently only `submit` is supported.", "type": "string",
                        "enum": ["submit"]},
            "result": {"description": "Optional. The result text to submit. Defaults to an empty string if not "
                                      "provided.", "type": "string"}},
        "required": ["command"]}}},
]

# (no value starts or ends with a newline: R2E-Gym's XML drops one there, JSON keeps it)
FIX = {"command": "str_replace", "path": OPS, "old_str": '"""Return a + b."""\n    return a - b',
       "new_str": '"""Return a + b."""\n    return a + b'}
#: one episode's calls: look, search, a refused edit, the fix, run the code, finish
SCRIPT = [
    ("file_editor", {"command": "view", "path": OPS}),
    ("file_editor", {"command": "view", "path": OPS, "view_range": [5, 6]}),
    ("search", {"search_term": "return a"}),
    ("file_editor", {"command": "str_replace", "path": OPS, "old_str": "return a - b", "new_str": "return a + b"}),
    ("file_editor", FIX),
    ("execute_bash", {"cmd": "python3 -c 'import minicalc; print(minicalc.add(2, 3))'"}),
    ("finish", {"command": "submit"}),
]


def _xml(name: str, args: dict) -> str:
    body = "".join(f"<parameter={k}>{json.dumps(v) if isinstance(v, list) else v}</parameter>\n"
                   for k, v in args.items())
    return f"<function={name}>\n{body}</function>"


@pytest.fixture
async def manager():
    m = ResourceManager()
    yield m
    await m.aclose()


def _env(manager, **kw) -> R2EGymEnv:
    return R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", manager=manager, **SANDBOX, **kw)


def test_the_tools_are_tools_of_the_layer_with_upstreams_schemas():
    spec = ContainerSpec(image="host", backend="sandbox")
    tools = r2e_tools(spec)
    assert all(isinstance(t, Tool) for t in tools)
    assert tuple(t.name for t in tools) == TOOL_NAMES
    assert [json.dumps(t.schema) for t in tools] == [json.dumps(u) for u in UPSTREAM]  # key order too
    for t in tools:  # the container comes as a rollout-scoped resource; finish needs none and ends the episode
        assert (dict(t.resources), t.scope, t.finish) == (({}, "rollout", True) if t.name == "finish" else
                                                           ({"box": spec}, "rollout", False))
    assert R2EGymEnv.agent_prompt.tools == ()  # the XML default offers no native tools


async def test_native_calls_observe_and_score_as_xml(manager):
    """The same calls, in XML and as native Hermes calls: identical observations, step by step, and reward 1.0;
    each native result is a role "tool" message answering its call."""
    xml_env, native_env = _env(manager), _env(manager, tool_format="native")
    assert native_env.agent_prompt.tools
    assert [s["function"]["name"] for s in native_env.agent_prompt.tools] == list(
        TOOL_NAMES)
    await xml_env.areset(options={"task_id": "minicalc-bug1"})
    await native_env.areset(options={"task_id": "minicalc-bug1"})
    for k, (name, args) in enumerate(SCRIPT):
        xo, xr, xterm, xtrunc, xi = await xml_env.astep(_xml(name, args))
        reply = f"I will call {name}.\n" + format_tool_call(name, args)
        no, nr, nterm, ntrunc, ni = await native_env.astep(reply)
        assert (no, nr, nterm, ntrunc) == (xo, xr, xterm, xtrunc), (name, no, xo)
        assert (ni["error"], ni["tool"]) == (None, name)
        assert ni["tool_messages"] == [{"role": "tool", "name": name, "tool_call_id": f"{k + 1:05d}0000", "content": no}]
        assert native_env.agent_prompt.turn_messages(no, ni) == ni["tool_messages"]
        assert "tool_messages" not in xi
    assert (nr, nterm, "Submitted" in no) == (1.0, True, True)
    await xml_env.aclose()
    await native_env.aclose()


@pytest.mark.parametrize("tool_format", ["native", "llama3", "mistral"])
async def test_the_expert_scores_one_in_each_native_format(manager, tool_format):
    env = _env(manager, tool_format=tool_format)
    await env.areset(options={"task_id": "minicalc-bug1"})
    first = await env.expert_action()
    assert parse_tool_calls(first, "auto")[0].name == "execute_bash"
    assert "<function=" not in first
    obs, reward, term, trunc, info = await env.astep(first)
    assert (reward, term, info["tool"]) == (0.0, False, "execute_bash")
    assert info["tool_messages"]
    obs, reward, term, trunc, info = await env.astep(await env.expert_action())
    assert (reward, term, trunc, info["tool"], info["error"]) == (1.0, True, False, "finish", None), obs
    await env.aclose()


async def test_native_faults_are_observations(manager):
    env = _env(manager, tool_format="native", max_episode_steps=10)
    await env.areset(options={"task_id": "minicalc-bug1"})

    async def step(reply: str):
        o, r, term, trunc, info = await env.astep(reply)
        assert (r, term, trunc, info["error"]) == (0.0, False, False, None), o
        return o, info

    # no call: the error goes back as a user message (no call to answer), and names the native format
    o, info = await step("I think the bug is in ops.py.")
    assert o.startswith("ERROR: could not parse the tool call: no tool call found")
    assert "<tool_call>" in o
    assert "tool_messages" not in info
    assert env.agent_prompt.turn_messages(o, info)[0]["role"] == "user"
    # XML is not a native call
    o, info = await step(_xml("execute_bash", {"cmd": "ls"}))
    assert "no tool call found" in o
    assert info["tool"] is None
    # a malformed call
    o, info = await step('<tool_call>\n{"name": "execute_bash", "arguments": {"cmd": </tool_call>')
    assert o.startswith("ERROR: could not parse the tool call")
    assert "not valid JSON" in o
    assert "tool_messages" not in info
    # an unknown tool and bad arguments: answered by a tool message, the episode goes on
    o, info = await step(format_tool_call("rm_rf", {}))
    assert "unknown tool 'rm_rf'" in o
    assert info["tool_messages"][0]["name"] == "rm_rf"
    o, info = await step(format_tool_call("file_editor", {"command": "explode", "path": OPS}))
    assert "command='explode' is not one of" in o
    assert info["tool_messages"][0]["content"] == o
    o, info = await step(format_tool_call("execute_bash", {"cmd": "ls", "sudo": True}))
    assert "has no parameter(s) ['sudo']" in o
    o, info = await step('<tool_call>\n{"name": "execute_bash", "arguments": ["ls"]}\n</tool_call>')
    assert "must be a JSON object" in o
    o, info = await step('<tool_call>\n{"name": "execute_bash", "arguments": {"cmd": "echo \\ud800"}}\n</tool_call>')
    assert "lone surrogate" in o
    # two calls in one reply: only the first runs (upstream's agent keeps only the first call)
    o, info = await step(format_tool_call("execute_bash", {"cmd": "echo one"}) +
                         format_tool_call("execute_bash", {"cmd": "echo two"}))
    assert "one" in o
    assert "two" not in o
    assert len(info["tool_calls"]) == 2
    assert len(info["tool_messages"]) == 1
    await env.aclose()


def test_bad_tool_format_is_refused():
    with pytest.raises(ConfigError, match="tool_format='json' is not one of"):
        R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", tool_format="json", **SANDBOX)


@pytest.mark.slow
async def test_chain_rollout_renders_the_tools_natively(manager, test_data):
    """A chain on the Qwen3 tokenizer: the prompt renders the four tools through the template (``<tools>``), each
    result is appended as a ``<tool_response>`` (role "tool"), the expert's replies stay its sampled ids."""
    from transformers import AutoTokenizer

    from agentfly_gym.rollout.chain import run_chain_episode
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.policies.baselines import ExpertPolicy

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"),
                         chat_template_kwargs={"enable_thinking": False})
    env = _env(manager, tool_format="native")
    traj = await run_chain_episode(env, ExpertPolicy(), chat, max_turns=4, seed=0, options={"task_id": "minicalc-bug1"})
    assert (traj.reward, traj.status, len(traj.turns)) == (1.0, "complete", 2)
    tok = chat.tokenizer
    prompt = tok.decode(traj.prompt_ids)
    assert "<tools>" in prompt
    assert all(f'"name": "{n}"' in prompt for n in TOOL_NAMES)
    response = tok.decode(traj.response_ids)
    assert "<tool_response>\nExit code: 0" in response
    assert response.count("<tool_call>") == 2
    replies = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    sampled = [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
    assert tok.decode(sampled) == "".join(r + "<|im_end|>" for r in replies)  # mask 1 exactly on the replies
    assert traj.messages[3]["role"] == "tool"
    assert traj.messages[3]["name"] == "execute_bash"
    await env.aclose()
