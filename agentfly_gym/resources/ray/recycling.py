"""How a cluster pool takes instances back: each is reset on its host as it comes back, in one call per host for
all that came back in one turn of the pool's event loop, and a host's death is seen without polling.

:class:`PoolRecycling` is that part of :class:`~.actors.PoolActor`: an idle instance is a ready one, so handing it
out costs the pool no call on its host (for throughput).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .hosting import Placed, is_actor_error

__all__ = ["PoolRecycling"]

log = logging.getLogger(__name__)

#: seconds a recycle call may take beyond the per-instance reset limit (``spec.start_timeout``) it passes the host
RECYCLE_CALL_MARGIN_S = 30.0


class PoolRecycling:
    """Instances coming back, reset on their hosts in batches (a base of :class:`~.actors.PoolActor`, which sets
    the attributes used here in its ``__init__``)."""

    _closed: bool
    spec: Any
    _instances: dict[str, Any]
    _stats: dict[str, Any]
    _to_recycle: dict[str, tuple[Any, list[tuple[str, asyncio.Future]]]]
    _host_watches: dict[str, asyncio.Task]
    _recycling: set[str]  # host ids with a recycle call on its way
    _n_recycling: int  # instances that came back and are not put back yet

    def _recycle(self, iid: str) -> asyncio.Future | None:
        """An instance came back: its host resets it, then it is put back (:meth:`_put_back`).  Returns a future
        done when that is over (None: the instance is gone).  One call per host carries every instance of that host
        that came back in this turn of the loop, or (as Nagle's algorithm) while its previous call was on its way."""
        inst = self._instances.get(iid)
        if inst is None:
            return None
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        host = inst.placed.host_id
        items = self._to_recycle.setdefault(host, (inst.handle, []))[1]
        items.append((iid, done))
        self._n_recycling += 1
        if len(items) == 1 and host not in self._recycling:
            loop.call_soon(self._flush_recycle)
        return done

    def _flush_recycle(self) -> None:
        loop = asyncio.get_running_loop()
        for host in [h for h in self._to_recycle if h not in self._recycling]:
            handle, items = self._to_recycle.pop(host)
            self._recycling.add(host)
            loop.create_task(self._recycle_on(host, handle, items))

    async def _recycle_on(self, host: str, handle: Any, items: list[tuple[str, asyncio.Future]]) -> None:
        try:
            await self._reset_on(handle, [iid for iid, _ in items])
        finally:
            self._n_recycling -= len(items)
            for _, done in items:
                if not done.done():
                    done.set_result(None)
            self._recycling.discard(host)
            if host in self._to_recycle:  # came back while this call was on its way
                self._flush_recycle()

    async def _reset_on(self, handle: Any, iids: list[str]) -> None:
        died = False
        try:
            self._stats["recycle_calls"] += 1
            # each reset gets start_timeout on the host (one stuck reset fails alone); the margin covers the call
            errors, replaced = await asyncio.wait_for(handle.recycle.remote(iids, self.spec.start_timeout),
                                                      self.spec.start_timeout + RECYCLE_CALL_MARGIN_S)
            self._stats["replaced_on_host"] += replaced
        except Exception as e:  # noqa: BLE001 - a dead host or node, a stuck reset: every one of them is replaced
            died = is_actor_error(e)
            errors = [f"{type(e).__name__}: {e}"] * len(iids)
        failed = []
        for iid, err in zip(iids, errors):
            if err is None:
                self._put_back(iid)
            elif iid in self._instances:
                log.warning("%s: instance %s failed its reset on reuse (%s); discarding it", self.spec.label, iid, err)
                self._stats["died"] += 1
                failed.append(iid)
        await asyncio.gather(*(self._discard(iid) for iid in failed))  # at once: each stop may take its timeout
        if died:
            await self._host_died(handle)

    def _watch_host(self, placed: Placed) -> None:
        """Keep one call open on the instance's host (once per host): it returns when the host closes and fails
        when it dies, which discards the host's idle instances at once (no polling, no call per acquisition)."""
        if placed.host_id in self._host_watches or self._closed:
            return
        self._host_watches[placed.host_id] = asyncio.get_running_loop().create_task(self._host_watch(placed))

    async def _host_watch(self, placed: Placed) -> None:
        try:
            await placed.handle.wait_closed.remote()
        except Exception as e:  # noqa: BLE001 - only a dead actor matters here
            if is_actor_error(e) and not self._closed:
                await self._host_died(placed.handle)
        finally:
            if self._host_watches.get(placed.host_id) is asyncio.current_task():
                del self._host_watches[placed.host_id]
