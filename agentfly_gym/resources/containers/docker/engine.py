"""Access to the Docker engine: docker-py imported on first use, one client and one thread pool
per process (every docker-py call blocks, so none runs on the event loop), and the availability probe.
An exec's output is read by :mod:`.exec_stream` (the Engine API over the engine's socket).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any

from ....errors import ResourceUnavailable

__all__ = ["docker_available", "docker_module", "docker_pool", "get_client", "in_thread"]

_client_lock = threading.Lock()
_client: Any = None
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_probe: bool | None = None


def _forget_parent_pool() -> None:
    """In a forked child (a worker of Gymnasium's ``AsyncVectorEnv``): the parent's pool threads do not exist
    here, yet the copied executor counts them as idle and would queue work that nobody runs; and the client's
    pooled connections are the parent's sockets.  Start both afresh on first use."""
    global _client_lock, _client, _pool
    _client_lock = threading.Lock()
    _client = _pool = None


os.register_at_fork(after_in_child=_forget_parent_pool)


def docker_module():
    """The ``docker`` (docker-py) module, imported on first use.

    Raises:
        ResourceUnavailable: docker-py is not installed.
    """
    try:
        import docker
    except ImportError as e:
        raise ResourceUnavailable("the docker backend needs docker-py: pip install 'agentfly-gym[docker]'") from e
    return docker


def get_client() -> Any:
    """The process-wide docker-py client (created on first use, 64 pooled connections)."""
    global _client
    with _client_lock:
        if _client is None:
            docker = docker_module()
            try:
                _client = docker.from_env(timeout=120, max_pool_size=64)
            except docker.errors.DockerException as e:
                raise ResourceUnavailable(f"no Docker engine configured here: {e}") from e
        return _client


def docker_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _client_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="afg-docker")
        return _pool


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(docker_pool(), lambda: fn(*args))


def docker_available(*, refresh: bool = False) -> bool:
    """Whether a Docker engine answers a ping (cached per process; ``refresh=True`` probes again).

    Blocking, at most ~3 seconds.  Never raises.
    """
    global _probe
    if _probe is not None and not refresh:
        return _probe
    try:
        docker = docker_module()
        c = docker.from_env(timeout=3)
        try:
            ok = bool(c.ping())
        finally:
            c.close()
    except Exception:
        ok = False
    _probe = ok
    return ok
