"""A resource manager for a whole Ray cluster, behind the API of :class:`~agentfly_gym.resources.ResourceManager`.

    import ray
    from agentfly_gym.resources.ray import RayResourceManager

    ray.init()                                          # or run inside a Ray job (a verl worker)
    async with RayResourceManager(placement={"container": {"resources": {"docker": 1}}}) as manager:
        async with manager.scope("rollout-17") as scope:
            box = await scope.acquire(ContainerSpec(image="agentfly/base", max_instances=64))
            print((await box.exec("echo hi")).output)  # runs on the node that hosts the container

Every process of a Ray job that makes a ``RayResourceManager`` (every verl agent-loop worker, on every
node) attaches to the same per-spec pools: named Ray actors ``agentfly-pool-<spec key>`` in the job's
namespace, so ``max_instances`` caps the whole cluster, not each process.  An instance lives on a node chosen
by Ray resources (:class:`RayPlacement`), in the pool's host actor there (one per node and pool; or one per
instance with ``hosting="instance"``, see :mod:`.hosting`); calls on it
(``call``/``run``/``exec``/``put_files``/``get_file``, several at once with ``batch``) run there, and only their
arguments and results travel.  Waiting is FIFO across processes, an instance is reset on its host as it comes back
(:mod:`.recycling`) and requests travel in batches (:mod:`.batching`), a cancelled
acquisition never strands an instance, and an instance whose actor or node died raises
:class:`~agentfly_gym.errors.ResourceDied` on its next call (environments turn that into a truncated
episode with ``info["error"]``) and is replaced by a fresh one wherever Ray finds room.

Lifetime: a pool actor is owned by the process that made it (unless ``detached=True``) and its instances by
the pool, so a driver that exits, is killed or gets SIGTERM takes them with it (on SIGTERM and at exit the
manager first detaches, so hosts release their containers and processes in order).  When the manager starts a
local Ray itself (``ray.init``), a SIGTERM during that start is held until it has finished and then handled as any
other (see :func:`.start.start_ray`): ``agentfly-gym rollout`` still writes its summary and leaves no Ray process.  A
process that closes its manager returns its leases, and so does one whose node dies or whose process ends
without closing it (SIGKILL, a crash) while others keep the pool alive: every 5 s the pool checks its clients'
nodes and, in the cluster's tables, their processes (a driver's job, a worker's id).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import types
import uuid
from typing import Any

from ...errors import ConfigError, PoolClosedError, ResourceError
from ..base import Resource
from ..spec import ResourceSpec
from .. import teardown
from ..protocol import Manager
from ..scope import RolloutScope
from .actors import Grant, pool_actor_class
from .clients import client_owner
from .batching import PoolRequests
from .hosting import HOSTINGS
from .start import start_ray
from .placement import PlacementTable, RayPlacement, resolve_placement
from .resource import RayResource, _ray

__all__ = ["RayResourceManager", "RayRolloutScope", "RayPool", "RayResource"]

log = logging.getLogger(__name__)

_HEAD = "node:__internal_head__"


async def _as_future(ref: Any) -> Any:
    try:
        return await ref
    except Exception:  # noqa: BLE001 - a release into a dead pool: nothing left to wait for
        return None


class RayPool:
    """This process's face of one cluster pool (a named ``PoolActor``); made by :meth:`RayResourceManager.pool`.

    Attributes:
        spec: the pool's spec.
        capacity: ``spec.max_instances``, the cap over the whole cluster.
        handle: the pool actor.
        metrics: the last cluster-wide snapshot seen by this process (attributes ``in_use``, ``idle``,
            ``waiting``, ``live``, ...); :meth:`fetch_snapshot` asks for a fresh one.
    """

    def __init__(self, manager: RayResourceManager, spec: ResourceSpec, placement: RayPlacement) -> None:
        self.manager = manager
        self.spec = spec
        self.capacity = spec.max_instances
        self.placement = placement
        self.handle = manager._pool_handle(spec, placement)  # found or made; attached on first use
        self._attached = False
        self._attach_lock = asyncio.Lock()
        self._snapshot: dict[str, Any] = {"capacity": self.capacity, "in_use": 0, "idle": 0, "waiting": 0, "live": 0}
        self._leases: dict[str, RayResource] = {}
        self._pending: list[Any] = []  # releases sent and not yet confirmed (an async actor may reorder calls)
        self._requests = PoolRequests(self)  # acquisitions and releases, sent once per event-loop turn
        self.closed = False

    @property
    def metrics(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(**self._snapshot)

    def snapshot(self) -> dict[str, Any]:
        """The last cluster-wide snapshot seen by this process (see :meth:`fetch_snapshot`)."""
        return dict(self._snapshot)

    async def fetch_snapshot(self) -> dict[str, Any]:
        """A fresh cluster-wide snapshot: in use, idle, waiting, starting, live, capacity, started, reused, died,
        peak live, acquire wait mean/max and start mean (seconds), per-instance node and pid.  This process's
        releases made before the call are counted."""
        self._requests.send_releases()
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.wait([asyncio.ensure_future(_as_future(r)) for r in pending], timeout=10)
        self._snapshot = await self.handle.snapshot.remote()
        return dict(self._snapshot)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait (blocking, up to ``timeout`` seconds) until the pool has processed this process's releases."""
        self._requests.send_releases()
        pending, self._pending = self._pending, []
        if pending:
            _ray().wait(pending, num_returns=len(pending), timeout=timeout)

    async def set_priority_age_bound(self, seconds: float | None) -> None:
        """Set the cluster pool's age bound, for every process using it: a waiting acquisition that has waited
        ``seconds`` is served in arrival order before prioritised ones (None: never; default
        :data:`~agentfly_gym.resources.priority.DEFAULT_AGE_BOUND_S`), as ``ResourcePool.priority_age_bound``."""
        await self.attach()
        await self.handle.set_priority_age_bound.remote(seconds)

    async def acquire(self, *, timeout: float | None = None, node_id: str | None = None,
                      priority: float | None = None) -> RayResource:
        """Lease an instance, waiting (across the cluster) while ``capacity`` instances are taken: FIFO, or
        larger ``priority`` first (see :mod:`agentfly_gym.resources.priority`; the cluster pool actor orders
        its waiters by it).

        Args:
            timeout: seconds to wait, None for the manager's default (None = no limit).
            node_id: only an instance on this Ray node.
            priority: the acquisition's priority while the pool is saturated; None: FIFO.

        Raises:
            ResourceTimeout, ResourceStartError, PoolClosedError: from the cluster pool.
        """
        if self.closed:
            raise PoolClosedError(f"the pool of {self.spec.label} is closed in this process")
        await self.attach()
        lease_id = f"{self.manager.id}-{uuid.uuid4().hex[:12]}"
        timeout = timeout if timeout is not None else self.manager.acquire_timeout
        grant = await self._requests.acquire(lease_id, timeout, node_id, priority)
        if grant.snapshot:
            self._snapshot = grant.snapshot
        res = RayResource(self, grant)
        self._leases[lease_id] = res
        return res

    async def attach(self) -> None:
        """Register this process with the cluster pool (once; without blocking the event loop).

        Raises:
            ResourceError: the pool kept shutting down (its last user was leaving) for about a minute.
        """
        if self._attached:
            return
        ray = _ray()
        async with self._attach_lock:
            for attempt in range(60):
                if self._attached:
                    return
                try:
                    if await self.handle.attach.remote(self.manager.id, ray.get_runtime_context().get_node_id(),
                                                       client_owner()):
                        self._attached = True
                        return
                except ray.exceptions.RayActorError:
                    pass
                # the pool is shutting down (its last user left); its name is free once it is gone
                await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
                self.handle = self.manager._pool_handle(self.spec, self.placement)
        raise ResourceError(f"could not attach to the cluster pool of {self.spec.label} in namespace "
                            f"{self.manager.namespace!r}")

    async def await_grant(self, ref: Any, lease_id: str) -> Grant:
        """The grant that ``ref`` (a call on the pool actor) answers for lease ``lease_id``; when cancelled, the
        lease is cancelled at the pool too.

        Raises:
            PoolClosedError, ResourceError: as :meth:`gone_error` makes them.
        """
        try:
            return await ref
        except asyncio.CancelledError:
            self.cancel_lease(lease_id)
            raise
        except (_ray().exceptions.RayActorError, _ray().exceptions.RayTaskError) as e:
            raise self.gone_error(e) from None

    def cancel_lease(self, lease_id: str) -> None:
        """Tell the pool (which keeps going) that this process gave up acquisition ``lease_id``: its wait is
        dropped, or its grant comes straight back."""
        try:
            self.handle.cancel.remote(lease_id)
        except Exception:  # noqa: BLE001, S110 - the pool is gone, and its instances with it
            pass

    def record_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Keep ``snapshot`` (an answer of the pool actor) as the last cluster-wide snapshot seen here."""
        self._snapshot = snapshot

    def track_release(self, ref: Any, *, done: Any) -> None:
        """Keep ``ref`` (a release call on its way) until confirmed, so :meth:`fetch_snapshot` and :meth:`settle`
        wait for it; those already confirmed (``done(ref)`` true) are dropped."""
        self._pending = [r for r in self._pending if not done(r)]
        self._pending.append(ref)

    def gone_error(self, e: BaseException) -> BaseException:
        """What an acquisition raises when a call on the pool failed with ``e`` (its own error, not Ray's wrapper)."""
        if isinstance(e, _ray().exceptions.RayTaskError) and isinstance(e.cause, Exception):
            return e.cause
        if not isinstance(e, _ray().exceptions.RayActorError):
            return e if isinstance(e, Exception) else PoolClosedError(f"the cluster pool of {self.spec.label} is gone")
        self.manager._forget(self)
        return PoolClosedError(f"the cluster pool of {self.spec.label} died ({type(e).__name__}); "
                               "the next acquisition makes a new one")

    def _release_nowait(self, res: RayResource, *, discard: bool = False) -> None:
        """:meth:`release` as a plain function: sends the lease back (one actor message) and returns without
        waiting, so a caller in this module that must not yield (a Ray scope's ``aclose`` under cancellation)
        can give back too.  Private: the public way is ``await pool.release(res)``, which never yields either."""
        if self._leases.pop(res.lease_id, None) is None:
            return
        self._requests.release(res.lease_id, discard or res.dead is not None, res.host_died)

    async def release(self, res: RayResource, *, discard: bool = False) -> None:
        """Return ``res``; ``discard=True`` stops the instance instead of reusing it."""
        self._release_nowait(res, discard=discard)

    async def prewarm(self, n: int | None = None) -> None:
        """Start ``n`` (default ``spec.min_idle``) instances now and leave them idle in the cluster pool."""
        n = self.spec.min_idle if n is None else n
        leases = await asyncio.gather(*(self.acquire() for _ in range(n)), return_exceptions=True)
        for r in leases:
            if isinstance(r, RayResource):
                self._release_nowait(r)


class RayRolloutScope(RolloutScope):
    """Resources held by one rollout, as :class:`~agentfly_gym.resources.RolloutScope` but leased from the
    cluster pools: the same instance per spec key for the whole scope, all returned when it ends.  Leases go
    back with ``_release_nowait`` (one actor message, no wait), so ``aclose`` never yields."""

    def _pool_of(self, key: str, lease: Resource) -> Any:
        return lease.pool

    async def _give_back(self, pool: Any, lease: Resource, *, discard: bool = False) -> None:
        pool._release_nowait(lease, discard=discard)


class RayResourceManager(Manager):
    """The resource manager of a Ray cluster: the API of :class:`~agentfly_gym.resources.ResourceManager`
    (``scope``, ``acquire_global``, ``pool``, ``pools``, ``metrics``, ``prewarm``, ``aclose``), with pools
    shared by every process of the job (the :class:`~agentfly_gym.resources.protocol.Manager` contract).

    Args:
        placement: where instances live: a mapping looked up by spec key, spec ``name``, spec kind, ``"*"``
            (values: :class:`RayPlacement` or a mapping of its fields), or a callable ``spec -> RayPlacement``;
            default: any node, no CPU reserved.
        global_scope: ``"cluster"`` (one instance of a global resource per cluster) or ``"node"`` (one per
            node, on the node of the caller) for :meth:`acquire_global`.
        namespace: the Ray namespace of the pool actors; default: the job's own namespace, so every
            worker of one job shares pools and two jobs never do.
        detached: pool actors outlive the process that made them (``lifetime="detached"``) and end when the
            last process using them detaches.  Default False: pools and their instances share the fate of
            the process that made them, so nothing outlives a driver that is killed.
        acquire_timeout: default seconds an acquisition may wait, None for no limit.
        manager_id: labels this client and the resources it starts; random by default.
        address: passed to ``ray.init`` when Ray is not initialised in this process yet.
        hosting: ``"node"`` (the default: one host actor per node and pool holds its instances there, see
            :mod:`.hosting`) or ``"instance"`` (one host actor, a ~100 MB process, per instance).  Each has its own
            named pools.

    Raises:
        ConfigError: a bad ``global_scope`` or placement.
    """

    scope_class = RayRolloutScope

    def __init__(self, *, placement: PlacementTable | None = None, global_scope: str = "cluster",
                 namespace: str | None = None, detached: bool = False, acquire_timeout: float | None = None,
                 manager_id: str | None = None, address: str | None = None, hosting: str = "node") -> None:
        if global_scope not in ("cluster", "node"):
            raise ConfigError(f"global_scope={global_scope!r} is not one of 'cluster', 'node'")
        if hosting not in HOSTINGS:
            raise ConfigError(f"hosting={hosting!r} is not one of {list(HOSTINGS)}")
        if isinstance(placement, dict):
            placement = {k: RayPlacement.of(v) for k, v in placement.items()}
        ray = _ray()
        if not ray.is_initialized():
            start_ray(address=address, namespace=namespace)
        self.id = manager_id or f"afg-ray-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.placement = placement
        self.global_scope = global_scope
        self.hosting = hosting
        self.namespace = namespace or ray.get_runtime_context().namespace
        self.detached = detached
        self.acquire_timeout = acquire_timeout
        self._pools: dict[str, RayPool] = {}
        self._globals: dict[str, RayResource] = {}
        self._host_handles: dict[str, Any] = {}  # host actor id -> handle (grants carry each one once)
        self._global_locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        # one teardown owner (resources/teardown.py): this manager detaches at exit and on SIGTERM (Ray's
        # driver handler exits through atexit).  Registered after ray.init, whose own exit hook shuts Ray
        # down: atexit runs last-registered first, so the pools are detached while Ray is still up.
        teardown.watch(self, run_first=True)

    # ------------------------------------------------------------------ pools
    def host_handle(self, host_id: str) -> Any:
        """The handle of host actor ``host_id`` this process was given (a grant carries each one once), or None."""
        return self._host_handles.get(host_id)

    def remember_host(self, host_id: str, handle: Any) -> None:
        """Keep ``handle`` as host actor ``host_id``'s (for the later grants, which name only its id)."""
        self._host_handles[host_id] = handle

    def pool(self, spec: ResourceSpec) -> RayPool:
        """This process's face of the cluster pool of ``spec.key``; the pool actor is found or made on first use.

        Raises:
            PoolClosedError: the manager is closed.
            ConfigError: the spec's placement asks for a custom resource no node of the cluster has.
        """
        if self._closed:
            raise PoolClosedError(f"resource manager {self.id} is closed")
        pool = self._pools.get(spec.key)
        if pool is None:
            placement = resolve_placement(self.placement, spec)
            self._check_placement(spec, placement)
            pool = RayPool(self, spec, placement)
            self._pools[spec.key] = pool
        return pool

    def _check_placement(self, spec: ResourceSpec, placement: RayPlacement) -> None:
        have = _ray().cluster_resources()
        missing = [name for name, _ in placement.resources if name not in have]
        if missing:
            custom = sorted(k for k in have if not k.startswith("node:") and k not in ("CPU", "GPU", "memory",
                                                                                          "object_store_memory"))
            raise ConfigError(f"placement of {spec.label} asks for resource(s) {missing} that no node of the Ray "
                              f"cluster has; custom resources present: {custom} (declare them with "
                              "`ray start --resources='{\"NAME\": N}'`)")

    def _pool_handle(self, spec: ResourceSpec, placement: RayPlacement) -> Any:
        """The named pool actor of ``spec`` in this manager's namespace, made if it does not exist (no wait)."""
        ray = _ray()
        name = "agentfly-pool-" + re.sub(r"[^A-Za-z0-9_.-]", "-", spec.key) + \
            ("" if self.hosting == "node" else f"-{self.hosting}")
        opts: dict[str, Any] = {"name": name, "namespace": self.namespace, "get_if_exists": True, "num_cpus": 0,
                                "max_concurrency": 10_000}
        if _HEAD in ray.cluster_resources():
            opts["resources"] = {_HEAD: 0.001}  # pools live on the head node, not on a worker node that can die
        if self.detached:
            opts["lifetime"] = "detached"
        return pool_actor_class().options(**opts).remote(spec, placement, self.id, self.hosting)

    def _forget(self, pool: RayPool) -> None:
        if self._pools.get(pool.spec.key) is pool:
            del self._pools[pool.spec.key]
        pool.closed = True

    @property
    def pools(self) -> dict[str, RayPool]:
        return dict(self._pools)

    # ------------------------------------------------------------------ scopes (Manager.scope, scope_class) and globals
    async def acquire_global(self, spec: ResourceSpec, *, user: Any = None) -> RayResource:
        """The shared instance of ``spec``: one per cluster, or one per node with ``global_scope="node"``.

        Every process that asks gets the same instance; it is stopped when the last process holding it closes
        its manager, or by :meth:`destroy_global`.  Global resources are never reset between users.  A dead one
        is replaced on the next call.  ``user`` is accepted for the local manager's API and not tracked: on a
        cluster the instance's lifetime follows the processes' managers, not single envs (see
        :meth:`leave_global`).
        """
        key = spec.key
        r = self._globals.get(key)
        if r is not None and r.dead is None:
            return r
        async with self._global_locks.setdefault(key, asyncio.Lock()):
            r = self._globals.get(key)
            if r is not None and r.dead is not None:
                await self.destroy_global(spec)
                r = None
            if r is None:
                pool = self.pool(spec)
                await pool.attach()
                node = _ray().get_runtime_context().get_node_id() if self.global_scope == "node" else None
                gkey = node or "cluster"
                ref = pool.handle.acquire_global.remote(gkey, self.id, node, self.acquire_timeout)
                grant = await pool.await_grant(ref, f"global-{gkey}")
                r = RayResource(pool, grant)
                r.global_key = gkey
                self._globals[key] = r
            return r

    def leave_global(self, spec: ResourceSpec, user: Any) -> None:
        """Nothing: a cluster-wide global instance stays until the last process using it closes its manager
        (:meth:`aclose`, or at exit and on SIGTERM), since other processes' envs may still use it."""

    async def destroy_global(self, spec: ResourceSpec) -> None:
        """Stop the shared instance of ``spec`` (for every process using it)."""
        r = self._globals.pop(spec.key, None)
        pool = self._pools.get(spec.key)
        if r is not None and pool is not None:
            try:
                await pool.handle.destroy_global.remote(r.global_key)
            except _ray().exceptions.RayActorError:
                pass

    async def prewarm(self, spec: ResourceSpec, n: int | None = None) -> None:
        await self.pool(spec).prewarm(n)

    # ------------------------------------------------------------------ metrics, close
    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per pool, cluster-wide (asked from the pool actors now; blocks up to 10 s): see :meth:`RayPool.fetch_snapshot`."""
        ray = _ray()
        pools = list(self._pools.values())
        for p in pools:
            p.settle()
        try:
            snaps = ray.get([p.handle.snapshot.remote() for p in pools], timeout=10)
        except Exception:  # noqa: BLE001 - a pool that died: report what was last seen
            snaps = [p.snapshot() for p in pools]
        for p, s in zip(pools, snaps):
            p.record_snapshot(s)
        return {p.spec.key: s for p, s in zip(pools, snaps)}

    async def ametrics(self) -> dict[str, dict[str, Any]]:
        """:meth:`metrics` without blocking the event loop."""
        pools = list(self._pools.values())
        snaps = await asyncio.gather(*(p.fetch_snapshot() for p in pools), return_exceptions=True)
        return {p.spec.key: (s if isinstance(s, dict) else p.snapshot()) for p, s in zip(pools, snaps)}

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Detach from every pool (returning this process's leases); the last process to detach stops the
        pool's instances and its actor.  Idempotent."""
        if self._closed:
            return
        await asyncio.to_thread(self.close)

    def close(self, timeout: float = 60.0) -> None:
        """Synchronous :meth:`aclose` (interpreter exit, SIGTERM; blocks up to ``timeout`` seconds per pool)."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        pools, self._pools = list(self._pools.values()), {}
        self._globals.clear()
        if not ray.is_initialized():
            return
        refs = []
        for p in pools:
            p.closed = True
            p._requests.send_releases()  # queued in this loop turn: sent before the detach that follows
            try:
                refs.append((p, p.handle.detach.remote(self.id)))
            except Exception:  # noqa: BLE001, S110 - gone already
                pass
        for p, ref in refs:
            try:
                left = ray.get(ref, timeout=timeout)
            except Exception:  # noqa: BLE001 - dead or stuck: kill it (its hosts share its fate)
                left = 0
            if left == 0:
                try:
                    ray.kill(p.handle, no_restart=True)
                except Exception:  # noqa: BLE001, S110
                    pass
