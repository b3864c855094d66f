"""The host of one instance on a Ray cluster: ``ResourceHost``, a Ray actor per instance placed by Ray resources.

It owns the live resource through a local :class:`~agentfly_gym.resources.ResourceManager` and runs every call
on it where it lives, so only the call's arguments and result cross the network.  The class is plain Python
here; :func:`host_actor_class` wraps it with ``ray.remote`` on first use (nothing happens at import), and
:func:`host_actor_options` places it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from ...errors import ResourceDied, ResourceError
from ..defaults import loop_default
from ..spec import ResourceSpec
from .placement import RayPlacement

__all__ = ["HOST_CLOSE_TIMEOUT", "ResourceHost", "host_actor_class", "host_actor_options"]

log = logging.getLogger(__name__)

_classes: dict[str, Any] = {}

#: seconds a host gets to release its resource (stop a container, close a simulator) before it is killed
HOST_CLOSE_TIMEOUT = 30.0


class ResourceHost:
    """One live instance of a spec, inside its own Ray actor on the node Ray placed it.

    The instance comes from a local :class:`~agentfly_gym.resources.ResourceManager` in this actor
    (its pool gives the usual start, reset-on-reuse, health check and release), so every backend
    works unchanged.  Method calls arrive as (name, args, kwargs) and run here.
    """

    def __init__(self, spec: ResourceSpec, manager_id: str) -> None:
        # AGENTFLY_GYM_MANAGER=local comes with the actor's runtime_env (host_actor_options): what the instance
        # itself needs is started here, not pooled again
        self._spec = spec
        self._manager_id = manager_id
        self._manager: Any = None
        self._pool: Any = None
        self._res: Any = None
        self._lock = asyncio.Lock()

    async def start(self) -> dict[str, Any]:
        """Start the instance.  Returns ``{"node_id", "pid", "resource_id"}``."""
        import ray

        from ..manager import ResourceManager

        self._manager = ResourceManager(manager_id=self._manager_id)
        self._pool = self._manager.pool(self._spec)
        self._res = await self._pool.acquire()
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "resource_id": self._res.id}

    async def reset(self) -> None:
        """Take the instance (back) from the local pool, which resets it (or replaces it) on re-acquisition."""
        async with self._lock:
            res, self._res = self._res, None
            if res is not None:
                await self._pool.release(res)
            self._res = await self._pool.acquire()

    async def park(self) -> None:
        """The instance went idle in the cluster pool: it goes idle in the local pool too, which parks it (stops
        the last rollout's work now, e.g. replaces a container) and keeps it in its care until the next reset."""
        async with self._lock:
            res, self._res = self._res, None
            if res is not None:
                await self._pool.release(res)

    async def status(self) -> str:
        if self._res is None:
            return "stopped"
        return (await self._res.status()).value

    async def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        """``resource.call(method, ...)`` for in-process objects (a coroutine method is awaited on this actor's
        event loop instead of the object's thread), ``resource.<method>(...)`` for the rest."""
        res = self._live()
        from ..inprocess import InProcessResource

        if isinstance(res, InProcessResource):
            fn = getattr(res.obj, method, None)
            if inspect.iscoroutinefunction(fn):  # an async object: awaited on this actor's loop, no thread hop
                return await fn(*args, **kwargs)
            return await res.call(method, *args, **kwargs)
        return await self.invoke(method, args, kwargs)

    async def invoke(self, method: str, args: tuple, kwargs: dict) -> Any:
        """``await resource.<method>(*args, **kwargs)`` (e.g. a container's ``exec``)."""
        res = self._live()
        if method.startswith("_"):
            raise ResourceError(f"{res.id}: method {method!r} is private and cannot be called remotely")
        fn = getattr(res, method, None)
        if not callable(fn):
            raise ResourceError(f"{res.id} ({type(res).__name__}) has no method {method!r}")
        out = fn(*args, **kwargs)
        if asyncio.iscoroutine(out):
            out = await out
        return out

    async def invoke_fn(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``resource.invoke(fn, ...)`` of an in-process object: ``fn(obj, *args, **kwargs)`` (a typed proxy's
        call); a coroutine function on an object in this process is awaited on this actor's loop."""
        res = self._live()
        from ..inprocess import InProcessResource

        if not isinstance(res, InProcessResource):
            raise ResourceError(f"{res.id} ({type(res).__name__}) is not an in-process object; call its own "
                                "methods by name")
        if inspect.iscoroutinefunction(fn) and not res.isolated and res.obj is not None:
            return await fn(res.obj, *args, **kwargs)
        return await res.invoke(fn, *args, **kwargs)

    async def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``resource.run(fn, ...)``: ``fn`` (pickled by Ray) runs on the object's thread here."""
        return await self._live().run(fn, *args, **kwargs)

    def mark_dead(self, reason: str) -> None:
        mark = getattr(self._res, "mark_dead", None)
        if callable(mark):
            mark(reason)

    async def close(self) -> None:
        """Release the instance and everything it holds (containers, processes); idempotent.

        An object with a coroutine ``aclose()`` (e.g. a hosted environment, whose episodes ran on this actor's
        loop) closes there first; then whatever it took from this loop's default manager is released.
        """
        async with self._lock:
            res, self._res = self._res, None
        aclose = getattr(getattr(res, "obj", None), "aclose", None)
        if inspect.iscoroutinefunction(aclose):
            try:
                await asyncio.wait_for(aclose(), HOST_CLOSE_TIMEOUT)
            except Exception:  # noqa: BLE001 - closing anyway
                log.warning("%s: aclose() of the hosted object failed", self._spec.label, exc_info=True)
        if self._manager is not None:
            await self._manager.aclose()
        default = loop_default()
        if default is not None:  # what async objects acquired on this loop
            await default.aclose()

    def _live(self) -> Any:
        if self._res is None:
            raise ResourceDied(f"the host of {self._spec.label} holds no live instance")
        return self._res


def host_actor_class() -> Any:
    """``ray.remote(ResourceHost)``, made on first use."""
    if "host" not in _classes:
        import ray

        _classes["host"] = ray.remote(max_restarts=0)(ResourceHost)
    return _classes["host"]


def host_actor_options(placement: RayPlacement, node_id: str | None = None) -> dict[str, Any]:
    """``.options(...)`` for an instance's host actor: the placement's resources, pinned to ``node_id`` if given.

    The host's process gets ``AGENTFLY_GYM_MANAGER=local`` (:data:`agentfly_gym.resources.select.SETTING`) through
    its ``runtime_env`` (Ray merges it with the job's variables): what the hosted instance itself needs (e.g. a
    hosted environment's default manager) is started there, not pooled in the cluster again.
    """
    opts = placement.actor_options()
    opts["runtime_env"] = {"env_vars": {"AGENTFLY_GYM_MANAGER": "local"}}
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return opts
