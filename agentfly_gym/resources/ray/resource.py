"""The client side of one lease in the cluster-wide manager: :class:`RayResource`, a handle on an instance that
lives in a host actor (:mod:`.host`) somewhere in the cluster; every call on it is one Ray call there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ResourceDied
from ..base import Resource, ResourceStatus

if TYPE_CHECKING:
    from .actors import Grant
    from .manager import RayPool

__all__ = ["RayResource"]


def _ray() -> Any:
    import ray

    return ray



class RayResource(Resource):
    """A client-side handle on one instance that lives in a Ray actor somewhere in the cluster.

    It offers what the local backends offer, forwarded to where the instance lives:
    ``await call(method, *args, **kwargs)`` and ``await run(fn, *args, **kwargs)`` (in-process objects),
    ``await exec(...)``, ``put_files(...)``, ``get_file(...)`` (containers) and ``await invoke(name, ...)``
    for any other method.  When the host actor or its node is gone, every call raises
    :class:`~agentfly_gym.errors.ResourceDied` and :attr:`obj` becomes None.

    Attributes:
        lease_id: the cluster pool's id of this lease.
        instance_id: the pool's id of the instance (stable across leases of the same instance).
        node_id: the Ray node the instance lives on.
        pid: the host actor's process id on that node (shared by the pool's instances there with node hosting).
    """

    def __init__(self, pool: RayPool, grant: Grant) -> None:
        super().__init__(pool.spec, labels={"manager": pool.manager.id, "node_id": grant.node_id})
        self.id = f"{pool.spec.kind}@{grant.instance_id}"
        self._pool = pool
        self.global_key = "cluster"  # of a global instance: the key the pool granted it under (see acquire_global)
        self.lease_id = grant.lease_id
        self.instance_id = grant.instance_id
        self.handle = grant.handle if grant.handle is not None else pool.manager.host_handle(grant.host_id)
        if grant.handle is not None:
            pool.manager.remember_host(grant.host_id, grant.handle)
        self.node_id = grant.node_id
        self.pid = grant.pid
        self.uses = grant.uses
        self._dead: str | None = None
        self._host_died = False  # a call found the host actor dead (the pool then drops its idle instances too)
        self._status = ResourceStatus.READY

    @property
    def pool(self) -> RayPool:
        """This process's face of the cluster pool the lease came from (where it goes back)."""
        return self._pool

    @property
    def host_died(self) -> bool:
        """A call found the host actor dead (the pool then drops that host's idle instances too)."""
        return self._host_died

    @property
    def obj(self) -> RayResource | None:
        """Not None while the instance is believed alive (the check environments make before reusing a global)."""
        return None if self._dead is not None else self

    @property
    def dead(self) -> str | None:
        """Why the instance is dead, or None."""
        return self._dead

    def mark_dead(self, reason: str) -> None:
        """Record that the instance stopped working; its release then stops it instead of reusing it."""
        if self._dead is None:
            self._dead = reason
        self._status = ResourceStatus.UNHEALTHY

    async def _remote(self, method: str, *args: Any) -> Any:
        ray = _ray()
        if self._dead is not None:
            raise ResourceDied(f"{self.id} is dead: {self._dead}")
        ref = getattr(self.handle, method).remote(self.instance_id, *args)
        try:
            return await ref
        except asyncio.CancelledError:
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001, S110 - best effort
                pass
            raise
        except ray.exceptions.RayActorError as e:
            reason = f"the Ray actor of {self.id} on node {self.node_id[:12]} died ({type(e).__name__})"
            self._host_died = True
            self.mark_dead(reason)
            raise ResourceDied(reason) from None

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``obj.<method>(*args, **kwargs)`` of an in-process object (or ``<method>`` of another kind), run where
        the instance lives.  Raises ResourceDied when its actor or node is gone; other errors as raised there."""
        return await self._remote("call", method, args, kwargs)

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the instance's thread where it lives (``fn`` is pickled)."""
        return await self._remote("run", fn, args, kwargs)

    async def invoke(self, method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a call on the live resource where it lives.

        ``method`` is either the name of one of the resource's own methods (``"exec"``: ``await
        resource.exec(*args, **kwargs)``), or a function ``fn`` run as ``fn(obj, *args, **kwargs)`` on an
        in-process object, as :meth:`InProcessResource.invoke <agentfly_gym.resources.inprocess.InProcessResource.invoke>`
        does (what typed simulator proxies send; ``fn`` is pickled by reference).
        """
        if callable(method):
            return await self._remote("invoke_fn", method, args, kwargs)
        return await self._remote("invoke", method, args, kwargs)

    async def batch(self, calls: list[tuple]) -> list[Any]:
        """Several calls on this instance in one round trip (a step's calls cross the network once), run in order
        where it lives: each is ``(method, args, kwargs)``, ``(method, args)`` or ``(method,)``; a name runs as
        :meth:`call`, a function as :meth:`invoke`.  Returns the results in order.  Raises ResourceDied when its
        host or node is gone; else the first call that raises stops the batch and its error is raised."""
        wire = [(tuple(c) + ((), {}))[:3] for c in calls]
        return await self._remote("batch", [("invoke_fn" if callable(w) else "call", w, tuple(a), dict(k))
                                            for w, a, k in wire])

    async def exec(self, *args: Any, **kwargs: Any) -> Any:
        """A container's ``exec``, run on the node of the container; returns its ``ExecResult``."""
        return await self.invoke("exec", *args, **kwargs)

    async def put_files(self, *args: Any, **kwargs: Any) -> Any:
        return await self.invoke("put_files", *args, **kwargs)

    async def get_file(self, *args: Any, **kwargs: Any) -> Any:
        return await self.invoke("get_file", *args, **kwargs)

    async def start(self) -> None:
        """Started by the cluster pool; nothing to do here."""

    async def reset(self) -> None:
        """Reset on its host when it came back to the cluster pool (so it is handed out reset); nothing here."""

    async def status(self) -> ResourceStatus:
        if self._dead is not None:
            return ResourceStatus.UNHEALTHY
        try:
            value = await asyncio.wait_for(self._remote("status"), 10)
        except Exception:  # noqa: BLE001 - dead, stuck or gone
            self.mark_dead("status check failed")
            return ResourceStatus.UNHEALTHY
        self._status = ResourceStatus(value)
        return self._status

    async def adestroy(self) -> None:
        """Destroy this process's handle: its lease goes back to the cluster pool, which stops the instance
        when it is dead and otherwise keeps it for reuse (the instance belongs to the cluster pool, not to
        this handle); idempotent."""
        await self._pool.release(self, discard=self._dead is not None)  # never yields: one actor message

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(node_id=self.node_id, pid=self.pid, lease_id=self.lease_id, dead=self._dead)
        return d
