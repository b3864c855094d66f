"""Running a :class:`~.app.Gateway` with uvicorn inside the caller's event loop.

::

    gateway = Gateway(policy, chat)
    async with serve_gateway(gateway, port=0) as url:      # "http://127.0.0.1:PORT"
        session = gateway.open_session()
        client = openai.AsyncOpenAI(base_url=f"{url}/sessions/{session.id}/v1", api_key=session.api_key)

The socket is bound before uvicorn starts (``port=0`` picks a free port, no race), on a loopback address unless
``allow_remote`` says otherwise: the gateway answers whoever reaches it with a valid key, and the agents it serves
run code the model wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigError

__all__ = ["bind_socket", "check_host", "serve_gateway"]


def check_host(host: str, *, allow_remote: bool = False) -> None:
    """Refuse a non-loopback ``host`` unless ``allow_remote``.

    Raises:
        ConfigError: ``host`` is not a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``).
    """
    if allow_remote or host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"host={host!r} is not a loopback address; the gateway binds 127.0.0.1 (or ::1) unless "
                          "allow_remote is set (every rollout's agent can reach what it binds)")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (``port`` 0: a free one).

    Raises:
        ConfigError: the address cannot be bound (in use, bad port).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port={port!r} must be an integer in [0, 65535]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot bind {host}:{port}: {e}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve_gateway(gateway: Any, *, host: str = "127.0.0.1", port: int = 0,
                        allow_remote: bool = False) -> AsyncIterator[str]:
    """Serve ``gateway.app`` on ``host:port`` in the running event loop; yields the root URL once it accepts
    connections, and stops the server (open sessions are closed) when the block exits.

    Raises:
        ConfigError: a non-loopback ``host`` without ``allow_remote``, or an address that cannot be bound.
    """
    import uvicorn

    from ..bridges.uvicorn_server import started_server

    check_host(host, allow_remote=allow_remote)
    sock = bind_socket(host, port)
    ready = asyncio.Event()
    server = started_server(uvicorn.Config(gateway.app, log_level="warning", lifespan="off", timeout_keep_alive=30),
                            on_started=ready.set)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="agentfly-gateway")
    try:
        done, _ = await asyncio.wait({task, asyncio.ensure_future(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
            raise ConfigError(f"the gateway did not start on {host}:{port}")
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        yield f"http://{shown}:{bound[1]}"
    finally:
        for s in gateway.sessions.values():
            s.close()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        sock.close()
