"""A capped, FIFO, reset-on-reuse pool of resource instances for one spec.

Modelled on asyncpg's ``Pool``: ``await pool.acquire(timeout=...)`` or
``async with pool.acquire() as resource``; ``min_idle`` pre-warms, ``max_uses``
recycles, ``max_idle_time`` expires idle instances (as asyncpg's
``max_inactive_connection_lifetime``: on a timer of the pool's event loop, so an instance
nobody asks for again is released without waiting for the next acquisition), ``aclose()``
is graceful and ``aclose(timeout=0)`` immediate (asyncpg's ``close()`` and ``terminate()``).

Guarantees (pinned by tests/test_resources.py and tests/test_faults.py):

* at most ``spec.max_instances`` instances are alive (in use, idle or starting);
* acquisitions beyond capacity wait and are served as others release: in FIFO order, unless they carry
  a ``priority`` (larger first; one that has waited ``priority_age_bound`` seconds goes first, oldest
  first, so nothing starves; see :mod:`agentfly_gym.resources.priority`);
* an instance handed out a second time is always ``reset()`` first, on the acquiring
  side, so no rollout sees the previous one's state;
* an instance whose ``status()`` is not ``READY`` (or whose reset fails) is released and
  replaced by a fresh one;
* a cancelled or timed-out acquisition never strands an instance or a capacity slot;
* an instance whose start failed or was abandoned keeps its capacity slot until its
  ``adestroy()`` has finished (an in-process start that is cut short is closed when its
  factory returns), so the cap holds for processes, not only for handed-out instances;
* with ``spec.max_idle_time``, an instance given back and not acquired again within that many
  seconds is released (pre-warmed instances that never served, and ``min_idle`` of them, stay).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from ..errors import AgentFlyError, EventLoopMismatch, PoolClosedError, ResourceError, ResourceStartError, ResourceTimeout
from .base import Resource, ResourceStatus
from .priority import DEFAULT_AGE_BOUND_S, serve_order
from .spec import ResourceSpec

__all__ = ["ResourcePool", "PoolMetrics"]

log = logging.getLogger(__name__)

ResourceFactory = Callable[[ResourceSpec], Resource]


@dataclasses.dataclass
class PoolMetrics:
    """Counters and timings of one pool.  Times are in seconds.

    ``started`` counts instances started, ``reused`` acquisitions served by an instance
    that had served before, ``replaced`` instances discarded as unhealthy or failed,
    ``recycled`` instances retired after ``max_uses`` or ``max_idle_time``.
    """

    key: str
    label: str
    capacity: int
    in_use: int = 0
    idle: int = 0
    starting: int = 0
    waiting: int = 0
    max_in_use: int = 0
    acquired: int = 0
    started: int = 0
    reused: int = 0
    replaced: int = 0
    recycled: int = 0
    start_failures: int = 0
    timeouts: int = 0
    acquire_wait_total: float = 0.0
    acquire_wait_max: float = 0.0
    start_time_total: float = 0.0
    start_time_max: float = 0.0
    reset_time_total: float = 0.0
    resets: int = 0

    @property
    def acquire_wait_mean(self) -> float:
        return self.acquire_wait_total / self.acquired if self.acquired else 0.0

    @property
    def start_time_mean(self) -> float:
        return self.start_time_total / self.started if self.started else 0.0

    @property
    def reset_time_mean(self) -> float:
        return self.reset_time_total / self.resets if self.resets else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(acquire_wait_mean=self.acquire_wait_mean, start_time_mean=self.start_time_mean,
                 reset_time_mean=self.reset_time_mean)
        return d


class _AcquireContext:
    """``await pool.acquire()`` or ``async with pool.acquire() as r`` (as asyncpg's PoolAcquireContext)."""

    __slots__ = ("_pool", "_timeout", "_priority", "_resource")

    def __init__(self, pool: ResourcePool, timeout: float | None, priority: float | None = None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._priority = priority
        self._resource: Resource | None = None

    def __await__(self):
        return self._pool._acquire(self._timeout, self._priority).__await__()

    async def __aenter__(self) -> Resource:
        self._resource = await self._pool._acquire(self._timeout, self._priority)
        return self._resource

    async def __aexit__(self, *exc: Any) -> None:
        r, self._resource = self._resource, None
        if r is not None:
            await self._pool.release(r)


class ResourcePool:
    """All instances of one spec.

    Args:
        spec: what to build; ``spec.max_instances`` is the capacity.
        factory: builds an unstarted :class:`Resource` for the spec (the backend).
        acquire_timeout: default seconds an acquisition may wait; ``None`` waits forever.
        priority_age_bound: seconds after which a waiting acquisition is served in arrival order before
            prioritised ones (None: never; see :mod:`agentfly_gym.resources.priority`).

    The pool binds to the event loop of its first use and raises
    :class:`~agentfly_gym.errors.EventLoopMismatch` if used from another.
    """

    def __init__(self, spec: ResourceSpec, factory: ResourceFactory, *, acquire_timeout: float | None = None,
                 priority_age_bound: float | None = DEFAULT_AGE_BOUND_S) -> None:
        self.spec = spec
        self._factory = factory
        self.acquire_timeout = acquire_timeout
        self.priority_age_bound = priority_age_bound
        self._idle: collections.deque[Resource] = collections.deque()
        self._in_use: set[Resource] = set()
        self._size = 0  # live instances + capacity slots being (re)filled
        self._starting = 0
        self._warming = 0  # pre-warm starts scheduled and not finished
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._ranks: dict[asyncio.Future, tuple[float | None, float]] = {}  # waiter -> (priority, enqueued at)
        self._background: set[asyncio.Task] = set()
        self._stopping: set[Resource] = set()  # failed or abandoned starts whose release is running
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_timer: asyncio.TimerHandle | None = None  # the next max_idle_time check, while one is due
        self._all_returned: asyncio.Event | None = None  # set when nothing is in use, while aclose() waits for it
        self.metrics = PoolMetrics(key=spec.key, label=spec.label, capacity=spec.max_instances)

    # ------------------------------------------------------------------ public API
    @property
    def capacity(self) -> int:
        return self.spec.max_instances

    @property
    def size(self) -> int:
        """Live instances plus slots being started."""
        return self._size

    @property
    def closed(self) -> bool:
        return self._closed

    def acquire(self, *, timeout: float | None = None, priority: float | None = None) -> _AcquireContext:
        """Acquire a ready instance; ``await`` it or use it as ``async with``.

        Args:
            timeout: seconds to wait for capacity; defaults to the pool's ``acquire_timeout``.
            priority: while the pool is saturated, waiters with a larger priority are served first (e.g. a
                rollout's predicted seconds); None: FIFO (see :mod:`agentfly_gym.resources.priority`).

        Raises:
            ResourceTimeout: no instance became free in time.
            ResourceStartError: a new instance failed to start.
            PoolClosedError: the pool is closed.
        """
        return _AcquireContext(self, timeout if timeout is not None else self.acquire_timeout, priority)

    async def release(self, resource: Resource, *, discard: bool = False, retire: bool = False) -> None:
        """Give ``resource`` back.  With ``discard=True`` it is stopped instead of kept (counted as
        ``replaced``); with ``retire=True`` it is stopped as no longer needed (counted as ``recycled``).

        Never blocks: stopping runs in a background task that :meth:`aclose` awaits, so a
        release inside a cancelled task still completes.
        """
        self._check_loop()
        if resource not in self._in_use:
            raise ResourceError(f"{resource!r} is not in use in pool {self.spec.label}", spec=self.spec)
        self._in_use.discard(resource)
        if not self._in_use and self._all_returned is not None:
            self._all_returned.set()
        resource.last_released_at = time.monotonic()
        self._sync_counts()
        max_uses = self.spec.max_uses
        if discard or retire or self._closed:
            self._retire(resource, replaced=discard, recycled=retire and not discard)
        elif max_uses is not None and resource.uses >= max_uses:
            self._retire(resource, recycled=True)
        else:
            self._hand_over(resource)
        self._maintain_min_idle()

    async def prewarm(self, n: int | None = None) -> None:
        """Start instances until ``n`` (default ``spec.min_idle``) are idle or capacity is reached."""
        self._check_loop()
        target = self.spec.min_idle if n is None else n
        tasks = []
        while len(self._idle) + self._warming < target and self._size < self.capacity and not self._closed:
            self._size += 1
            self._warming += 1
            tasks.append(self._spawn(self._start_into_idle()))
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self, *, timeout: float | None = None) -> None:
        """Stop accepting acquisitions, fail every waiter, wait for in-use instances to come back, then
        destroy every instance (idle and in use); idempotent.

        The wait for in-use instances ends when the last one is released (an event, no polling; asyncpg's
        ``close`` awaits each holder's release the same way).

        Args:
            timeout: seconds to wait for in-use instances (None: as long as it takes); after it they are
                destroyed anyway (logged).  ``timeout=0`` destroys everything now (what
                :meth:`ResourceManager.aclose <agentfly_gym.resources.ResourceManager.aclose>` does).
        """
        self._closed = True
        self._fail_waiters(PoolClosedError(f"pool {self.spec.label} is closed"))
        if self._in_use and timeout != 0:
            if self._all_returned is None:
                self._all_returned = asyncio.Event()
            try:
                async with asyncio.timeout(timeout):
                    await self._all_returned.wait()
            except TimeoutError:
                log.warning("pool %s: %d instance(s) still in use after %ss; destroying them anyway",
                            self.spec.label, len(self._in_use), timeout)
        self._cancel_idle_timer()
        for r in list(self._idle) + list(self._in_use):
            self._retire(r)
        self._idle.clear()
        self._in_use.clear()
        if self._all_returned is not None:
            self._all_returned.set()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self._sync_counts()

    def snapshot(self) -> dict[str, Any]:
        """Current metrics as a dict (see :class:`PoolMetrics`)."""
        self._sync_counts()
        return self.metrics.as_dict()

    # ------------------------------------------------------------------ internals
    def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            if self._loop.is_closed():
                raise EventLoopMismatch(f"pool {self.spec.label} belongs to an event loop that is closed; make a new ResourceManager")
            raise EventLoopMismatch(
                f"pool {self.spec.label} is bound to another event loop; use one ResourceManager per event loop "
                "(agentfly_gym.resources.default_manager() gives one per loop)")

    def _sync_counts(self) -> None:
        m = self.metrics
        m.in_use, m.idle, m.starting = len(self._in_use), len(self._idle), self._starting
        m.waiting = sum(1 for w in self._waiters if not w.done())
        m.max_in_use = max(m.max_in_use, m.in_use)

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.ensure_future(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)
        return t

    def _retire(self, r: Resource, *, replaced: bool = False, recycled: bool = False) -> None:
        """Stop ``r`` in the background and free its capacity slot for a waiter."""
        if replaced:
            self.metrics.replaced += 1
        if recycled:
            self.metrics.recycled += 1
        self._spawn(self._safe_destroy(r))
        self._size -= 1
        self._wake_for_slot()

    async def _safe_destroy(self, r: Resource) -> None:
        try:
            await r.adestroy()
        except Exception:
            log.warning("destroying %r failed", r, exc_info=True)

    def _first_live_waiter(self) -> asyncio.Future | None:
        """The waiter to serve next (removed from the queue), by :func:`~.priority.serve_order`."""
        while self._waiters and self._waiters[0].done():
            self._ranks.pop(self._waiters.popleft(), None)
        if not self._waiters:
            return None
        if len(self._waiters) == 1 or not any(p for p, _ in self._ranks.values()):
            w = self._waiters.popleft()  # FIFO: nothing is prioritised (the common case, O(1))
        else:
            live = [w for w in self._waiters if not w.done()]
            w = serve_order(live, lambda f: self._ranks.get(f, (None, 0.0)), now=time.monotonic(),
                            age_bound=self.priority_age_bound)[0]
            self._waiters.remove(w)
        self._ranks.pop(w, None)
        return w

    def _hand_over(self, r: Resource) -> None:
        """Give a released instance to the first waiter, or keep it idle."""
        w = self._first_live_waiter()
        if w is not None:
            w.set_result(r)
        else:
            self._idle.append(r)
            self._spawn(self._safe_park(r))
            self._arm_idle_timer()
        self._sync_counts()

    async def _safe_park(self, r: Resource) -> None:
        try:
            await r.park()
        except Exception:
            log.warning("park of %r failed", r, exc_info=True)

    def _wake_for_slot(self) -> None:
        """A capacity slot is free: the first waiter may start a new instance (result ``None``)."""
        if self._closed:
            return
        if self._size < self.capacity:
            w = self._first_live_waiter()
            if w is not None:
                self._size += 1  # the slot now belongs to the waiter
                w.set_result(None)
        self._sync_counts()

    def _fail_waiters(self, exc: BaseException) -> None:
        self._ranks.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_exception(exc)

    def _return_grant(self, grant: Resource | None) -> None:
        """An acquirer gave up after being granted an instance or a slot: pass it on."""
        if grant is None:
            self._size -= 1
            self._wake_for_slot()
        else:
            self._hand_over(grant)

    def _maintain_min_idle(self) -> None:
        if self._closed or not self.spec.min_idle:
            return
        while (len(self._idle) + self._warming < self.spec.min_idle and self._size < self.capacity
               and not any(not w.done() for w in self._waiters)):
            self._size += 1
            self._warming += 1
            self._spawn(self._start_into_idle())

    async def _start_into_idle(self) -> None:
        """Pre-warm one instance into the idle queue (the caller reserved a slot and a ``_warming`` count)."""
        try:
            r = await self._start_new()  # on failure it frees the slot itself, once the instance is stopped
        except Exception:
            log.warning("pre-warming an instance of %s failed", self.spec.label, exc_info=True)
            return
        finally:
            self._warming -= 1
        if self._closed:
            self._size -= 1
            self._spawn(self._safe_destroy(r))
            return
        self._hand_over(r)

    async def _start_new(self) -> Resource:
        """Build and start one instance (the caller holds a capacity slot).

        On failure or cancellation the slot is freed here, once the instance's ``adestroy()`` has
        finished: a start cut short may still be bringing a process up, and it counts until it is gone.
        """
        r = self._factory(self.spec)
        self._starting += 1
        self._sync_counts()
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                await r.start()
        except BaseException as e:
            self.metrics.start_failures += 1
            self._stopping.add(r)
            stopping = self._spawn(self._release_then_free_slot(r))
            if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
            # the start has ended: let the caller see its slot free again (the release goes on if cancelled)
            await asyncio.shield(stopping)
            if isinstance(e, TimeoutError):
                raise ResourceStartError(f"{self.spec.label}: start took longer than start_timeout={self.spec.start_timeout}s",
                                         spec=self.spec) from e
            if isinstance(e, AgentFlyError):
                raise
            raise ResourceStartError(f"{self.spec.label}: start failed: {type(e).__name__}: {e}", spec=self.spec) from e
        finally:
            self._starting -= 1
        dt = time.monotonic() - t0
        m = self.metrics
        m.started += 1
        m.start_time_total += dt
        m.start_time_max = max(m.start_time_max, dt)
        return r

    async def _release_then_free_slot(self, r: Resource) -> None:
        try:
            await self._safe_destroy(r)
        finally:
            self._stopping.discard(r)
            self._size -= 1
            self._wake_for_slot()

    def _expire_idle(self) -> None:
        """Release idle instances given back more than ``spec.max_idle_time`` seconds ago, oldest first,
        keeping ``spec.min_idle`` idle ones."""
        ttl = self.spec.max_idle_time
        if ttl is None or self._closed:
            return
        now = time.monotonic()
        for r in sorted(self._idle, key=lambda r: r.last_released_at or now):
            if len(self._idle) <= self.spec.min_idle:
                break
            if r.last_released_at is not None and now - r.last_released_at >= ttl:
                self._idle.remove(r)
                self._retire(r, recycled=True)
        self._sync_counts()

    def _arm_idle_timer(self) -> None:
        """Schedule the next :meth:`_expire_idle` for when the oldest idle instance reaches ``max_idle_time``."""
        ttl = self.spec.max_idle_time
        if ttl is None or self._closed or self._loop is None or len(self._idle) <= self.spec.min_idle:
            return
        due = [r.last_released_at + ttl for r in self._idle if r.last_released_at is not None]
        if not due:
            return
        when = min(due) - time.monotonic() + self._loop.time()
        if self._idle_timer is not None:
            if self._idle_timer.when() <= when:
                return
            self._idle_timer.cancel()
        self._idle_timer = self._loop.call_at(when, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._idle_timer = None
        self._expire_idle()
        self._arm_idle_timer()

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def _wait_for_grant(self, timeout: float | None, priority: float | None = None) -> Resource | None:
        """Queue (FIFO, or by ``priority``) until a release grants an instance (or ``None``: a free slot)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._ranks[fut] = (priority, time.monotonic())
        self._sync_counts()
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._return_grant(fut.result())
            else:
                fut.cancel()
                if fut in self._ranks:  # drop it now: a done waiter left in the middle of the queue
                    self._ranks.pop(fut)
                    self._waiters.remove(fut)
            raise
        finally:
            self._sync_counts()

    async def _acquire(self, timeout: float | None, priority: float | None = None) -> Resource:
        self._check_loop()
        if self._closed:
            raise PoolClosedError(f"pool {self.spec.label} is closed", spec=self.spec)
        t0 = time.monotonic()
        self._expire_idle()
        grant: Resource | None
        if self._idle:
            grant = self._idle.popleft()
        elif self._size < self.capacity and not any(not w.done() for w in self._waiters):
            self._size += 1
            grant = None
        else:
            try:
                grant = await self._wait_for_grant(timeout, priority)
            except TimeoutError:
                self.metrics.timeouts += 1
                raise ResourceTimeout(
                    f"no instance of {self.spec.label} became free within {timeout}s "
                    f"(capacity {self.capacity}, {len(self._in_use)} in use, "
                    f"{sum(1 for w in self._waiters if not w.done())} waiting)", spec=self.spec) from None
        try:
            r = await self._make_ready(grant)
        except BaseException:
            self._maintain_min_idle()
            raise
        self._in_use.add(r)
        r.uses += 1
        m = self.metrics
        wait = time.monotonic() - t0
        m.acquired += 1
        m.acquire_wait_total += wait
        m.acquire_wait_max = max(m.acquire_wait_max, wait)
        self._sync_counts()
        self._maintain_min_idle()
        return r

    async def _make_ready(self, grant: Resource | None) -> Resource:
        """Turn a grant into a healthy, reset instance; the caller holds its capacity slot.

        On any failure (including cancellation) the slot is returned to the pool (by
        :meth:`_start_new` itself, after the release, when the failure is a start's).
        """
        r = grant
        try:
            if r is not None:
                healthy = False
                try:
                    healthy = await r.status() == ResourceStatus.READY
                    if healthy and r.uses > 0:
                        t0 = time.monotonic()
                        await r.reset()
                        self.metrics.resets += 1
                        self.metrics.reset_time_total += time.monotonic() - t0
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.warning("health check or reset of %r failed; replacing it", r, exc_info=True)
                    healthy = False
                if healthy:
                    if r.uses > 0:
                        self.metrics.reused += 1
                    return r
                # unhealthy: stop it and start a replacement in the same slot
                self.metrics.replaced += 1
                self._spawn(self._safe_destroy(r))
                r = None
        except BaseException:
            if r is not None:
                # cancelled during status/reset: the instance's state is unknown, so replace it
                self._spawn(self._safe_destroy(r))
            self._size -= 1
            self._wake_for_slot()
            raise
        return await self._start_new()
