"""Access to the Docker engine: docker-py imported on first use, the :class:`DockerEngine` every
manager owns (one client, one thread pool: every docker-py call blocks, so none runs on the event
loop; the disk watchdog), the availability probe, and the reader of an exec's output stream (the
Engine API's multiplexed stream).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ....errors import ResourceUnavailable

if TYPE_CHECKING:
    from .watchdog import DiskWatchdog

__all__ = ["DockerEngine", "docker_available", "docker_module", "exec_start_frames"]

_probe: bool | None = None  # whether an engine answered this process's last probe (None: not probed yet)


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


class DockerEngine:
    """One resource manager's access to the Docker engine (its ``services.get(DockerEngine)``).

    Holds, each made on first use: the docker-py client (64 pooled connections), the thread pool every
    blocking docker-py call runs on (64 threads), the disk watchdog (:class:`.watchdog.DiskWatchdog`), and
    what was learnt about the engine (whether it accepts ``storage_opt size``, whether a writable layer can
    be loop-mounted here).  :meth:`close` (the manager's ``aclose``/``close``, after its instances are
    gone) stops the threads and closes the client.

    A forked child (a worker of Gymnasium's ``AsyncVectorEnv``) does not use its parent's engine: it runs its
    environments on a loop and a default manager of its own (:mod:`agentfly_gym.utils.aio`), and a pool
    bound to the parent's loop refuses the child's (``EventLoopMismatch``).

    Attributes:
        storage_opt_ok: whether the engine accepts ``storage_opt size`` (None: not tried yet).
        layer_volume_ok: whether a container's writable layer can be loop-mounted here (None: not tried yet).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._watchdog: DiskWatchdog | None = None
        self.storage_opt_ok: bool | None = None
        self.layer_volume_ok: bool | None = None

    def client(self) -> Any:
        """The docker-py client (made on first use).

        Raises:
            ResourceUnavailable: docker-py is missing or no Docker engine is configured here.
        """
        with self._lock:
            if self._client is None:
                docker = docker_module()
                try:
                    self._client = docker.from_env(timeout=120, max_pool_size=64)
                except docker.errors.DockerException as e:
                    raise ResourceUnavailable(f"no Docker engine configured here: {e}") from e
            return self._client

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread pool for blocking engine calls (made on first use)."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="afg-docker")
            return self._pool

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on :meth:`pool`, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.pool(), lambda: fn(*args))

    def watchdog(self) -> DiskWatchdog:
        """The disk watchdog (its thread starts with the first container it watches)."""
        from .watchdog import DiskWatchdog

        with self._lock:
            if self._watchdog is None:
                self._watchdog = DiskWatchdog(self)
            return self._watchdog

    def close(self) -> None:
        """Stop the watchdog and the thread pool (work already submitted finishes), close the client.
        Idempotent, never raises; a later call of a method makes them again."""
        with self._lock:
            client, pool, watchdog = self._client, self._pool, self._watchdog
            self._client = self._pool = self._watchdog = None
        if watchdog is not None:
            watchdog.close()
        if pool is not None:
            pool.shutdown(wait=False)  # queued work still runs: its awaiters get their results
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing pooled connections is best effort
                pass


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


_FRAME_HEADER = struct.Struct(">BxxxL")  # stream type (0 stdin, 1 stdout, 2 stderr), 3 zero bytes, payload size


def exec_start_frames(api: Any, exec_id: str) -> Iterator[bytes]:
    """Start an exec (attached, no TTY) and yield its output frames' payloads, stdout and stderr interleaved.

    docker-py's ``exec_start(stream=True)`` reads the upgraded connection from the raw socket
    (``response.raw._fp.fp.raw``), which skips whatever ``http.client`` already buffered while reading
    the response headers.  When a command's output arrives in the same read as the headers (a fast
    command on a loaded machine) it is silently lost: the exec reports exit 0 with empty output
    (docker/docker-py issues 425 and 3332; measured here: 28-35 of 1,500 execs of ``echo`` under CPU
    load).  This reads the same connection through its buffered reader instead, so nothing is skipped.
    The stream format is the Docker Engine API's multiplexed stream ("Attach to a container",
    stream format: an 8-byte header ``[type, 0, 0, 0, size (big-endian uint32)]`` then ``size`` bytes).

    Raises:
        docker.errors.APIError / NotFound: as ``exec_start`` (the exec or container is gone).
    """
    res = api._post_json(api._url("/exec/{0}/start", exec_id), headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                         data={"Tty": False, "Detach": False}, stream=True)
    try:
        api._raise_for_status(res)
        reader = res.raw._fp.fp  # the BufferedReader over the upgraded socket (docker-py takes its .raw)
        # a command may stay silent for longer than the client's request timeout: block like docker-py's
        # poll()-based reads do (the exec's own timeout, or a cancellation, ends the stream)
        reader.raw._sock.settimeout(None)
        while True:
            header = reader.read(_FRAME_HEADER.size)
            if len(header) < _FRAME_HEADER.size:
                return
            _, size = _FRAME_HEADER.unpack(header)
            payload = reader.read(size) if size else b""
            if payload:
                yield payload
            if len(payload) < size:
                return
    finally:
        res.close()
