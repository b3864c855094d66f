"""The pool actor of the cluster-wide manager: one per spec key and namespace.

``PoolActor`` (a named actor) is the only place that decides how many instances of a spec live in the
cluster: it caps them at ``spec.max_instances``, queues acquisitions FIFO, has an instance reset on its host when
it comes back (so an idle instance is ready, and handing it out costs no call on its host), and replaces dead ones.

Throughput: a client sends its acquisitions and releases in batches (:meth:`PoolActor.acquire_many`,
:meth:`PoolActor.release_many`; see :mod:`.batching`), and the pool resets the instances that came back together
with one call per host (``ResourceHost.recycle``; see :mod:`.recycling`).  A host's death is
seen without polling: the pool keeps one call open on each host (``ResourceHost.wait_closed``), which fails when
the host dies.  Instances live in host actors (:mod:`.host`): one per node the pool uses
(``hosting="node"``), or one per instance (``hosting="instance"``); see :mod:`.hosting`.

The class is plain Python here; :func:`pool_actor_class` wraps it with ``ray.remote`` on first use (nothing
happens at import).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from typing import Any

from ...errors import PoolClosedError, ResourceError, ResourceStartError, ResourceTimeout
from ..priority import DEFAULT_AGE_BOUND_S, serve_order
from ..spec import ResourceSpec
from .clients import PoolClients
from .recycling import PoolRecycling
from .hosting import Placed, make_hosting
from .placement import RayPlacement

__all__ = ["PoolActor", "pool_actor_class", "Grant"]

#: seconds an acquire_many call waits for the resets that will serve its waiting requests (see there)
RESET_WAIT_S = 2.0

log = logging.getLogger(__name__)

@dataclasses.dataclass
class Grant:
    """What :meth:`PoolActor.acquire` hands a client: the lease id, the instance's id and its host actor (every
    call on the host names the instance by ``instance_id``).  ``handle`` is None when this client was sent the
    host's handle before (each grant that carries a handle costs Ray a borrower registration); the client keeps
    handles by ``host_id``, and asks :meth:`PoolActor.host_handle` for one it lacks.  ``snapshot`` is empty in
    the grants of :meth:`PoolActor.acquire_many`, which sends one snapshot with the whole batch."""

    lease_id: str
    instance_id: str
    handle: Any
    node_id: str
    pid: int
    uses: int
    waited: float
    snapshot: dict[str, Any]
    host_id: str = ""


@dataclasses.dataclass
class _Instance:
    id: str
    placed: Placed
    uses: int = 0
    idle_since: float = 0.0

    @property
    def handle(self) -> Any:
        return self.placed.handle

    @property
    def node_id(self) -> str:
        return self.placed.node_id

    @property
    def pid(self) -> int:
        return self.placed.pid


class PoolActor(PoolClients, PoolRecycling):
    """The cluster-wide pool of one spec: cap, FIFO waiting, reset on reuse, cancellation, dead instances.

    Every client (a :class:`~agentfly_gym.resources.ray.RayResourceManager` in any process) attaches to
    the pool by name; :meth:`acquire` grants a lease on one instance, :meth:`release` returns it (its host resets
    it as it comes back, so each lease of a reused instance starts from a reset state, as in the local pool; an
    instance that fails its reset is stopped and replaced).  An acquisition that its client gave up
    (cancelled, timed out on the client side) is cancelled with :meth:`cancel` by the same lease id: if
    it was already granted, the instance comes back at once, so no lease is stranded.  The pool ends its
    instances when the last client detaches (or when it is killed: its hosts and reservations share its fate).
    ``hosting`` (``"node"`` or ``"instance"``) chooses the hosts (:func:`.hosting.make_hosting`).
    """

    def __init__(self, spec: ResourceSpec, placement: RayPlacement, manager_id: str, hosting: str = "node") -> None:
        self.spec = spec
        self._key, self._label = spec.key, spec.label  # a digest each time they are read: read once
        self.capacity = spec.max_instances
        self.placement = placement
        self.manager_id = manager_id
        self.hosting = make_hosting(hosting, spec, placement, manager_id)
        self._instances: dict[str, _Instance] = {}
        self._idle: collections.deque[str] = collections.deque()
        self._leases: dict[str, tuple[str, str]] = {}  # lease id -> (instance id, client id)
        # (lease id, node id, future, priority, enqueued at), in arrival order; served by serve_order
        self._waiters: collections.deque[tuple[str, str | None, asyncio.Future, float | None, float]] = \
            collections.deque()
        self.priority_age_bound = DEFAULT_AGE_BOUND_S
        self._starting = 0
        self._promised = 0  # free slots handed to woken waiters that have not started yet
        self._cancelled: dict[str, float] = {}
        self._clients: set[str] = set()
        self._client_nodes: dict[str, str] = {}
        self._client_owners: dict[str, dict[str, Any]] = {}  # client id -> its process (see client_owner)
        self._sent: dict[str, set[str]] = {}  # client id -> the host ids whose handle it was sent
        # lease id -> (client id, an acquire_many request that waits for its grant: see collect)
        self._deferred: dict[str, tuple[str, asyncio.Task]] = {}
        self._live_nodes: set[str] = set()  # the cluster's live node ids, as last read (see _check_pin)
        # host id -> (its handle, [(instance id, done when it is back)]): the instances that came back this turn
        self._to_recycle: dict[str, tuple[Any, list[tuple[str, asyncio.Future]]]] = {}
        self._host_watches: dict[str, asyncio.Task] = {}  # host id -> the open wait_closed call on it
        self._recycling: set[str] = set()  # host ids with a recycle call on its way
        self._n_recycling = 0  # instances that came back and are not put back yet
        self._watch: asyncio.Task | None = None
        self._expiry: asyncio.TimerHandle | None = None  # the next max_idle_time check, while one is due
        self._globals: dict[str, str] = {}  # global key ("cluster" or a node id) -> lease id
        self._global_holders: dict[str, set[str]] = {}
        self._global_locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self._n = 0
        self._stats = {"acquires": 0, "started": 0, "reused": 0, "died": 0, "recycled": 0, "timeouts": 0, "cancelled": 0,
                       "wait_total": 0.0, "wait_max": 0.0, "start_total": 0.0, "peak_live": 0, "peak_in_use": 0,
                       "acquire_calls": 0, "release_calls": 0, "recycle_calls": 0, "replaced_on_host": 0}

    # ------------------------------------------------------------------ acquire / release
    def _live(self) -> int:
        return len(self._instances) + self._starting + self._promised

    async def acquire(self, lease_id: str, client_id: str, timeout: float | None = None,
                      node_id: str | None = None, priority: float | None = None, snapshot: bool = True) -> Grant:
        """Lease one instance (on ``node_id`` when given), waiting while the pool is full: FIFO, or larger
        ``priority`` first (with the age bound of :mod:`agentfly_gym.resources.priority`).

        Raises:
            ResourceTimeout: no instance within ``timeout`` seconds.
            ResourceStartError: a new instance failed to start, or ``node_id`` is not a live node of the cluster.
            PoolClosedError: the pool shut down.
            ResourceError: the acquisition was cancelled by its client.
        """
        t0 = time.monotonic()
        if node_id is not None:
            await self._check_pin(node_id)
        deadline = None if timeout is None else t0 + timeout
        have_slot = False
        handed: str | None = None
        try:
            while True:
                if self._closed:
                    raise PoolClosedError(f"the cluster pool of {self.spec.label} is closed")
                if lease_id in self._cancelled:
                    raise ResourceError(f"acquisition {lease_id} of {self.spec.label} was cancelled by its client")
                iid = handed
                handed = None
                if iid is None and not have_slot and not self._waiters:
                    iid = self._take_idle(node_id)
                    if iid is None and self._live() < self.capacity:
                        self._starting += 1
                        have_slot = True
                    elif iid is None and node_id is not None and self._idle:
                        # full, with idle instances only on other nodes: retire one to start here
                        await self._discard(self._idle[0])
                        continue
                if iid is not None:  # reset on its host when it came back: ready (a failed grant puts it back)
                    return self._grant(lease_id, client_id, self._instances[iid], t0, snapshot)
                if have_slot:
                    have_slot = False
                    inst = await self._start(node_id, deadline)  # consumes the reservation
                    return self._grant(lease_id, client_id, inst, t0, snapshot)
                handed, have_slot = await self._wait(lease_id, node_id, deadline, priority)
        except BaseException:
            if have_slot:
                self._starting -= 1
                self._wake()
            if handed is not None:
                self._put_back(handed)
            raise

    def _in_serve_order(self) -> list[tuple[str, str | None, asyncio.Future, float | None, float]]:
        return serve_order(self._waiters, lambda e: (e[3], e[4]), now=time.monotonic(),
                           age_bound=self.priority_age_bound)

    def set_priority_age_bound(self, seconds: float | None) -> None:
        """Seconds after which a waiter is served in arrival order before prioritised ones (None: never)."""
        self.priority_age_bound = None if seconds is None else float(seconds)

    async def acquire_many(self, client_id: str, requests: list[tuple]) -> tuple[list[Any], dict[str, Any]]:
        """Several acquisitions in one call: each request is ``(lease_id, timeout, node_id, priority)`` as the
        arguments of :meth:`acquire`.  Returns ``(outcomes, snapshot)``: per request, in order, a :class:`Grant`
        (an idle instance was free and nobody waited), an exception (as :meth:`acquire` raises it), or None: the
        acquisition waits here as :meth:`acquire` would (same FIFO or priority order), and the client fetches its
        grant with :meth:`collect` (and gives it up with :meth:`cancel`, as any acquisition).  When every waiter
        will be served by an instance being reset now (a saturated pool in steady state), the call waits for those
        resets (up to :data:`RESET_WAIT_S`) and answers with the grants, which spares a ``collect`` call each."""
        out: list[Any] = []
        now = time.monotonic()
        self._stats["acquire_calls"] += 1
        waiting: list[tuple[int, str, asyncio.Task]] = []
        for lease_id, timeout, node_id, priority in requests:
            if not self._closed and not self._waiters and lease_id not in self._cancelled:
                iid = self._take_idle(node_id)
                if iid is not None:
                    try:
                        out.append(self._grant(lease_id, client_id, self._instances[iid], now, snapshot=False))
                    except ResourceError as e:
                        out.append(e)  # cancelled before it arrived (the grant put the instance back)
                    continue
            task = asyncio.ensure_future(self.acquire(lease_id, client_id, timeout, node_id, priority, False))
            self._deferred[lease_id] = (client_id, task)
            task.add_done_callback(lambda t, lid=lease_id: self._deferred_done(lid, t))
            waiting.append((len(out), lease_id, task))
            out.append(None)
        if waiting and len(self._waiters) + len(waiting) <= self._n_recycling:
            await asyncio.wait([t for _, _, t in waiting], timeout=RESET_WAIT_S)
            for i, lease_id, task in waiting:
                if task.done() and not task.cancelled():
                    out[i] = task.exception() or task.result()
                    self._deferred.pop(lease_id, None)
        return out, self.snapshot(instances=False)

    def _deferred_done(self, lease_id: str, task: asyncio.Task) -> None:
        if not task.cancelled():
            task.exception()  # retrieved (no "never retrieved" warning); kept for collect(), which raises it
        entry = self._deferred.get(lease_id)
        if entry is not None and entry[0] not in self._clients:  # its client detached: nobody will collect it
            self._deferred.pop(lease_id, None)

    async def collect(self, lease_id: str) -> Grant:
        """The grant of a waiting :meth:`acquire_many` request (waits for it).

        Raises:
            ResourceError: no such request is pending (never sent, cancelled, or already collected); else as
                :meth:`acquire` raises.
        """
        entry = self._deferred.get(lease_id)
        if entry is None:
            raise ResourceError(f"acquisition {lease_id} of {self.spec.label} is not pending here")
        task = entry[1]
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._deferred.pop(lease_id, None)

    async def _wait(self, lease_id: str, node_id: str | None, deadline: float | None,
                    priority: float | None = None) -> tuple[str | None, bool]:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = (lease_id, node_id, fut, priority, time.monotonic())
        self._waiters.append(entry)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            kind, iid = await asyncio.wait_for(asyncio.shield(fut), remaining)
        except (TimeoutError, asyncio.CancelledError) as e:
            if entry in self._waiters:
                self._waiters.remove(entry)
            if fut.done() and not fut.cancelled():  # woken just as it gave up: pass the gift on
                kind, iid = fut.result()
                if kind == "instance":
                    self._put_back(iid)
                else:
                    self._promised -= 1
                    self._wake()
            if fut.cancelled():  # aclose() or cancel() (on the client's behalf) dropped this wait
                if self._closed:
                    raise PoolClosedError(f"the cluster pool of {self.spec.label} shut down") from None
                raise ResourceError(f"acquisition {lease_id} of {self.spec.label} was cancelled by its client") from None
            if isinstance(e, TimeoutError):
                self._stats["timeouts"] += 1
                raise ResourceTimeout(
                    f"no instance of {self.spec.label} became free within the acquire timeout "
                    f"(cluster capacity {self.capacity}, in use {len(self._leases)}, waiting {len(self._waiters)})") from None
            raise
        if fut.cancelled():
            raise ResourceError(f"acquisition {lease_id} of {self.spec.label} was cancelled by its client")
        if kind == "instance":
            return iid, False
        self._promised -= 1
        self._starting += 1
        return None, True

    def _take_idle(self, node_id: str | None) -> str | None:
        for iid in list(self._idle):
            if node_id is None or self._instances[iid].node_id == node_id:
                self._idle.remove(iid)
                return iid
        return None

    async def _start(self, node_id: str | None, deadline: float | None) -> _Instance:
        """Start one instance on a reserved slot (``self._starting`` was counted by the caller)."""
        self._n += 1
        iid = f"{self.spec.kind}-{self._n}"
        t0 = time.monotonic()
        limit = self.spec.start_timeout
        try:
            placed = await asyncio.wait_for(self.hosting.start(iid, node_id), limit)
        except BaseException as e:
            self._starting -= 1
            self._wake()
            if isinstance(e, TimeoutError):
                raise ResourceStartError(
                    f"{self.spec.label}: no instance was running within start_timeout={limit}s; is there a node with "
                    f"free resources {self.placement.actor_options()}" + (f" on node {node_id}" if node_id else "")
                    + "?") from None
            if isinstance(e, ResourceError):
                raise
            if isinstance(e, Exception):
                raise ResourceStartError(f"{self.spec.label}: starting an instance failed: {type(e).__name__}: {e}") from None
            raise
        self._starting -= 1
        if self._closed:  # closed while it started: aclose() did not see it, so it is stopped here
            await self.hosting.stop(iid, placed)
            raise PoolClosedError(f"the cluster pool of {self.spec.label} shut down")
        inst = _Instance(iid, placed)
        self._instances[iid] = inst
        self._watch_host(placed)
        self._stats["started"] += 1
        self._stats["start_total"] += time.monotonic() - t0
        self._stats["peak_live"] = max(self._stats["peak_live"], len(self._instances))
        return inst

    def _grant(self, lease_id: str, client_id: str, inst: _Instance, t0: float, snapshot: bool = True) -> Grant:
        if self._closed:  # shut down while the instance was reset or started: aclose() stopped it
            raise PoolClosedError(f"the cluster pool of {self.spec.label} shut down")
        if client_id != "__global__" and client_id not in self._clients:  # it detached while this waited
            self._put_back(inst.id)
            raise PoolClosedError(f"client {client_id} of {self.spec.label} detached; its acquisition ends")
        if inst.uses:
            self._stats["reused"] += 1
        inst.uses += 1
        self._leases[lease_id] = (inst.id, client_id)
        self._stats["peak_in_use"] = max(self._stats["peak_in_use"], len(self._leases))
        waited = time.monotonic() - t0
        self._stats["acquires"] += 1
        self._stats["wait_total"] += waited
        self._stats["wait_max"] = max(self._stats["wait_max"], waited)
        if self._cancelled.pop(lease_id, None) is not None:  # the client gave up while it was being prepared
            self._leases.pop(lease_id, None)
            self._put_back(inst.id)
            raise ResourceError(f"acquisition {lease_id} of {self.spec.label} was cancelled by its client")
        sent = self._sent.setdefault(client_id, set())
        handle = None if inst.placed.host_id in sent else inst.handle
        sent.add(inst.placed.host_id)
        return Grant(lease_id, inst.id, handle, inst.node_id, inst.pid, inst.uses, waited,
                     self.snapshot(instances=False) if snapshot else {}, inst.placed.host_id)

    def host_handle(self, host_id: str) -> Any:
        """The handle of host ``host_id`` (for a client that lacks it), or None when no live instance has it."""
        for inst in self._instances.values():
            if inst.placed.host_id == host_id:
                return inst.handle
        return None

    def _put_back(self, iid: str) -> None:
        """An instance is ready (new, or reset on its host): hand it to the first waiter that can take it, else
        keep it idle."""
        inst = self._instances.get(iid)
        if inst is None:
            return
        for entry in self._in_serve_order():
            _lid, node, fut = entry[:3]
            if node is None or node == inst.node_id:
                self._waiters.remove(entry)
                fut.set_result(("instance", iid))
                return
        inst.idle_since = time.monotonic()
        self._idle.append(iid)
        self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        """Schedule :meth:`_expire_idle` for when the longest-idle instance reaches ``spec.max_idle_time``."""
        ttl = self.spec.max_idle_time
        if ttl is None or self._closed or len(self._idle) <= self.spec.min_idle or self._expiry is not None:
            return
        oldest = min(self._instances[i].idle_since for i in self._idle)
        delay = max(0.0, oldest + ttl - time.monotonic())
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire_idle)

    def _expire_idle(self) -> None:
        """Stop the instances idle for ``spec.max_idle_time`` seconds or more, oldest first, keeping
        ``spec.min_idle`` idle ones (as the local pool does)."""
        self._expiry = None
        if self._closed:
            return
        ttl = self.spec.max_idle_time
        now = time.monotonic()
        for iid in sorted(self._idle, key=lambda i: self._instances[i].idle_since):
            if len(self._idle) <= self.spec.min_idle:
                break
            if now - self._instances[iid].idle_since >= ttl:
                self._idle.remove(iid)  # nobody takes it while it stops; it counts as live until then
                self._stats["recycled"] += 1
                asyncio.get_running_loop().create_task(self._discard(iid))
        self._schedule_expiry()

    def _wake(self) -> None:
        """A slot came free: give it to the first waiter (who starts a new instance), else idle instances stay."""
        while self._waiters and self._live() < self.capacity:
            entry = self._in_serve_order()[0]
            self._waiters.remove(entry)
            self._promised += 1
            entry[2].set_result(("slot", None))
        if self._waiters and self._idle and self._live() >= self.capacity:
            # full of idle instances pinned elsewhere: retire one so a waiter pinned to a node can start
            first_node = self._in_serve_order()[0][1]
            if first_node is not None and not any(self._instances[i].node_id == first_node for i in self._idle):
                asyncio.get_running_loop().create_task(self._discard(self._idle.popleft()))

    async def release(self, lease_id: str, discard: bool = False, host_died: bool = False) -> None:
        """Return a lease; ``discard=True`` stops the instance (it died or its state is unknown); ``host_died``:
        the client found the instance's host actor dead, so the host's idle instances are discarded too.  Returns
        when the instance is back (reset on its host) or stopped."""
        back = self._take_back(lease_id, discard, host_died)
        if back is not None:
            await back

    def _take_back(self, lease_id: str, discard: bool, host_died: bool) -> Any:
        """:meth:`release` up to its first wait: what to await (None: nothing)."""
        entry = self._leases.pop(lease_id, None)
        if entry is None:
            return None
        iid, _client = entry
        inst = self._instances.get(iid)
        if discard or self._closed:
            if discard:
                self._stats["died"] += 1
            return self._discard(iid, inst.handle if host_died and inst is not None else None)
        if inst is not None and self.spec.max_uses is not None and inst.uses >= self.spec.max_uses:
            return self._discard(iid)
        done = self._recycle(iid)
        return None if done is None else asyncio.shield(done)

    async def release_many(self, releases: list[tuple[str, bool, bool]]) -> None:
        """Several :meth:`release` calls in one: each is ``(lease_id, discard, host_died)``; the instances kept
        are reset on their hosts in one call per host.  Returns when every one is back or stopped."""
        self._stats["release_calls"] += 1
        backs = [b for b in (self._take_back(*r) for r in releases) if b is not None]
        if backs:
            await asyncio.gather(*backs, return_exceptions=True)

    def cancel(self, lease_id: str) -> None:
        """The client gave up on acquisition ``lease_id``: drop its wait, or return what it was granted (also a
        grant that :meth:`acquire_many` made and nobody collected)."""
        self._stats["cancelled"] += 1
        self._deferred.pop(lease_id, None)  # its client will not collect it: a grant is released below, a wait
        # dropped, or a start still under way marked cancelled (its _grant puts the instance back)
        if lease_id in self._leases:
            asyncio.get_running_loop().create_task(self.release(lease_id))
            return
        for entry in list(self._waiters):
            if entry[0] == lease_id:
                self._waiters.remove(entry)
                entry[2].cancel()
                return
        now = time.monotonic()
        self._cancelled = {k: t for k, t in self._cancelled.items() if now - t < 3600}
        self._cancelled[lease_id] = now  # still starting or resetting: _grant returns it

    async def _discard(self, iid: str, dead_host: Any = None) -> None:
        """Stop instance ``iid``; ``dead_host``: its host was found dead (its idle instances go too)."""
        inst = self._instances.pop(iid, None)
        if iid in self._idle:
            self._idle.remove(iid)
        if inst is not None:
            await self.hosting.stop(iid, inst.placed)
        self._wake()
        if dead_host is not None and not self._closed:
            await self._host_died(dead_host)

    async def _host_died(self, handle: Any) -> None:
        """A host actor was found dead: every idle instance it held is gone too (the leased ones are discarded
        when their clients' calls fail); the next start makes a new host."""
        self.hosting.lost(handle)
        for iid in [i for i in self._idle if self._instances[i].handle == handle]:
            self._stats["died"] += 1
            await self._discard(iid)

    # ------------------------------------------------------------------ globals
    async def acquire_global(self, key: str, client_id: str, node_id: str | None = None,
                             timeout: float | None = None) -> Grant:
        """The shared instance for ``key`` (``"cluster"``, or a node id with ``node_id`` set), started once."""
        lock = self._global_locks.setdefault(key, asyncio.Lock())
        async with lock:
            lease_id = self._globals.get(key)
            if lease_id is not None and lease_id in self._leases:
                self._global_holders.setdefault(key, set()).add(client_id)
                iid = self._leases[lease_id][0]
                inst = self._instances[iid]
                return Grant(lease_id, iid, inst.handle, inst.node_id, inst.pid, inst.uses, 0.0,
                             self.snapshot(instances=False), inst.placed.host_id)
            lease_id = f"global-{key}-{self._n + 1}-{time.monotonic_ns()}"
            grant = await self.acquire(lease_id, "__global__", timeout, node_id)
            grant.handle = self._instances[grant.instance_id].handle  # each client asking gets the handle
            self._globals[key] = lease_id
            self._global_holders.setdefault(key, set()).add(client_id)
            return grant

    async def destroy_global(self, key: str, discard: bool = True) -> None:
        """Destroy the shared instance for ``key`` (also when one holder found it dead): its lease goes back
        with ``discard`` (default True), so the instance is stopped, not kept for reuse."""
        lease_id = self._globals.pop(key, None)
        self._global_holders.pop(key, None)
        if lease_id is not None:
            await self.release(lease_id, discard=discard)

    # ------------------------------------------------------------------ metrics, close
    def snapshot(self, instances: bool = True) -> dict[str, Any]:
        """Cluster-wide: in use, idle, waiting, starting, live, capacity, started, reused, died (stopped as dead or
        after a failed reset: the pool starts another), replaced on host (their reset failed or they were unhealthy,
        so their host's local pool started a new one in place), peak live,
        acquire wait mean/max and start mean (seconds), clients, the calls that brought acquisitions and releases
        and that reset instances on their hosts (each carries a batch: see :mod:`.batching`); plus the figures
        runner summaries read under the local pool's names (``max_in_use``, ``acquired``, ``acquire_wait_total``,
        ... as in ``PoolMetrics``).
        ``instances=False`` leaves the per-instance table empty (what a grant carries: a cheap copy)."""
        s = self._stats
        return {"spec": self._label, "capacity": self.capacity, "in_use": len(self._leases),
                "idle": len(self._idle), "waiting": len(self._waiters), "starting": self._starting,
                "live": len(self._instances), "started": s["started"], "reused": s["reused"], "died": s["died"],
                "recycled": s["recycled"],
                "acquires": s["acquires"], "timeouts": s["timeouts"], "cancelled": s["cancelled"],
                "peak_live": s["peak_live"], "wait_mean": s["wait_total"] / s["acquires"] if s["acquires"] else 0.0,
                "wait_max": s["wait_max"], "start_mean": s["start_total"] / s["started"] if s["started"] else 0.0,
                "clients": len(self._clients), "hosting": self.hosting.mode, "hosts": self.hosting.hosts,
                "acquire_calls": s["acquire_calls"], "release_calls": s["release_calls"],
                "recycle_calls": s["recycle_calls"], "replaced_on_host": s["replaced_on_host"],
                # the local pool's names for the same figures (PoolMetrics), so one summary reads either manager
                "key": self._key, "label": self._label, "max_in_use": s["peak_in_use"],
                "acquired": s["acquires"], "acquire_wait_total": s["wait_total"], "acquire_wait_max": s["wait_max"],
                "start_time_total": s["start_total"], "replaced": s["died"] + s["replaced_on_host"],
                "instances": {i.id: {"node_id": i.node_id, "pid": i.pid, "uses": i.uses}
                              for i in self._instances.values()} if instances else {}}

    async def aclose(self) -> None:
        """Stop every instance and fail every waiter; the pool accepts nothing afterwards."""
        self._closed = True
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        while self._waiters:
            fut = self._waiters.popleft()[2]
            if not fut.done():
                fut.cancel()
        self._leases.clear()
        self._idle.clear()
        for _handle, items in self._to_recycle.values():  # never sent: their releases return now
            for _iid, done in items:
                if not done.done():
                    done.set_result(None)
        self._to_recycle.clear()
        for task in list(self._host_watches.values()) + [t for _, t in self._deferred.values()]:
            if task is not asyncio.current_task():
                task.cancel()
        insts, self._instances = list(self._instances.values()), {}
        await self.hosting.aclose([i.placed for i in insts])


_classes: dict[str, Any] = {}


def pool_actor_class() -> Any:
    """``ray.remote(PoolActor)``, made on first use."""
    if "pool" not in _classes:
        import ray

        _classes["pool"] = ray.remote(max_restarts=0)(PoolActor)
    return _classes["pool"]


