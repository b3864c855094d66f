"""Rollout scopes: the resources one rollout holds, released together when it ends.

``async with manager.scope("rollout-17") as scope:`` (any :class:`~agentfly_gym.resources.protocol.Manager`)
gives a :class:`RolloutScope`; ``await scope.acquire(spec)`` returns the same live instance for the same spec
key until the scope ends, even on error or cancellation.  A manager whose pools live elsewhere (Ray) subclasses
the scope and overrides the two places it meets its manager's pools, ``_pool_of`` and ``_give_back``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import PoolClosedError, ResourceError
from .base import Resource
from .priority import current_priority
from .spec import ResourceSpec

if TYPE_CHECKING:
    from .protocol import Manager

__all__ = ["RolloutScope", "open_scope"]

log = logging.getLogger(__name__)

_scope_ids = itertools.count(1)


def open_scope(manager: Any, scope_class: type[RolloutScope], scope_id: str | None = None, *,
               acquire_timeout: float | None = None, priority: float | None = None) -> RolloutScope:
    """A new scope of ``manager`` (what both managers' ``scope()`` return).

    Args:
        manager: the manager whose pools the scope leases from.
        scope_class: :class:`RolloutScope` or the manager's subclass of it.
        scope_id: the scope's id (``"scope-<n>"`` by default, ``n`` counting scopes in this process).
        acquire_timeout: default seconds an acquisition may wait (default: ``manager.acquire_timeout``).
        priority: the priority of the scope's acquisitions on saturated pools (see
            :mod:`agentfly_gym.resources.priority`); None: the running task's (:func:`acquire_priority`), or FIFO.

    Raises:
        PoolClosedError: the manager is closed.
    """
    if manager.closed:
        raise PoolClosedError(f"resource manager {manager.id} is closed")
    scope = scope_class(manager, scope_id or f"scope-{next(_scope_ids)}",
                        acquire_timeout=acquire_timeout if acquire_timeout is not None else manager.acquire_timeout)
    scope.priority = priority
    return scope


class RolloutScope:
    """Resources held by one rollout; released together when the scope ends.

    ``await scope.acquire(spec)`` returns the same live instance for the same spec key
    for the whole scope (a rollout's container is reused across its turns) and distinct
    instances for distinct specs: leases are keyed by (scope id, spec key).
    Concurrent acquisitions of one spec inside a scope are serialised, so parallel tool
    calls of one turn share one instance.

    ``priority`` (None by default) ranks the scope's acquisitions among the waiters of a saturated pool
    (larger first; see :mod:`agentfly_gym.resources.priority`); when None, the priority set for the running
    task with :func:`~agentfly_gym.resources.priority.acquire_priority` applies (the rollout runners set it).
    """

    priority: float | None = None

    def __init__(self, manager: Manager, scope_id: str, *, acquire_timeout: float | None = None) -> None:
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
                priority = self.priority if self.priority is not None else current_priority()
                extra = {} if priority is None else {"priority": priority}  # a pool without priorities still works
                lease = await pool.acquire(timeout=timeout if timeout is not None else self.acquire_timeout, **extra)
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
        return self.manager.pools.get(key)

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
