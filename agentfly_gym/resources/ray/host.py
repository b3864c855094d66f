"""The host of instances on a Ray cluster: ``ResourceHost``, a Ray actor holding one or many instances of a spec.

With ``hosting="node"`` (the default) a pool has one host per node it uses, holding every instance of the pool on
that node; with ``hosting="instance"`` (the earlier design) each instance has a host of its own.  Either way
the host owns its instances through local pools (:class:`~agentfly_gym.resources.pool.ResourcePool`, one per
instance, in one local :class:`~agentfly_gym.resources.ResourceManager`) and runs every call on them where they
live, so only a call's arguments and result cross the network.  Instances are addressed by the pool actor's
instance id.  The class is plain Python here; :func:`host_actor_class` wraps it with ``ray.remote`` on first use
(nothing happens at import), and :func:`host_actor_options` places it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from ...errors import PoolClosedError, ResourceDied, ResourceError
from ..defaults import loop_default
from ..spec import ResourceSpec
from .placement import RayPlacement

__all__ = ["HOST_CLOSE_TIMEOUT", "ResourceHost", "host_actor_class", "host_actor_options"]

log = logging.getLogger(__name__)

_classes: dict[str, Any] = {}

#: seconds a host gets to release an instance (stop a container, close a simulator) before it is killed
HOST_CLOSE_TIMEOUT = 30.0

#: what one call of :meth:`ResourceHost.batch` may ask: ``call``, ``invoke``, ``invoke_fn`` or ``run``
BATCH_KINDS = ("call", "invoke", "invoke_fn", "run")


@dataclasses.dataclass
class _Slot:
    pool: Any  # the instance's local ResourcePool (capacity 1 in use: start, park and reset on reuse, health)
    res: Any = None  # the live resource (None only while it is being reset, or once stopped)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class ResourceHost:
    """Live instances of one spec, inside one Ray actor on the node Ray placed it.

    Each instance comes from a local pool of its own in this actor (the usual start, reset-on-reuse, health check
    and release), so every backend works unchanged.  Method calls arrive as ``(instance id, name, args, kwargs)``
    and run here, on this actor's event loop; instances of the same host share the process, its default manager
    (what hosted environments acquire for themselves) and its loop.
    """

    def __init__(self, spec: ResourceSpec, manager_id: str) -> None:
        # AGENTFLY_GYM_MANAGER=local comes with the actor's runtime_env (host_actor_options): what the instances
        # themselves need is started here, not pooled again
        self._spec = spec
        self._manager_id = manager_id
        self._manager: Any = None
        self._slots: dict[str, _Slot] = {}
        self._closing = False  # close() began: no instance starts here any more
        self._closed: asyncio.Event | None = None  # set when close() ends (what wait_closed() waits for)

    def info(self) -> dict[str, Any]:
        """``{"node_id", "pid", "host_id", "instances"}``: where this host runs (``host_id``: its Ray actor id) and
        how many instances it holds."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "host_id": ctx.get_actor_id(),
                "instances": len(self._slots)}

    async def start(self, iid: str) -> dict[str, Any]:
        """Start instance ``iid`` here.  Returns ``{"node_id", "pid", "resource_id"}``.

        Raises:
            ResourceError: ``iid`` is already live here.
            PoolClosedError: this host is closing (an instance started now would outlive its close).
            ResourceStartError: the instance failed to start (as the local pool raises it).
        """
        from ..manager import ResourceManager
        from ..pool import ResourcePool

        if self._closing:
            raise PoolClosedError(f"{self._spec.label}: this host is closing; instance {iid} was not started")
        if iid in self._slots:
            raise ResourceError(f"{self._spec.label}: instance {iid} is already live on this host")
        if self._manager is None:
            self._manager = ResourceManager(manager_id=self._manager_id)
        slot = _Slot(ResourcePool(self._spec, self._manager.build_resource))
        self._slots[iid] = slot
        try:
            async with slot.lock:
                slot.res = await slot.pool.acquire()
        except BaseException:
            self._slots.pop(iid, None)
            await slot.pool.aclose()
            raise
        return {**self.info(), "resource_id": slot.res.id}

    async def reset(self, iid: str) -> bool:
        """The instance came back to the cluster pool: it goes back to its local pool, which parks it (stops the
        last rollout's work), and is taken again, which resets it (or replaces it), so it waits ready.  Returns
        whether it was replaced (its reset raised or it was unhealthy).

        Raises:
            ResourceDied: ``iid`` is not live here (never started, or stopped before or while this waited).
        """
        slot = self._slot(iid)
        async with slot.lock:
            if self._slots.get(iid) is not slot:  # stopped while this waited: start nothing in its closed pool
                raise ResourceDied(f"instance {iid} of {self._spec.label} was stopped on this host")
            res, slot.res = slot.res, None
            if res is not None:
                await slot.pool.release(res)
            replaced = slot.pool.metrics.replaced
            slot.res = await slot.pool.acquire()
            return slot.pool.metrics.replaced > replaced

    async def recycle(self, iids: list[str], timeout: float | None = None) -> tuple[list[str | None], int]:
        """:meth:`reset` of several instances at once (those that came back to the pool in one turn), each given
        ``timeout`` seconds (None: no limit), so one stuck reset fails alone.  Returns, in order, None for each one
        reset and the error (``"Type: message"``) for each one that failed; and how many of those reset were
        replaced here instead (their reset raised or their health check failed, so the host's local pool started a
        new one in place: the cluster pool's ``replaced_on_host``)."""

        async def one(iid: str) -> str | bool:
            try:
                return await asyncio.wait_for(self.reset(iid), timeout)
            except Exception as e:  # noqa: BLE001 - reported to the pool, which replaces the instance
                return f"{type(e).__name__}: {e}"

        outcomes = await asyncio.gather(*(one(i) for i in iids))
        return [o if isinstance(o, str) else None for o in outcomes], sum(o is True for o in outcomes)

    async def wait_closed(self) -> None:
        """Returns when :meth:`close` has ended.  The pool keeps one such call open per host: it fails with
        Ray's ``RayActorError`` as soon as Ray sees the host dead (its process or node), with no polling."""
        if self._closed is None:
            self._closed = asyncio.Event()
        await self._closed.wait()

    async def status(self, iid: str) -> str:
        slot = self._slots.get(iid)
        if slot is None or slot.res is None:
            return "stopped"
        return (await slot.res.status()).value

    async def call(self, iid: str, method: str, args: tuple, kwargs: dict) -> Any:
        """``resource.call(method, ...)`` for in-process objects (a coroutine method is awaited on this actor's
        event loop instead of the object's thread), ``resource.<method>(...)`` for the rest."""
        res = self._live(iid)
        from ..inprocess import InProcessResource

        if isinstance(res, InProcessResource):
            fn = getattr(res.obj, method, None)
            if inspect.iscoroutinefunction(fn):  # an async object: awaited on this actor's loop, no thread hop
                return await fn(*args, **kwargs)
            return await res.call(method, *args, **kwargs)
        return await self.invoke(iid, method, args, kwargs)

    async def invoke(self, iid: str, method: str, args: tuple, kwargs: dict) -> Any:
        """``await resource.<method>(*args, **kwargs)`` (e.g. a container's ``exec``)."""
        res = self._live(iid)
        if method.startswith("_"):
            raise ResourceError(f"{res.id}: method {method!r} is private and cannot be called remotely")
        fn = getattr(res, method, None)
        if not callable(fn):
            raise ResourceError(f"{res.id} ({type(res).__name__}) has no method {method!r}")
        out = fn(*args, **kwargs)
        if asyncio.iscoroutine(out):
            out = await out
        return out

    async def invoke_fn(self, iid: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``resource.invoke(fn, ...)`` of an in-process object: ``fn(obj, *args, **kwargs)`` (a typed proxy's
        call); a coroutine function on an object in this process is awaited on this actor's loop."""
        res = self._live(iid)
        from ..inprocess import InProcessResource

        if not isinstance(res, InProcessResource):
            raise ResourceError(f"{res.id} ({type(res).__name__}) is not an in-process object; call its own "
                                "methods by name")
        if inspect.iscoroutinefunction(fn) and not res.isolated and res.obj is not None:
            return await fn(res.obj, *args, **kwargs)
        return await res.invoke(fn, *args, **kwargs)

    async def run(self, iid: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``resource.run(fn, ...)``: ``fn`` (pickled by Ray) runs on the object's thread here."""
        return await self._live(iid).run(fn, *args, **kwargs)

    async def batch(self, iid: str, calls: list[tuple[str, Any, tuple, dict]]) -> list[Any]:
        """Several calls on instance ``iid`` in one Ray call, run in order: each is ``(kind, method or fn, args,
        kwargs)`` with ``kind`` one of :data:`BATCH_KINDS` (as the methods of the same name).  Returns their
        results in order; the first call that raises stops the batch and its error is raised (later calls do
        not run)."""
        out = []
        for kind, what, args, kwargs in calls:
            if kind not in BATCH_KINDS:
                raise ResourceError(f"batch call kind {kind!r} is not one of {list(BATCH_KINDS)}")
            out.append(await getattr(self, kind)(iid, what, tuple(args), dict(kwargs)))
        return out

    def mark_dead(self, iid: str, reason: str) -> None:
        slot = self._slots.get(iid)
        mark = getattr(getattr(slot, "res", None), "mark_dead", None)
        if callable(mark):
            mark(reason)

    async def stop(self, iid: str) -> None:
        """Release instance ``iid`` and everything it holds (containers, processes); idempotent.

        An object with a coroutine ``aclose()`` (e.g. a hosted environment, whose episodes ran on this actor's
        loop) closes there first, then its local pool stops it.
        """
        slot = self._slots.pop(iid, None)
        if slot is None:
            return
        async with slot.lock:
            res, slot.res = slot.res, None
        aclose = getattr(getattr(res, "obj", None), "aclose", None)
        if inspect.iscoroutinefunction(aclose):
            try:
                await asyncio.wait_for(aclose(), HOST_CLOSE_TIMEOUT)
            except Exception:  # noqa: BLE001 - closing anyway
                log.warning("%s: aclose() of the hosted object failed", self._spec.label, exc_info=True)
        if res is not None:
            await slot.pool.release(res, discard=True)
        await slot.pool.aclose()

    async def close(self) -> None:
        """Stop every instance, then release what they took from this loop's default manager; idempotent.  Starts
        that arrive afterwards are refused."""
        self._closing = True
        await asyncio.gather(*(self.stop(iid) for iid in list(self._slots)), return_exceptions=True)
        if self._manager is not None:
            await self._manager.aclose()
        default = loop_default()
        if default is not None:  # what async objects acquired on this loop
            await default.aclose()
        if self._closed is None:
            self._closed = asyncio.Event()
        self._closed.set()

    def _slot(self, iid: str) -> _Slot:
        slot = self._slots.get(iid)
        if slot is None:
            raise ResourceDied(f"instance {iid} of {self._spec.label} is not live on this host")
        return slot

    def _live(self, iid: str) -> Any:
        res = self._slot(iid).res
        if res is None:
            raise ResourceDied(f"the host of {self._spec.label} holds no live instance {iid}")
        return res


def host_actor_class() -> Any:
    """``ray.remote(ResourceHost)``, made on first use (an async actor: calls on different instances overlap)."""
    if "host" not in _classes:
        import ray

        _classes["host"] = ray.remote(max_restarts=0)(ResourceHost)
    return _classes["host"]


def host_actor_options(placement: RayPlacement | None, node_id: str | None = None) -> dict[str, Any]:
    """``.options(...)`` for a host actor: the placement's resources (``hosting="instance"``), or none with
    ``placement=None`` (``hosting="node"``: each instance's resources are reserved by a placement group of its
    own), pinned to ``node_id`` if given.

    The host's process gets ``AGENTFLY_GYM_MANAGER=local`` (:data:`agentfly_gym.resources.select.SETTING`) through
    its ``runtime_env`` (Ray merges it with the job's variables): what the hosted instance itself needs (e.g. a
    hosted environment's default manager) is started there, not pooled in the cluster again.
    """
    opts = placement.actor_options() if placement is not None else {"num_cpus": 0, "num_gpus": 0}
    opts["runtime_env"] = {"env_vars": {"AGENTFLY_GYM_MANAGER": "local"}}
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return opts
