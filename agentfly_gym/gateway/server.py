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
import os
import socket
import stat
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigError

__all__ = ["bind_socket", "bind_unix_socket", "check_host", "serve_gateway"]


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
    from ..limits import check_int

    port = check_int("port", port, minimum=0, maximum=65535)
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


def bind_unix_socket(path: str | os.PathLike) -> socket.socket:
    """A listening Unix socket at ``path`` (its folder must exist; a stale socket there is replaced), mode 0666:
    sandboxes run as an unprivileged host user of their own, so they must be able to connect; that opens it to
    the host's local users as far as the folder lets them, as the TCP port on 127.0.0.1 is (the session keys
    guard every session either way; keep the folder private to limit who reaches it).

    Raises:
        ConfigError: ``path`` exists and is not a socket, or cannot be bound.
    """
    p = os.fspath(path)
    if os.path.lexists(p):
        if not stat.S_ISSOCK(os.lstat(p).st_mode):
            raise ConfigError(f"uds={p!r} exists and is not a socket")
        os.unlink(p)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(p)
        os.chmod(p, 0o666)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot bind the Unix socket {p!r}: {e}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve_gateway(gateway: Any, *, host: str = "127.0.0.1", port: int = 0, allow_remote: bool = False,
                        uds: str | os.PathLike | None = None) -> AsyncIterator[str]:
    """Serve ``gateway.app`` on ``host:port`` in the running event loop; yields the root URL once it accepts
    connections, and stops the server (open sessions are closed) when the block exits.

    ``uds`` also serves it on a Unix socket at that path (removed at exit): the way into a sandbox, whose network
    namespace cannot reach the host's loopback; mount the socket's folder into the container
    (:func:`~.command.command_agent` relays a port inside to it).

    Raises:
        ConfigError: a non-loopback ``host`` without ``allow_remote``, or an address that cannot be bound.
    """
    import uvicorn

    from ..bridges.uvicorn_server import started_server

    check_host(host, allow_remote=allow_remote)
    sock = bind_socket(host, port)
    sockets = [sock]
    if uds is not None:
        try:
            sockets.append(bind_unix_socket(uds))
        except ConfigError:
            sock.close()
            raise
    ready = asyncio.Event()
    server = started_server(uvicorn.Config(gateway.app, log_level="warning", lifespan="off", timeout_keep_alive=30),
                            on_started=ready.set)
    task = asyncio.create_task(server.serve(sockets=sockets), name="agentfly-gateway")
    try:
        done, _ = await asyncio.wait({task, asyncio.ensure_future(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
            raise ConfigError(f"the gateway did not start on {host}:{port}")
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        yield f"http://{shown}:{bound[1]}"
    finally:
        for session in gateway.sessions.values():
            session.close()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        for s in sockets:
            s.close()
        if uds is not None:
            with contextlib.suppress(OSError):
                os.unlink(uds)
