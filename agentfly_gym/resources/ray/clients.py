"""Who uses a cluster pool: its clients (one per process's manager), their nodes and processes.

:class:`PoolClients` is the part of :class:`~.actors.PoolActor` that registers clients and returns the leases of
one that is gone: detached, on a node that died, or whose process ended without detaching (SIGKILL, a crash), as
the cluster's control store (GCS) records it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...errors import ResourceStartError
from . import _compat

__all__ = ["CLIENT_NODE_CHECK", "PoolClients", "client_owner", "dead_owners", "live_node_ids"]

log = logging.getLogger(__name__)

#: seconds between two checks that a pool's clients (their nodes, their processes) are alive
CLIENT_NODE_CHECK = 5.0


def client_owner() -> dict[str, Any]:
    """Who this process is to Ray, for :meth:`PoolActor.attach`: ``worker_id`` and ``job_id`` (hex), and whether it
    is the job's driver (else a worker: a task's or an actor's process)."""
    import ray

    ctx = ray.get_runtime_context()
    return {"worker_id": ctx.get_worker_id(), "job_id": ctx.get_job_id(), "driver": ctx.worker.mode == ray.SCRIPT_MODE}


def live_node_ids() -> set[str]:
    """The ids (hex) of the cluster's live nodes, as the control store (GCS) lists them.  Blocking: run it in a
    thread."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def dead_owners(owners: dict[str, dict[str, Any]]) -> list[str]:
    """The clients (of ``owners``: client id -> :func:`client_owner`) whose process has ended, as the cluster's
    control store (GCS) records it: a driver whose job is dead, a worker that is no longer among the live
    workers (read by :mod:`._compat`, which needs no dashboard).  Blocking: run it in a thread.
    """
    jobs = _compat.job_is_dead()
    workers = _compat.live_worker_ids() if any(not o.get("driver", True) for o in owners.values()) else set()
    return [client for client, o in owners.items()
            if jobs.get(o.get("job_id"), False) or (not o.get("driver", True) and o.get("worker_id") not in workers)]


class PoolClients:
    """Client registration of a pool actor (a base of :class:`~.actors.PoolActor`, which sets the attributes
    used here in its ``__init__``)."""

    _closed: bool
    spec: Any
    _live_nodes: set[str]
    _deferred: dict[str, tuple[str, asyncio.Task]]

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
        while not self._closed:
            await asyncio.sleep(CLIENT_NODE_CHECK)
            if self._client_nodes:
                try:
                    alive = await asyncio.to_thread(live_node_ids)
                except Exception:  # noqa: BLE001 - GCS busy: try again next round
                    alive = None
                if alive is not None:
                    self._live_nodes = alive
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

    async def _check_pin(self, node_id: str) -> None:
        """An acquisition pinned to ``node_id`` fails at once when that is not a live node of the cluster (read
        again from the control store when it is not among the live nodes last read), rather than waiting for a
        start there to time out.

        Raises:
            ResourceStartError: ``node_id`` is not a live node.
        """
        if node_id in self._live_nodes:
            return
        try:
            self._live_nodes = await asyncio.to_thread(live_node_ids)
        except Exception:  # noqa: BLE001 - GCS busy: the start there will tell
            return
        if node_id not in self._live_nodes:
            raise ResourceStartError(
                f"{self.spec.label}: no instance can run on node {node_id!r}: it is not a live node of the cluster "
                f"(live: {', '.join(sorted(self._live_nodes)) or 'none'})")

    async def detach(self, client_id: str) -> int:
        """Forget a client: release its leases and its global holds.  Returns the clients left; at 0 the pool
        stops every instance and refuses new work (the caller then kills the actor)."""
        self._clients.discard(client_id)
        self._client_nodes.pop(client_id, None)
        self._client_owners.pop(client_id, None)
        self._sent.pop(client_id, None)
        for lease_id in [lid for lid, (cid, task) in self._deferred.items() if cid == client_id and task.done()]:
            self._deferred.pop(lease_id, None)  # never collected now (a grant's lease is released below)
        await asyncio.gather(*(self.release(lease_id) for lease_id, (_iid, cid) in list(self._leases.items())
                               if cid == client_id), return_exceptions=True)
        for key, holders in list(self._global_holders.items()):
            holders.discard(client_id)
            if not holders:
                await self.destroy_global(key)
        if not self._clients:
            await self.aclose()
        return len(self._clients)
