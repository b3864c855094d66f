"""Tools from an MCP server: the tools a server lists become :class:`~agentfly_gym.tools.Tool` objects, and the
server is a pooled resource of the resource manager.

::

    from agentfly_gym.tools import make_tool_env
    from agentfly_gym.tools.mcp import mcp_server_spec, mcp_tools

    server = mcp_server_spec("python3", ["my_server.py"], max_instances=4)   # an MCP server over stdio
    env_id = make_tool_env("my/Mcp-v0", tasks=..., tools=mcp_tools(server), reward=...)

:func:`mcp_server_spec` gives an :class:`~agentfly_gym.resources.spec.InProcessSpec` whose instances are
:class:`MCPConnection` objects: one server subprocess each, with a live MCP client session (the ``mcp`` package's
``Client`` over ``StdioServerParameters``).  :func:`mcp_tools` starts the server once to list its tools; each
becomes a tool whose schema is the server's (name, description and ``inputSchema`` as the function's
``parameters``), whose arguments are checked against that schema, and whose calls go to the pooled server
acquired in the tool's scope (``"rollout"``: one server per rollout, the same on every turn, released when the
episode ends and reused by a later rollout as it is; ``"global"``: one server shared by everyone).  A result the
server marks as an error, or a server that fails, is an error message to the model; the episode goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError, ResourceStartError, ToolError
from ..resources.spec import InProcessSpec
from .tool import DEFAULT_TOOL_TIMEOUT, Tool, check_tools

__all__ = ["MCPConnection", "MCPToolError", "mcp_server_spec", "mcp_tools"]

_RESOURCE = "mcp_server"  # the keyword the server arrives under (not an MCP argument: see _call)


class MCPToolError(ToolError, RuntimeError):
    """The MCP server answered a tool call with an error result (``isError``); the message is its text."""


def _need_client() -> tuple[Any, Any]:
    try:
        from mcp import Client, StdioServerParameters
    except ImportError as e:  # the mcp package comes with openenv-core; an old one has no Client
        raise ConfigError(f"tools from an MCP server need the 'mcp' package (2.x, with mcp.Client): {e}") from None
    return Client, StdioServerParameters


class MCPConnection:
    """A live client session with an MCP server started as a subprocess over stdio, used synchronously.

    The session runs on an event loop of its own in a daemon thread (its streams and task group stay in the one
    task that opened them); :meth:`list_tools` and :meth:`call_tool` block the calling thread (the resource's
    worker thread, see :class:`~agentfly_gym.resources.inprocess.InProcessResource`) until the server answers.

    Args:
        command: the server's executable (e.g. ``"python3"``, ``"npx"``).
        args: its arguments.
        env: extra environment variables of the server (a mapping or pairs).
        cwd: its working folder.
        start_timeout: seconds the server may take to start and answer the handshake.

    Raises:
        ResourceStartError: the server did not start or answer within ``start_timeout``.
        ConfigError: the ``mcp`` package is missing.
    """

    def __init__(self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | Sequence | None = None,
                 cwd: str | None = None, start_timeout: float = 60.0) -> None:
        client_cls, params_cls = _need_client()
        self.command = command
        params = params_cls(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)
        self._client: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"afg-mcp-{command}", daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        try:
            self._submit(self._open(client_cls, params), start_timeout)
        except BaseException as e:
            self.close()
            if isinstance(e, (concurrent.futures.TimeoutError, TimeoutError)):
                raise ResourceStartError(f"MCP server {command!r} did not answer within {start_timeout} s") from None
            if isinstance(e, Exception) and not isinstance(e, (ConfigError, ResourceStartError)):
                raise ResourceStartError(f"MCP server {command!r} {list(args)} did not start: "
                                         f"{type(e).__name__}: {e}") from e
            raise

    def _submit(self, coro: Any, timeout: float | None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    async def _open(self, client_cls: Any, params: Any) -> None:
        self._stop = asyncio.Event()
        ready = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._serve(client_cls, params, ready))
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not ready.is_set():
            self._task.result()  # raises what stopped it
            raise ResourceStartError(f"MCP server {self.command!r} closed during the handshake")

    async def _serve(self, client_cls: Any, params: Any, ready: asyncio.Event) -> None:
        assert self._stop is not None
        async with client_cls(params) as client:
            self._client = client
            ready.set()
            await self._stop.wait()

    def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools as ``{"name", "description", "input_schema"}`` dicts, every page of the listing."""
        async def listing() -> list[dict[str, Any]]:
            out, cursor = [], None
            while True:
                page = await self._client.list_tools(cursor=cursor)
                out += [{"name": t.name, "description": t.description or "", "input_schema": dict(t.input_schema)}
                        for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    return out

        return self._submit(listing(), 120.0)

    def call_tool(self, name: str, arguments: Mapping[str, Any], timeout: float | None = None) -> tuple[str, bool]:
        """``(text, is_error)`` of calling tool ``name``: the text blocks of the result joined by newlines (other
        blocks named by their type), else its structured content as JSON.

        Raises:
            TimeoutError: no answer within ``timeout`` seconds.
        """
        async def call() -> tuple[str, bool]:
            result = await self._client.call_tool(name, dict(arguments))
            parts = []
            for block in result.content:
                text = getattr(block, "text", None)
                parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')} content]")
            if not parts and result.structured_content is not None:
                import json

                parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
            return "\n".join(parts), bool(result.is_error)

        try:
            return self._submit(call(), timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the MCP server gave no answer to {name!r} within {timeout} s") from None

    def healthy(self) -> bool:
        """Whether the session is still open (its server has not exited)."""
        return self._task is not None and not self._task.done() and self._thread.is_alive()

    def close(self) -> None:
        """End the session (the server subprocess is stopped) and the event loop's thread."""
        if self._loop.is_closed():
            return
        if self._stop is not None and self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._stop.set)
            try:
                asyncio.run_coroutine_threadsafe(asyncio.wait({self._task}, timeout=10.0), self._loop).result(15.0)
            except Exception:  # noqa: BLE001, S110  (a server that will not stop: the loop goes anyway)
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self._loop.close()


def mcp_server_spec(command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, max_instances: int | None = 4, isolation: str = "thread",
                    name: str | None = None, **spec_kwargs: Any) -> InProcessSpec:
    """The resource spec of an MCP server started as a subprocess over stdio (instances: :class:`MCPConnection`).

    Args:
        command, args, env, cwd: how to start the server.
        max_instances: servers alive at once for this spec (None: no cap).
        isolation: ``"thread"`` (the client lives in this process) or ``"process"`` (in a child process).
        name: a label in logs.
        spec_kwargs: further :class:`~agentfly_gym.resources.spec.InProcessSpec` fields (``max_idle_time``,
            ``start_timeout``, ...).

    Raises:
        ConfigError: a bad field.
    """
    if not isinstance(command, str) or not command:
        raise ConfigError(f"command={command!r} must be the MCP server's executable, e.g. 'python3'")
    kwargs = {"command": command, "args": tuple(str(a) for a in args), "env": tuple(sorted((env or {}).items())),
              "cwd": cwd}
    return InProcessSpec(factory=f"{__name__}:MCPConnection", kwargs=tuple(sorted(kwargs.items())),
                         max_instances=max_instances, isolation=isolation, name=name or f"mcp-{command}",
                         **spec_kwargs)


def _call(tool_name: str, timeout: float | None) -> Any:
    async def call(**kwargs: Any) -> str:
        server = kwargs.pop(_RESOURCE)
        text, is_error = await server.invoke(MCPConnection.call_tool, tool_name, kwargs, timeout)
        if is_error:
            raise MCPToolError(text)
        return text

    call.__name__ = call.__qualname__ = tool_name
    return call


def mcp_tools(server: InProcessSpec, *, names: Sequence[str] | None = None, scope: str = "rollout",
              timeout: float | None = DEFAULT_TOOL_TIMEOUT) -> list[Tool]:
    """The tools an MCP server lists, as :class:`~agentfly_gym.tools.Tool` objects that call the pooled server.

    The server is started once here to list its tools, then stopped; episodes acquire it from the resource
    manager (``scope``, see the module docstring).

    Args:
        server: the server's spec (:func:`mcp_server_spec`).
        names: only these tools (default: all the server lists).
        scope: ``"rollout"`` or ``"global"``.
        timeout: seconds one call may take.

    Returns:
        The tools, in the server's order; each ``schema`` is ``{"type": "function", "function": {"name",
        "description", "parameters": <the tool's inputSchema>}}``.

    Raises:
        ResourceStartError: the server did not start.
        ConfigError: a name in ``names`` that the server does not list, two tools with one name, a bad scope.
    """
    if not isinstance(server, InProcessSpec) or not server.factory.endswith(":MCPConnection"):
        raise ConfigError(f"server must be a spec from mcp_server_spec(...), got {server!r:.120}")
    if scope not in ("rollout", "global"):
        raise ConfigError(f"scope={scope!r} must be 'rollout' or 'global'")
    conn = MCPConnection(**server.factory_kwargs)
    try:
        listed = conn.list_tools()
    finally:
        conn.close()
    if names is not None:
        unknown = sorted(set(names) - {t["name"] for t in listed})
        if unknown:
            raise ConfigError(f"the MCP server lists no tool(s) {unknown}; it lists {[t['name'] for t in listed]}")
        listed = [t for t in listed if t["name"] in set(names)]
    tools = []
    for t in listed:
        params = dict(t["input_schema"]) or {"type": "object", "properties": {}}
        schema = {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": params}}
        tools.append(Tool(fn=_call(t["name"], timeout), name=t["name"], description=t["description"], schema=schema,
                          resources={_RESOURCE: server}, scope=scope, timeout=timeout))
    return check_tools(tools)
