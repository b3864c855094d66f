"""Where a cluster pool's instances live: which host actor holds each one, and what it reserves (two designs).

- ``hosting="node"`` (:class:`NodeHosting`, the default): one host actor per node the pool uses, holding every
  instance of the pool on that node (one Ray worker process per node and pool, however many instances).  Each
  instance's :class:`~.placement.RayPlacement` resources are reserved by a one-bundle placement group of its own
  (Ray holds the reservation, no process), so the same placement rules decide which nodes host how many
  instances, and the instance is started by the host on the node Ray reserved it.  A placement that reserves
  nothing puts instances on the pool actor's node (Ray's default packing), or spreads them over the live nodes
  with ``scheduling_strategy="SPREAD"``.
- ``hosting="instance"`` (:class:`InstanceHosting`, the earlier design): one host actor per instance, reserving the
  placement's resources itself (about 100 MB of Ray worker process per instance).

Once a pool closes, neither design starts an instance any more: a start still under way when the pool closed is
stopped as it ends, and a host that began closing refuses starts (an instance started there would be killed
with its host instead of closed).

A host's death loses every instance it holds: their leases' next calls raise
:class:`~agentfly_gym.errors.ResourceDied`, the pool discards them, and the next start makes a new host.  Hosts are
per pool (spec), so one kind's crash never takes another kind's instances; an in-process object that can crash
its process is better run with ``isolation="process"`` (a child process per object) or ``hosting="instance"``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from ...errors import ConfigError, PoolClosedError, ResourceStartError
from ..spec import ResourceSpec
from .host import HOST_CLOSE_TIMEOUT, host_actor_class, host_actor_options
from .placement import RayPlacement

__all__ = ["HOSTINGS", "InstanceHosting", "NodeHosting", "Placed", "is_actor_error", "make_hosting", "stop_host"]

log = logging.getLogger(__name__)

HOSTINGS = ("node", "instance")

#: Ray's own label of every node, naming its id (what a placement group's bundle is pinned to a node by)
NODE_ID_LABEL = "ray.io/node-id"

#: seconds a SPREAD reservation waits for the least-used node before it takes any node with room
SPREAD_TRY_S = 2.0


@dataclasses.dataclass
class Placed:
    """Where one instance lives: its host actor, node, host process and (node hosting) its reservation."""

    handle: Any
    node_id: str
    pid: int
    host_id: str = ""
    reservation: Any = None


def _ray() -> Any:
    import ray

    return ray


def is_actor_error(e: BaseException) -> bool:
    """Whether ``e`` says a Ray actor (a host, its node) is dead."""
    return isinstance(e, _ray().exceptions.RayActorError)


async def stop_host(handle: Any) -> None:
    """Let a host release every instance it holds, then kill its actor (also when the node is gone)."""
    ray = _ray()
    try:
        await asyncio.wait_for(handle.close.remote(), HOST_CLOSE_TIMEOUT)
    except Exception:  # noqa: BLE001, S110 - dead or stuck: killed below
        pass
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001, S110 - already gone
        pass


class InstanceHosting:
    """One host actor per instance, reserving the placement's resources itself (``hosting="instance"``)."""

    mode = "instance"

    def __init__(self, spec: ResourceSpec, placement: RayPlacement, manager_id: str) -> None:
        self.spec, self.placement, self.manager_id = spec, placement, manager_id
        self._hosts: set[Any] = set()
        self._closed = False

    @property
    def hosts(self) -> int:
        """Host actors alive (as far as this pool knows)."""
        return len(self._hosts)

    async def start(self, iid: str, node_id: str | None) -> Placed:
        """Start instance ``iid`` (on ``node_id`` if given) in a new host actor; killed again if the start fails.

        Raises:
            PoolClosedError: the hosting was closed (before or while the instance started).
        """
        _refuse_if_closed(self)
        opts = host_actor_options(self.placement, node_id)
        handle = host_actor_class().options(name=None, **opts).remote(self.spec, self.manager_id)
        self._hosts.add(handle)
        try:
            info = await handle.start.remote(iid)
        except BaseException:
            self._hosts.discard(handle)
            _ray().kill(handle, no_restart=True)
            raise
        if self._closed:  # closed while it started: aclose() did not see it
            self._hosts.discard(handle)
            await stop_host(handle)
            _refuse_if_closed(self)
        return Placed(handle, info["node_id"], info["pid"], info["host_id"])

    async def stop(self, iid: str, placed: Placed) -> None:
        self._hosts.discard(placed.handle)
        await stop_host(placed.handle)

    def lost(self, handle: Any) -> None:
        self._hosts.discard(handle)

    async def aclose(self, placed: list[Placed]) -> None:
        """Stop every host (each closes its instances first); later starts raise PoolClosedError."""
        self._closed = True
        hosts = set(self._hosts) | {p.handle for p in placed}
        self._hosts.clear()
        await asyncio.gather(*(stop_host(h) for h in hosts), return_exceptions=True)


class NodeHosting:
    """One host actor per node, holding all of the pool's instances there; each instance's resources are
    reserved by a one-bundle placement group (``hosting="node"``)."""

    mode = "node"

    def __init__(self, spec: ResourceSpec, placement: RayPlacement, manager_id: str) -> None:
        self.spec, self.placement, self.manager_id = spec, placement, manager_id
        self._hosts: dict[str, Any] = {}  # node id -> the host actor there
        self._count: dict[str, int] = {}  # node id -> instances there or starting there (SPREAD's measure)
        self._closed = False
        bundle: dict[str, float] = {"CPU": placement.num_cpus, "GPU": placement.num_gpus,
                                    "memory": placement.memory or 0, **dict(placement.resources)}
        self.bundle = {k: float(v) for k, v in bundle.items() if v}

    @property
    def hosts(self) -> int:
        return len(self._hosts)

    def _host(self, node_id: str) -> Any:
        _refuse_if_closed(self)  # a host made after aclose() would hold instances nobody closes
        handle = self._hosts.get(node_id)
        if handle is None:
            opts = host_actor_options(None, node_id)
            handle = host_actor_class().options(name=None, max_concurrency=10_000, **opts).remote(
                self.spec, self.manager_id)
            self._hosts[node_id] = handle
        return handle

    def lost(self, handle: Any) -> None:
        """A call to ``handle`` found it dead: the next start on its node makes a new host."""
        for node, h in list(self._hosts.items()):
            if h == handle:
                del self._hosts[node]

    async def _live_nodes(self) -> list[dict[str, Any]]:
        nodes = await asyncio.to_thread(_ray().nodes)
        return [n for n in nodes if n.get("Alive")]

    def _move(self, src: str | None, dst: str | None) -> None:
        """One instance less on ``src``, one more on ``dst`` (either None: none)."""
        if src:
            self._count[src] = max(0, self._count.get(src, 0) - 1)
        if dst:
            self._count[dst] = self._count.get(dst, 0) + 1

    async def _least_used(self) -> str | None:
        """The live node with the fewest of this pool's instances (counting those starting) that has (in total)
        what the bundle asks; counted at once as one more there, so concurrent starts spread."""
        nodes = [n for n in await self._live_nodes()
                 if all(n.get("Resources", {}).get(k, 0) >= v for k, v in self.bundle.items())]
        if not nodes:
            return None
        node = min(nodes, key=lambda n: (self._count.get(n["NodeID"], 0), n["NodeID"]))["NodeID"]
        self._move(None, node)
        return node

    async def _reserve(self, node_id: str | None, claimed: list[str]) -> tuple[Any, str]:
        """A placement group holding the bundle (on ``node_id`` if given); waits until Ray has placed it.  With
        SPREAD and no ``node_id``, the least-used node is tried first for :data:`SPREAD_TRY_S` seconds."""
        from ray.util.placement_group import placement_group, placement_group_table

        def make(target: str | None) -> Any:
            sel = [{NODE_ID_LABEL: target}] if target else None
            return placement_group([self.bundle], strategy="STRICT_PACK", bundle_label_selector=sel)

        pg = None
        if node_id is None and self.placement.scheduling_strategy == "SPREAD":
            target = await self._least_used()
            if target is not None:
                claimed.append(target)
                pg = make(target)
                ready = asyncio.ensure_future(_await(pg.ready()))
                done, _ = await asyncio.wait([ready], timeout=SPREAD_TRY_S)
                if not done:  # the least-used node has no room now: any node with room
                    ready.cancel()
                    await asyncio.to_thread(_remove, pg)
                    pg = None
        if pg is None:
            pg = make(node_id)
        try:
            await pg.ready()
            table = await asyncio.to_thread(placement_group_table, pg)
            node = next(iter(table["bundles_to_node_id"].values()))
        except BaseException:
            await asyncio.to_thread(_remove, pg)
            raise
        return pg, node

    async def start(self, iid: str, node_id: str | None) -> Placed:
        """Reserve the instance's resources, then start it in the host of the node Ray reserved them on.

        Raises:
            PoolClosedError: the hosting was closed (before or while the instance started).
            ResourceStartError: the node's host died twice while starting it.
        """
        ray = _ray()
        _refuse_if_closed(self)
        pg = handle = None
        claimed: list[str] = []  # the node SPREAD counted this instance on, if any
        try:
            if self.bundle:
                pg, node = await self._reserve(node_id, claimed)
            elif node_id is not None:
                node = node_id
            elif self.placement.scheduling_strategy == "SPREAD" and (least := await self._least_used()):
                node = least
                claimed.append(node)
            else:
                node = ray.get_runtime_context().get_node_id()
            for attempt in (0, 1):
                handle = self._host(node)
                try:
                    info = await handle.start.remote(iid)
                    break
                except ray.exceptions.RayActorError:
                    self.lost(handle)  # a host that died since: one more try with a new one
                    if attempt:
                        raise ResourceStartError(f"{self.spec.label}: the host actor on node {node[:12]} died "
                                                 "while starting an instance") from None
        except BaseException:
            self._move(claimed[0] if claimed else None, None)
            if handle is not None:
                _stop_instance(handle, iid)  # one that is still starting is stopped when its start ends
            if pg is not None:
                await asyncio.to_thread(_remove, pg)
            raise
        self._move(claimed[0] if claimed else None, info["node_id"])
        placed = Placed(handle, info["node_id"], info["pid"], info["host_id"], pg)
        if self._closed:  # closed while it started: its host may have been closed before it arrived there
            await self.stop(iid, placed)
            _refuse_if_closed(self)
        return placed

    async def stop(self, iid: str, placed: Placed) -> None:
        """Stop one instance in its host (the host stays for the others), then free its reservation."""
        try:
            await asyncio.wait_for(placed.handle.stop.remote(iid), HOST_CLOSE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - dead (its node died) or stuck
            if is_actor_error(e):
                self.lost(placed.handle)
            else:
                log.warning("%s: stopping instance %s failed (%s)", self.spec.label, iid, type(e).__name__)
        self._move(placed.node_id, None)
        if placed.reservation is not None:
            await asyncio.to_thread(_remove, placed.reservation)

    async def aclose(self, placed: list[Placed]) -> None:
        """Stop every host (each closes its instances first) and free the reservations; later starts raise
        PoolClosedError."""
        self._closed = True
        hosts, self._hosts = list(self._hosts.values()), {}
        await asyncio.gather(*(stop_host(h) for h in hosts), return_exceptions=True)
        for p in placed:
            if p.reservation is not None:
                await asyncio.to_thread(_remove, p.reservation)


def _refuse_if_closed(hosting: Any) -> None:
    if hosting._closed:
        raise PoolClosedError(f"the cluster pool of {hosting.spec.label} is closed: no instance starts")


async def _await(ref: Any) -> Any:
    return await ref


def _stop_instance(handle: Any, iid: str) -> None:
    try:
        handle.stop.remote(iid)
    except Exception:  # noqa: BLE001, S110 - the host is gone, and the instance with it
        pass


def _remove(pg: Any) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001 - already removed, or Ray is shutting down
        log.debug("removing a placement group failed", exc_info=True)


def make_hosting(mode: str, spec: ResourceSpec, placement: RayPlacement, manager_id: str) -> Any:
    """The hosting of a pool: :class:`NodeHosting` for ``"node"``, :class:`InstanceHosting` for ``"instance"``.

    Raises:
        ConfigError: another ``mode``.
    """
    if mode == "node":
        return NodeHosting(spec, placement, manager_id)
    if mode == "instance":
        return InstanceHosting(spec, placement, manager_id)
    raise ConfigError(f"hosting={mode!r} is not one of {list(HOSTINGS)}")
