"""Tools from an MCP server, against a real MCP server over stdio: a small server written here
with the ``mcp`` package's ``MCPServer``, started as a subprocess by the resource manager's pool."""

from __future__ import annotations

import sys
import textwrap

import gymnasium
import pytest

from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.tools import make_tool_env
from agentfly_gym.tools.mcp import mcp_server_spec, mcp_tools

pytest.importorskip("mcp")

SERVER = '''
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("calc")
calls = []


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def count() -> int:
    """How many times this server was called before (its state)."""
    calls.append(1)
    return len(calls) - 1


@app.tool()
def explode(why: str) -> str:
    """Raise an error."""
    raise ToolError("boom: " + why)


app.run()
'''


def _call(name: str, args: dict) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "calc_server.py"
    path.write_text(textwrap.dedent(SERVER))
    return mcp_server_spec(sys.executable, [str(path)], max_instances=2)


@pytest.mark.slow
def test_the_servers_tools_become_tools(server):
    tools = mcp_tools(server)
    assert [t.name for t in tools] == ["add", "count", "explode"]
    add = tools[0]
    assert add.description == "Add two integers."
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert dict(add.resources) == {"mcp_server": server}
    with pytest.raises(ConfigError, match="lists no tool"):
        mcp_tools(server, names=["sub"])


async def test_an_env_calls_the_pooled_server(server):
    """One server per rollout (the same on every turn: its state carries), errors are observations, the answer
    is scored; the pool holds the server, which the manager stops at the end."""
    env_id = make_tool_env("test/Mcp-v0", tasks=[{"prompt": "What is 2+3?", "answer": "5"}], tools=mcp_tools(server),
                           reward=lambda completion, answer, **row: float(answer in completion))
    async with ResourceManager() as manager:
        env = gymnasium.make(env_id, manager=manager).unwrapped
        await env.areset(seed=0)
        obs, reward, term, trunc, info = await env.astep(_call("add", {"a": 2, "b": 3}))
        assert (obs, reward, term, info["tool_errors"]) == ("5", 0.0, False, 0)
        obs, *_ = await env.astep(_call("count", {}) + _call("count", {}))
        assert sorted(obs.split("\n")) == ["0", "1"]  # one server, two calls
        obs, *_, info = await env.astep(_call("add", {"a": "two", "b": 3}))
        assert "bad argument 'a'" in obs
        assert info["tool_errors"] == 1
        obs, *_, info = await env.astep(_call("explode", {"why": "test"}))
        assert "MCPToolError" in obs
        assert "boom: test" in obs
        assert info["tool_errors"] == 1
        obs, reward, term, trunc, info = await env.astep("The answer is 5.")
        assert (reward, term, info["error"]) == (1.0, True, None)
        # the next rollout gets the pooled server back, as it is (its state carried over)
        await env.areset(seed=0)
        obs, *_ = await env.astep(_call("count", {}))
        assert obs == "2"
        await env.aclose()
