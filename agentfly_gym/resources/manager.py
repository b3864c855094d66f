"""The resource manager of one process: one pool per spec key, rollout scopes and global scope.

    manager = ResourceManager()
    async with manager.scope("rollout-17") as scope:
        box = await scope.acquire(ContainerSpec(image="agentfly/r2e-base"))
        same = await scope.acquire(ContainerSpec(image="agentfly/r2e-base"))   # same instance
    # everything acquired in the scope is released here, also on error or cancellation
    judge = await manager.acquire_global(ModelAPISpec(base_url=..., model=...))
    await manager.aclose()

It keeps the :class:`~agentfly_gym.resources.protocol.Manager` contract, as the Ray manager does; scopes are
:mod:`agentfly_gym.resources.scope`, the manager a process uses by default is
:func:`agentfly_gym.resources.select.default_manager`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import PoolClosedError
from . import teardown
from .backends import create_resource
from .base import Resource
from .containers.ownership import LABEL, owner_labels
from .pool import ResourcePool
from .services import Services
from .protocol import Manager
from .spec import ResourceSpec

__all__ = ["ResourceManager"]

log = logging.getLogger(__name__)


class ResourceManager(Manager):
    """Owns the pools of every resource kind; hands out rollout and global leases.

    Args:
        manager_id: labels every resource this manager starts (containers carry it as a
            Docker label so orphans can be reaped); ``"afg-<pid>-<hex>"`` by default.
        acquire_timeout: default seconds an acquisition may wait on a saturated pool.
        backend_factory: ``(spec, labels) -> Resource`` (unstarted); defaults to the backend
            registry, :func:`agentfly_gym.resources.backends.create_resource`.

    Attributes:
        labels: the ownership labels computed once for every resource this manager builds (see
            :func:`agentfly_gym.resources.containers.ownership.owner_labels`); each resource also
            gets ``agentfly.pool=<spec key>``.
        services: what this manager's backends share (the Docker client, its thread pool and disk
            watchdog; :mod:`agentfly_gym.resources.services`), closed with the manager.

    One manager belongs to one event loop.  Use it as ``async with ResourceManager() as m``
    or call :meth:`aclose`; at interpreter exit and on SIGTERM, the instances it built that are
    still live are torn down synchronously (:mod:`agentfly_gym.resources.teardown`).
    """

    def __init__(self, *, manager_id: str | None = None, acquire_timeout: float | None = None,
                 backend_factory: Callable[[ResourceSpec, dict[str, str]], Resource] | None = None) -> None:
        self.id = manager_id or f"afg-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.acquire_timeout = acquire_timeout
        self.labels: dict[str, str] = owner_labels(self.id)
        self._backend_factory = backend_factory or create_resource
        self._pools: dict[str, ResourcePool] = {}
        self._globals: dict[str, Resource] = {}
        self._global_locks: dict[str, asyncio.Lock] = {}
        self._global_users: dict[str, weakref.WeakSet[Any]] = {}  # spec key -> who holds the global now
        self._global_timers: dict[str, asyncio.TimerHandle] = {}  # spec key -> its release, once nobody holds it
        self._global_releases: set[asyncio.Task] = set()
        self._instances: weakref.WeakSet[Resource] = weakref.WeakSet()  # every instance built, until collected
        self.services = Services()
        self._closed = False
        teardown.watch(self)

    # -- pools
    def pool(self, spec: ResourceSpec) -> ResourcePool:
        """The pool for ``spec.key``, created on first use."""
        if self._closed:
            raise PoolClosedError(f"resource manager {self.id} is closed")
        pool = self._pools.get(spec.key)
        if pool is None:
            pool = ResourcePool(spec, self.build_resource, acquire_timeout=self.acquire_timeout)
            self._pools[spec.key] = pool
        return pool

    @property
    def pools(self) -> dict[str, ResourcePool]:
        return dict(self._pools)

    def build_resource(self, spec: ResourceSpec) -> Resource:
        """A new, not yet started resource of ``spec`` from this manager's backend, labelled as its own (what its
        pools call to grow; a Ray host builds its instances with it too)."""
        r = self._backend_factory(spec, {**self.labels, f"{LABEL}.pool": spec.key})
        r.services = self.services
        self._instances.add(r)
        return r

    # -- scopes (scope() is Manager's)
    async def acquire_global(self, spec: ResourceSpec, *, user: Any = None) -> Resource:
        """The one process-wide shared instance of ``spec`` (e.g. a WebShop server, an LLM judge).

        Started on first call, returned as is afterwards, destroyed by :meth:`destroy_global`
        or :meth:`aclose`.  Global resources are never reset between users.

        Args:
            user: who holds the instance (an env; kept as a weak reference) until it calls
                :meth:`leave_global`.  Once every user has left, the instance is released after
                ``spec.max_idle_time`` seconds unless it is acquired again meanwhile (``None``: kept until
                the manager closes).  Without a user the instance is kept until the manager closes.
        """
        key = spec.key
        if user is not None:
            self._global_users.setdefault(key, weakref.WeakSet()).add(user)
            timer = self._global_timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        r = self._globals.get(key)
        if r is not None:
            return r
        lock = self._global_locks.setdefault(key, asyncio.Lock())
        async with lock:
            r = self._globals.get(key)
            if r is None:
                r = await self.pool(spec).acquire()
                self._globals[key] = r
            return r

    def leave_global(self, spec: ResourceSpec, user: Any) -> None:
        """``user`` (as given to :meth:`acquire_global`) no longer needs the shared instance of ``spec``.

        When it was the last user, the instance is released ``spec.max_idle_time`` seconds later unless
        someone acquires it meanwhile (with ``max_idle_time=None`` it stays until the manager closes).
        Call it from the manager's event loop; a user that never acquired is ignored.
        """
        key = spec.key
        users = self._global_users.get(key)
        if users is None or user not in users:
            return
        users.discard(user)
        ttl = spec.max_idle_time
        if users or ttl is None or self._closed or key not in self._globals or key in self._global_timers:
            return
        self._global_timers[key] = asyncio.get_running_loop().call_later(ttl, self._expire_global, spec)

    def _expire_global(self, spec: ResourceSpec) -> None:
        """The release :meth:`leave_global` scheduled: stop the instance if nobody took it up again."""
        key = spec.key
        self._global_timers.pop(key, None)
        r = None if self._closed or self._global_users.get(key) else self._globals.pop(key, None)
        if r is not None:  # from now on acquire_global starts a fresh one
            task = asyncio.ensure_future(self._pools[key].release(r, retire=True))
            self._global_releases.add(task)
            task.add_done_callback(self._global_releases.discard)

    async def destroy_global(self, spec: ResourceSpec) -> None:
        """Destroy the global instance of ``spec`` if one is live (e.g. it died); the next
        :meth:`acquire_global` starts a fresh one.  Not ``release``: a global instance has no lease to
        give back, and it is stopped for every user, not kept for reuse."""
        r = self._globals.pop(spec.key, None)
        if r is not None:
            await self._pools[spec.key].release(r, discard=True)

    # -- prewarm, metrics, close
    async def prewarm(self, spec: ResourceSpec, n: int | None = None) -> None:
        """Start ``n`` (default ``spec.min_idle``) idle instances of ``spec`` ahead of demand."""
        await self.pool(spec).prewarm(n)

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per pool: in use, idle, waiting, started, reused, acquire wait mean/max, start time (seconds)."""
        return {key: pool.snapshot() for key, pool in self._pools.items()}

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Release every instance of every pool, in use or idle; idempotent."""
        self._closed = True
        self._globals.clear()
        for timer in self._global_timers.values():
            timer.cancel()
        self._global_timers.clear()
        pools = list(self._pools.values())
        await asyncio.gather(*(p.aclose(timeout=0) for p in pools), return_exceptions=True)
        self.services.close()

    def close(self) -> None:
        """Synchronous :meth:`aclose`, best effort (interpreter exit, SIGTERM, or no loop available): every
        instance this manager built that is still referenced gets :meth:`Resource.destroy
        <agentfly_gym.resources.Resource.destroy>`, in parallel (idempotent for those already destroyed).
        Never raises."""
        self._closed = True
        teardown.destroy_all(list(self._instances))
        self.services.close()
