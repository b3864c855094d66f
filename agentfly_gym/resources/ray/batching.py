"""A client's acquisitions and releases, sent to the cluster pool actor in batches (for throughput).

Every acquisition or release a process makes is one message to the pool actor, which is one Python process for the
whole cluster: past a few hundred per second its own per-call cost (Ray's task handling, about 1 ms of CPU an
acquire/release cycle) is the ceiling of the cluster. :class:`PoolRequests` batches a process's requests as a
network stack batches small packets (Nagle's algorithm): a request goes out at once, in one call with the others of
its event-loop turn, when no call of its kind is on its way; otherwise it waits for that call's answer and goes with
every request that came meanwhile (:meth:`PoolActor.acquire_many <.actors.PoolActor.acquire_many>`,
:meth:`PoolActor.release_many <.actors.PoolActor.release_many>`). So a lone acquisition costs no more than before,
and under load the batches grow with the rate and the cost per acquisition falls. An acquisition that must wait (the
pool is full, or others wait before it) waits at the pool in the same FIFO or priority order as a single one, and is
fetched with one more call (``collect``). Cancelling an acquisition sends ``cancel`` for its lease id, as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .actors import Grant
    from .manager import RayPool

__all__ = ["PoolRequests"]

log = logging.getLogger(__name__)


class PoolRequests:
    """One process's queue of requests to one cluster pool actor, flushed once per event-loop turn."""

    def __init__(self, pool: RayPool) -> None:
        self._pool = pool
        self._acquires: list[tuple[tuple, asyncio.Future]] = []
        self._releases: list[tuple[str, bool, bool]] = []
        self._tasks: set[asyncio.Task] = set()
        self._acquiring = False  # an acquire_many call is on its way: new acquisitions wait for its answer
        self._releasing = False  # a release_many call is on its way: new releases wait for its answer

    async def acquire(self, lease_id: str, timeout: float | None, node_id: str | None,
                      priority: float | None) -> Grant:
        """The pool's grant of lease ``lease_id`` (see :meth:`PoolActor.acquire <.actors.PoolActor.acquire>`).

        Raises:
            ResourceTimeout, ResourceStartError, PoolClosedError, ResourceError: as the pool raises them.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._acquires.append(((lease_id, timeout, node_id, priority), fut))
        if len(self._acquires) == 1 and not self._acquiring:
            loop.call_soon(self._send_acquires)
        try:
            grant = await fut
        except asyncio.CancelledError:
            self._pool.cancel_lease(lease_id)  # dropped from its wait, or its grant comes straight back
            raise
        if grant is None:  # it waits at the pool
            grant = await self._pool.await_grant(self._pool.handle.collect.remote(lease_id), lease_id)
        if grant.handle is None and self._pool.manager.host_handle(grant.host_id) is None:  # its first grant is late
            try:
                grant.handle = await self._pool.handle.host_handle.remote(grant.host_id)
            except BaseException:  # cancelled (or the pool died) meanwhile: the lease goes back, not stranded
                self.release(lease_id, False, False)
                raise
        return grant

    def _send_acquires(self) -> None:
        if self._acquiring:
            return  # sent when the call on its way is answered
        batch = [(req, fut) for req, fut in self._acquires if not fut.done()]  # done: cancelled (cancel was sent)
        self._acquires = []
        if not batch:
            return
        try:
            ref = self._pool.handle.acquire_many.remote(self._pool.manager.id, [req for req, _ in batch])
        except Exception as e:  # noqa: BLE001 - the pool is gone
            for _, fut in batch:
                fut.set_exception(self._pool.gone_error(e))
            return
        self._acquiring = True
        self._spawn(self._deliver(ref, batch))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, ref: Any, batch: list[tuple[tuple, asyncio.Future]]) -> None:
        try:
            outcomes, snapshot = await ref
        except Exception as e:  # noqa: BLE001 - the pool died: each acquisition raises
            err = self._pool.gone_error(e)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        finally:
            self._acquiring = False
            self._send_acquires()  # what came while the call was on its way
        self._pool.record_snapshot(snapshot)
        for (_req, fut), outcome in zip(batch, outcomes):
            if fut.done():  # its acquirer gave up meanwhile; the cancel it sent returns the grant
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    def release(self, lease_id: str, discard: bool, host_died: bool) -> None:
        """Give lease ``lease_id`` back (sent in this loop turn's batch; at once where no loop runs)."""
        self._releases.append((lease_id, discard, host_died))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.send_releases()
            return
        if len(self._releases) == 1 and not self._releasing:
            loop.call_soon(self._send_releases_when_free)

    def _send_releases_when_free(self) -> None:
        if not self._releasing:
            self.send_releases()

    def send_releases(self) -> None:
        """Send the queued releases now (one call), also while another is on its way; its reference is kept by the
        pool (:meth:`RayPool.track_release <.manager.RayPool.track_release>`)."""
        batch, self._releases = self._releases, []
        if not batch:
            return
        pool = self._pool
        try:
            ref = pool.handle.release_many.remote(batch)
        except Exception:  # noqa: BLE001 - the pool is gone, and its instances with it
            log.debug("releasing %d leases: the pool of %s is gone", len(batch), pool.spec.label)
            return
        pool.track_release(ref, done=_done)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop here (a manager's close at exit): nothing waits for the answer
            return
        self._releasing = True
        self._spawn(self._released(ref))

    async def _released(self, ref: Any) -> None:
        try:
            await ref
        except Exception:  # noqa: BLE001, S110 - the pool is gone, and its instances with it
            pass
        finally:
            self._releasing = False
            self._send_releases_when_free()  # what came while the call was on its way


def _done(ref: Any) -> bool:
    import ray

    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)
