"""The resource manager: one pool per spec key, rollout scopes and global scope.

    manager = ResourceManager()
    async with manager.scope("rollout-17") as scope:
        box = await scope.acquire(ContainerSpec(image="agentfly/r2e-base"))
        same = await scope.acquire(ContainerSpec(image="agentfly/r2e-base"))   # same instance
    # everything acquired in the scope is released here, also on error or cancellation
    judge = await manager.acquire_global(ModelAPISpec(base_url=..., model=...))
    await manager.aclose()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import PoolClosedError, ResourceError
from . import teardown
from .backends import create_resource
from .base import Resource
from .containers.ownership import LABEL, owner_labels
from .pool import ResourcePool
from .spec import ResourceSpec

__all__ = ["ResourceManager", "RolloutScope", "default_manager"]

log = logging.getLogger(__name__)

_scope_ids = itertools.count(1)


class RolloutScope:
    """Resources held by one rollout; released together when the scope ends.

    ``await scope.acquire(spec)`` returns the same live instance for the same spec key
    for the whole scope (a rollout's container is reused across its turns) and distinct
    instances for distinct specs: leases are keyed by (scope id, spec key).
    Concurrent acquisitions of one spec inside a scope are serialised, so parallel tool
    calls of one turn share one instance.
    """

    def __init__(self, manager: ResourceManager, scope_id: str, *, acquire_timeout: float | None = None) -> None:
        self.manager = manager
        self.id = scope_id
        self.acquire_timeout = acquire_timeout
        self._leases: dict[str, Resource] = {}  # never rebound: the finalizer below holds this dict
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self._loop: list[asyncio.AbstractEventLoop] = []  # the loop of the first acquisition
        # A scope dropped without aclose() (its env garbage-collected, its task abandoned) gives its leases
        # back when it is collected, as asyncpg returns the connection of a collected holder to its pool.
        self._finalizer = weakref.finalize(self, _return_leases_of_collected_scope, type(self), manager, scope_id,
                                           self._leases, self._loop)
        self._finalizer.atexit = False  # at exit the manager's own teardown stops everything

    @property
    def resources(self) -> dict[str, Resource]:
        """The live leases of this scope by spec key."""
        return dict(self._leases)

    async def acquire(self, spec: ResourceSpec, *, timeout: float | None = None) -> Resource:
        """The scope's instance of ``spec``, acquired from its pool on first use.

        Raises:
            ResourceTimeout, ResourceStartError, PoolClosedError: from the pool.
            ResourceError: the scope has already ended.
        """
        if self._closed:
            raise ResourceError(f"scope {self.id!r} has ended; open a new one")
        if not self._loop:
            self._loop.append(asyncio.get_running_loop())
        key = spec.key
        lease = self._leases.get(key)
        if lease is not None:
            return lease
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            lease = self._leases.get(key)
            if lease is None:
                pool = self.manager.pool(spec)
                lease = await pool.acquire(timeout=timeout if timeout is not None else self.acquire_timeout)
                if self._closed:  # the scope ended while we waited
                    await self._give_back(pool, lease)
                    raise ResourceError(f"scope {self.id!r} ended during acquisition")
                self._leases[key] = lease
            return lease

    async def release(self, spec: ResourceSpec, *, discard: bool = False) -> None:
        """Release this scope's instance of ``spec`` early; ``discard=True`` stops it (e.g. it died)."""
        lease = self._leases.pop(spec.key, None)
        if lease is not None:
            await self._give_back(self.manager.pool(spec), lease, discard=discard)

    async def discard(self, resource: Resource) -> None:
        """Release ``resource`` (held by this scope) and stop it instead of reusing it."""
        await self.release(resource.spec, discard=True)

    async def aclose(self) -> None:
        """Release every lease.  Completes without yielding, so it also runs under cancellation."""
        self._closed = True
        leases = dict(self._leases)
        self._leases.clear()
        self._finalizer.detach()
        for key, lease in leases.items():
            pool = self._pool_of(key, lease)
            if pool is None or pool.closed:
                continue
            try:
                await self._give_back(pool, lease)
            except Exception:
                log.warning("releasing %r from scope %s failed", lease, self.id, exc_info=True)

    # -- the two places a scope meets its manager's pools (a Ray scope overrides them)
    def _pool_of(self, key: str, lease: Resource) -> Any:
        """The pool ``lease`` (of spec key ``key``) goes back to, or None when it is gone."""
        return self.manager._pools.get(key)

    async def _give_back(self, pool: Any, lease: Resource, *, discard: bool = False) -> None:
        """Return ``lease`` to ``pool``; ``discard`` stops it instead of keeping it for reuse."""
        await pool.release(lease, discard=discard)

    async def __aenter__(self) -> RolloutScope:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _return_leases_of_collected_scope(cls: type[RolloutScope], manager: Any, scope_id: str,
                                      leases: dict[str, Resource], loop_cell: list[asyncio.AbstractEventLoop]) -> None:
    """The finalizer of a scope collected while it held leases: hand them back on the scope's event loop.

    Runs wherever the garbage collector runs (any thread, inside any code), so it only schedules a callback;
    the instances go back to their pools as a plain release (the next acquirer's health check and reset
    apply, and an instance that fails them is replaced).
    """
    if not leases or not loop_cell:
        return
    held = list(leases.items())
    leases.clear()
    try:
        loop_cell[0].call_soon_threadsafe(_give_back_leases, cls, manager, scope_id, held)
    except RuntimeError:  # the loop is closed: its manager's teardown stopped the instances
        pass


def _give_back_leases(cls: type[RolloutScope], manager: Any, scope_id: str, held: list[tuple[str, Resource]]) -> None:
    log.warning("scope %s was garbage-collected without aclose() (an environment dropped without close, or its "
                "task abandoned); returning %d lease(s) to their pools", scope_id, len(held))
    orphan = cls.__new__(cls)  # a stand-in without leases, for the subclass's _pool_of/_give_back
    orphan.manager, orphan.id = manager, scope_id
    for key, lease in held:
        pool = orphan._pool_of(key, lease)
        if pool is None or getattr(pool, "closed", False):
            continue
        task = asyncio.ensure_future(orphan._give_back(pool, lease))
        task.add_done_callback(_log_give_back_failure)


def _log_give_back_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("returning the lease of a collected scope failed: %s", task.exception())


class ResourceManager:
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
        self._closed = False
        teardown.watch(self)

    # -- pools
    def pool(self, spec: ResourceSpec) -> ResourcePool:
        """The pool for ``spec.key``, created on first use."""
        if self._closed:
            raise PoolClosedError(f"resource manager {self.id} is closed")
        pool = self._pools.get(spec.key)
        if pool is None:
            pool = ResourcePool(spec, self._build, acquire_timeout=self.acquire_timeout)
            self._pools[spec.key] = pool
        return pool

    @property
    def pools(self) -> dict[str, ResourcePool]:
        return dict(self._pools)

    def _build(self, spec: ResourceSpec) -> Resource:
        r = self._backend_factory(spec, {**self.labels, f"{LABEL}.pool": spec.key})
        self._instances.add(r)
        return r

    # -- scopes
    def scope(self, scope_id: str | None = None, *, acquire_timeout: float | None = None) -> RolloutScope:
        """A rollout scope: ``async with manager.scope("traj-3") as scope: ...``."""
        if self._closed:
            raise PoolClosedError(f"resource manager {self.id} is closed")
        return RolloutScope(self, scope_id or f"scope-{next(_scope_ids)}",
                            acquire_timeout=acquire_timeout if acquire_timeout is not None else self.acquire_timeout)

    async def acquire_global(self, spec: ResourceSpec, *, user: Any = None) -> Resource:
        """The one process-wide shared instance of ``spec`` (e.g. a WebShop server, an LLM judge).

        Started on first call, returned as is afterwards, released by :meth:`release_global`
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

    async def release_global(self, spec: ResourceSpec) -> None:
        """Stop the global instance of ``spec`` if one is live."""
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
        await asyncio.gather(*(p.terminate() for p in pools), return_exceptions=True)

    def close_sync(self) -> None:
        """Synchronous best-effort teardown (interpreter exit, SIGTERM, or no loop available): every
        instance this manager built that is still referenced gets ``terminate_sync()``, in parallel
        (idempotent for those already released)."""
        self._closed = True
        teardown.terminate_all(list(self._instances))

    async def __aenter__(self) -> ResourceManager:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


_default_managers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ResourceManager] = weakref.WeakKeyDictionary()


def default_manager() -> ResourceManager:
    """The default manager of the running event loop (one per loop, created on first use).

    Environments made without an explicit ``manager=`` use it, so all of them in one
    loop share pools.  Must be called from inside a running loop.  ``AGENTFLY_GYM_MANAGER=ray``
    (or ``auto`` inside a Ray job) makes it a cluster-wide
    :class:`~agentfly_gym.resources.ray.RayResourceManager` (see :mod:`agentfly_gym.resources.select`).
    """
    loop = asyncio.get_running_loop()
    m = _default_managers.get(loop)
    if m is None or m.closed:
        from .select import manager_from_environment  # AGENTFLY_GYM_MANAGER: local (default), ray, auto

        m = manager_from_environment()
        _default_managers[loop] = m
    return m
