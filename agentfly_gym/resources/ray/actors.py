"""The pool actor of the cluster-wide manager: one per spec key and namespace.

``PoolActor`` (a named actor) is the only place that decides how many instances of a spec live in the
cluster: it caps them at ``spec.max_instances``, queues acquisitions FIFO, resets an instance before handing
it out again, and replaces dead ones.  Instances live in host actors (:mod:`.host`): one per node the pool uses
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
from . import _compat
from .hosting import Placed, make_hosting
from .placement import RayPlacement

__all__ = ["PoolActor", "pool_actor_class", "Grant"]

log = logging.getLogger(__name__)

#: seconds between two checks that a pool's clients (their nodes, their processes) are alive
CLIENT_NODE_CHECK = 5.0


def client_owner() -> dict[str, Any]:
    """Who this process is to Ray, for :meth:`PoolActor.attach`: ``worker_id`` and ``job_id`` (hex), and whether it
    is the job's driver (else a worker: a task's or an actor's process)."""
    import ray

    ctx = ray.get_runtime_context()
    return {"worker_id": ctx.get_worker_id(), "job_id": ctx.get_job_id(), "driver": ctx.worker.mode == ray.SCRIPT_MODE}


def dead_owners(owners: dict[str, dict[str, Any]]) -> list[str]:
    """The clients (of ``owners``: client id -> :func:`client_owner`) whose process has ended, as the cluster's
    control store (GCS) records it: a driver whose job is dead, a worker that is no longer among the live
    workers (read by :mod:`._compat`, which needs no dashboard).  Blocking: run it in a thread.
    """
    jobs = _compat.job_is_dead()
    workers = _compat.live_worker_ids() if any(not o.get("driver", True) for o in owners.values()) else set()
    return [client for client, o in owners.items()
            if jobs.get(o.get("job_id"), False) or (not o.get("driver", True) and o.get("worker_id") not in workers)]


@dataclasses.dataclass
class Grant:
    """What :meth:`PoolActor.acquire` hands a client: the lease id, the instance's id and its host actor (every
    call on the host names the instance by ``instance_id``).  ``handle`` is None when this client was sent the
    host's handle before (each grant that carries a handle costs Ray a borrower registration); the client keeps
    handles by ``host_id``, and asks :meth:`PoolActor.host_handle` for one it lacks."""

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


class PoolActor:
    """The cluster-wide pool of one spec: cap, FIFO waiting, reset on reuse, cancellation, dead instances.

    Every client (a :class:`~agentfly_gym.resources.ray.RayResourceManager` in any process) attaches to
    the pool by name; :meth:`acquire` grants a lease on one instance, :meth:`release` returns it (reset
    happens when it is handed out again, as in the local pool).  An acquisition that its client gave up
    (cancelled, timed out on the client side) is cancelled with :meth:`cancel` by the same lease id: if
    it was already granted, the instance comes back at once, so no lease is stranded.  The pool ends its
    instances when the last client detaches (or when it is killed: its hosts and reservations share its fate).
    ``hosting`` (``"node"`` or ``"instance"``) chooses the hosts (:func:`.hosting.make_hosting`).
    """

    def __init__(self, spec: ResourceSpec, placement: RayPlacement, manager_id: str, hosting: str = "node") -> None:
        self.spec = spec
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
        self._watch: asyncio.Task | None = None
        self._expiry: asyncio.TimerHandle | None = None  # the next max_idle_time check, while one is due
        self._globals: dict[str, str] = {}  # global key ("cluster" or a node id) -> lease id
        self._global_holders: dict[str, set[str]] = {}
        self._global_locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self._n = 0
        self._stats = {"acquires": 0, "started": 0, "reused": 0, "died": 0, "recycled": 0, "timeouts": 0, "cancelled": 0,
                       "wait_total": 0.0, "wait_max": 0.0, "start_total": 0.0, "peak_live": 0, "peak_in_use": 0}

    # ------------------------------------------------------------------ clients
    def attach(self, client_id: str, node_id: str | None = None, owner: dict[str, Any] | None = None) -> bool:
        """Register a client (on Ray node ``node_id``, in the process ``owner`` describes: see :func:`client_owner`);
        False when the pool is shutting down (the client then makes a new one)."""
        if self._closed:
            return False
        self._clients.add(client_id)
        if node_id:
            self._client_nodes[client_id] = node_id
        if owner:
            self._client_owners[client_id] = dict(owner)
        if (node_id or owner) and self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_clients())
        return True

    async def _watch_clients(self) -> None:
        """Every ``CLIENT_NODE_CHECK`` seconds: a client whose node died, or whose process ended without detaching
        (SIGKILL, a crash), is detached: its leases come back."""
        import ray

        while not self._closed:
            await asyncio.sleep(CLIENT_NODE_CHECK)
            if self._client_nodes:
                try:
                    nodes = await asyncio.to_thread(ray.nodes)
                except Exception:  # noqa: BLE001 - GCS busy: try again next round
                    nodes = None
                if nodes is not None:
                    alive = {n["NodeID"] for n in nodes if n.get("Alive")}
                    for client, node in list(self._client_nodes.items()):
                        if node not in alive:
                            log.warning("%s: client %s was on node %s, which died; returning its leases",
                                        self.spec.label, client, node[:12])
                            self._client_nodes.pop(client, None)
                            await self.detach(client)
            owners = {c: o for c, o in self._client_owners.items() if c in self._clients}
            if owners and not self._closed:
                try:
                    dead = await asyncio.to_thread(dead_owners, owners)
                except Exception:  # noqa: BLE001 - GCS busy or its tables changed shape: try again next round
                    log.debug("%s: checking the clients' processes failed", self.spec.label, exc_info=True)
                    dead = []
                for client in dead:
                    if client in self._clients:
                        o = owners[client]
                        log.warning("%s: the %s process of client %s ended without detaching; returning its leases",
                                    self.spec.label, "driver" if o.get("driver") else "worker", client)
                        await self.detach(client)

    async def detach(self, client_id: str) -> int:
        """Forget a client: release its leases and its global holds.  Returns the clients left; at 0 the pool
        stops every instance and refuses new work (the caller then kills the actor)."""
        self._clients.discard(client_id)
        self._client_nodes.pop(client_id, None)
        self._client_owners.pop(client_id, None)
        self._sent.pop(client_id, None)
        for lease_id, (_iid, cid) in list(self._leases.items()):
            if cid == client_id:
                await self.release(lease_id)
        for key, holders in list(self._global_holders.items()):
            holders.discard(client_id)
            if not holders:
                await self.destroy_global(key)
        if not self._clients:
            await self.aclose()
        return len(self._clients)

    # ------------------------------------------------------------------ acquire / release
    def _live(self) -> int:
        return len(self._instances) + self._starting + self._promised

    async def acquire(self, lease_id: str, client_id: str, timeout: float | None = None,
                      node_id: str | None = None, priority: float | None = None) -> Grant:
        """Lease one instance (on ``node_id`` when given), waiting while the pool is full: FIFO, or larger
        ``priority`` first (with the age bound of :mod:`agentfly_gym.resources.priority`).

        Raises:
            ResourceTimeout: no instance within ``timeout`` seconds.
            ResourceStartError: a new instance failed to start.
            PoolClosedError: the pool shut down.
            ResourceError: the acquisition was cancelled by its client.
        """
        t0 = time.monotonic()
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
                if iid is not None:
                    handed = iid  # put back if cancelled during the reset
                    inst = await self._reset(iid)
                    handed = None
                    if inst is None:
                        continue  # died or failed its reset: it was discarded, try again (its slot is free)
                    return self._grant(lease_id, client_id, inst, t0)
                if have_slot:
                    have_slot = False
                    inst = await self._start(node_id, deadline)  # consumes the reservation
                    return self._grant(lease_id, client_id, inst, t0)
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

    async def _reset(self, iid: str) -> _Instance | None:
        inst = self._instances[iid]
        if inst.uses == 0:
            return inst
        try:
            await asyncio.wait_for(inst.handle.reset.remote(iid), self.spec.start_timeout)
        except Exception as e:  # noqa: BLE001 - a dead node, a failed reset: replace the instance
            log.warning("%s: instance %s failed its reset on reuse (%s: %s); discarding it", self.spec.label, iid,
                        type(e).__name__, e)
            self._stats["died"] += 1
            await self._discard(iid)
            if isinstance(e, ray_actor_error()):
                await self._host_died(inst.handle)
            return None
        self._stats["reused"] += 1
        return inst

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
        self._stats["started"] += 1
        self._stats["start_total"] += time.monotonic() - t0
        self._stats["peak_live"] = max(self._stats["peak_live"], len(self._instances))
        return inst

    def _grant(self, lease_id: str, client_id: str, inst: _Instance, t0: float) -> Grant:
        if self._closed:  # shut down while the instance was reset or started: aclose() stopped it
            raise PoolClosedError(f"the cluster pool of {self.spec.label} shut down")
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
                     self.snapshot(instances=False), inst.placed.host_id)

    def host_handle(self, host_id: str) -> Any:
        """The handle of host ``host_id`` (for a client that lacks it), or None when no live instance has it."""
        for inst in self._instances.values():
            if inst.placed.host_id == host_id:
                return inst.handle
        return None

    def _put_back(self, iid: str) -> None:
        """An instance came free: hand it to the first waiter that can take it, else park it idle."""
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
        try:
            inst.handle.park.remote(iid)
        except Exception:  # noqa: BLE001, S110 - a dead host is found on the next reset
            pass
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

    async def release(self, lease_id: str, discard: bool = False) -> None:
        """Return a lease; ``discard=True`` stops the instance (it died or its state is unknown)."""
        entry = self._leases.pop(lease_id, None)
        if entry is None:
            return
        iid, _client = entry
        if discard or self._closed:
            if discard:
                self._stats["died"] += 1
            await self._discard(iid)
            return
        inst = self._instances.get(iid)
        if inst is not None and self.spec.max_uses is not None and inst.uses >= self.spec.max_uses:
            await self._discard(iid)
            return
        self._put_back(iid)

    def cancel(self, lease_id: str) -> None:
        """The client gave up on acquisition ``lease_id``: drop its wait, or return what it was granted."""
        self._stats["cancelled"] += 1
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

    async def _discard(self, iid: str) -> None:
        inst = self._instances.pop(iid, None)
        if iid in self._idle:
            self._idle.remove(iid)
        if inst is not None:
            await self.hosting.stop(iid, inst.placed)
        self._wake()

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
        """Cluster-wide: in use, idle, waiting, starting, live, capacity, started, reused, died, peak live,
        acquire wait mean/max and start mean (seconds), clients; plus the figures runner summaries read under
        the local pool's names (``max_in_use``, ``acquired``, ``acquire_wait_total``, ... as in ``PoolMetrics``).
        ``instances=False`` leaves the per-instance table empty (what a grant carries: a cheap copy)."""
        s = self._stats
        return {"spec": self.spec.label, "capacity": self.capacity, "in_use": len(self._leases),
                "idle": len(self._idle), "waiting": len(self._waiters), "starting": self._starting,
                "live": len(self._instances), "started": s["started"], "reused": s["reused"], "died": s["died"],
                "recycled": s["recycled"],
                "acquires": s["acquires"], "timeouts": s["timeouts"], "cancelled": s["cancelled"],
                "peak_live": s["peak_live"], "wait_mean": s["wait_total"] / s["acquires"] if s["acquires"] else 0.0,
                "wait_max": s["wait_max"], "start_mean": s["start_total"] / s["started"] if s["started"] else 0.0,
                "clients": len(self._clients), "hosting": self.hosting.mode, "hosts": self.hosting.hosts,
                # the local pool's names for the same figures (PoolMetrics), so one summary reads either manager
                "key": self.spec.key, "label": self.spec.label, "max_in_use": s["peak_in_use"],
                "acquired": s["acquires"], "acquire_wait_total": s["wait_total"], "acquire_wait_max": s["wait_max"],
                "start_time_total": s["start_total"],
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
        insts, self._instances = list(self._instances.values()), {}
        await self.hosting.aclose([i.placed for i in insts])


def ray_actor_error() -> type:
    import ray

    return ray.exceptions.RayActorError


_classes: dict[str, Any] = {}


def pool_actor_class() -> Any:
    """``ray.remote(PoolActor)``, made on first use."""
    if "pool" not in _classes:
        import ray

        _classes["pool"] = ray.remote(max_restarts=0)(PoolActor)
    return _classes["pool"]


