"""Access to the Docker engine: docker-py imported on first use, the :class:`DockerEngine` every
manager owns (one client, one thread pool: every docker-py call blocks, so none runs on the event
loop; the disk watchdog), and the availability probe.  An exec's output is read by
:mod:`.exec_stream` (the Engine API over the engine's socket).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ....errors import ResourceUnavailable

if TYPE_CHECKING:
    from .watchdog import DiskWatchdog

__all__ = ["DockerEngine", "ENGINE_THREADS", "docker_available", "docker_module"]

#: Threads (and pooled connections) for blocking engine calls.  An exec holds one for the whole command, so
#: with 64 (the former size) 64 rollouts running long commands made every container start, removal and
#: file copy wait for one of them to end; threads are started only as calls need them.
ENGINE_THREADS = 512
#: Parked instances refreshed (restarted or replaced) in the background at once; see ``DockerEngine.park_pool``.
PARK_THREADS = 2

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

    Holds, each made on first use: the docker-py client (:data:`ENGINE_THREADS` pooled connections), the thread
    pool every blocking docker-py call runs on (as many threads, started as needed), the disk watchdog (:class:`.watchdog.DiskWatchdog`), and
    what was learnt about the engine (whether it accepts ``storage_opt size``, whether a writable layer can
    be loop-mounted here).  :meth:`close` (the manager's ``aclose``/``close``, after its instances are
    gone) stops the threads and closes the client.

    A forked child (a worker of Gymnasium's ``AsyncVectorEnv``) does not use its parent's engine: it runs its
    environments on a loop and a default manager of its own (:mod:`agentfly_gym.utils.aio`), and a pool
    bound to the parent's loop refuses the child's (``EventLoopMismatch``).

    Attributes:
        storage_opt_ok: whether the engine accepts ``storage_opt size`` (None: not tried yet).
        layer_volume_ok: whether a container's writable layer can be loop-mounted here (None: not tried yet).
        restart_in_place_ok: whether this process sees the engine's mounts, so that a container can be made fresh
            by a restart with its writable layer emptied instead of a new container (None: not tried yet).
        hosts_bind_ok: whether the engine can bind this host's ``hosts`` file (False: a remote engine, whose containers
            without a network then use ``--network none``; None: not refused yet).
        image_facts: (image id, user) -> what a container's setup script found in that image (whether it has
            ``timeout``; the user's uid and gid), so that later containers of the image skip the script.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._park_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._watchdog: DiskWatchdog | None = None
        self.storage_opt_ok: bool | None = None
        self.layer_volume_ok: bool | None = None
        self.restart_in_place_ok: bool | None = None
        self.hosts_bind_ok: bool | None = None
        self.image_facts: dict[tuple[str, str | None], dict[str, str]] = {}

    def client(self) -> Any:
        """The docker-py client (made on first use).

        Raises:
            ResourceUnavailable: docker-py is missing or no Docker engine is configured here.
        """
        with self._lock:
            if self._client is None:
                docker = docker_module()
                try:
                    self._client = docker.from_env(timeout=120, max_pool_size=ENGINE_THREADS)
                except docker.errors.DockerException as e:
                    raise ResourceUnavailable(f"no Docker engine configured here: {e}") from e
            return self._client

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread pool for blocking engine calls (made on first use)."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=ENGINE_THREADS, thread_name_prefix="afg-docker")
            return self._pool

    def park_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread pool of parked instances' background refreshes: :data:`PARK_THREADS` at a time, so that a batch
        of instances going idle at once (the end of a rollout batch) does not compete, as a burst of container starts,
        with the rollouts still running; an acquisition of an instance whose refresh has not begun does it at once
        (the refresh is cancelled here)."""
        with self._lock:
            if self._park_pool is None:
                self._park_pool = concurrent.futures.ThreadPoolExecutor(max_workers=PARK_THREADS,
                                                                        thread_name_prefix="afg-docker-park")
            return self._park_pool

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
            park_pool, self._park_pool = self._park_pool, None
            self._client = self._pool = self._watchdog = None
        if watchdog is not None:
            watchdog.close()
        if park_pool is not None:
            park_pool.shutdown(wait=False, cancel_futures=True)  # refreshes not begun are dropped: nobody needs them
        if pool is not None:
            pool.shutdown(wait=False)  # queued work still runs: its awaiters get their results
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110 - closing pooled connections is best effort
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
    except Exception:  # noqa: BLE001 - any failure to ping: no engine here
        ok = False
    _probe = ok
    return ok
