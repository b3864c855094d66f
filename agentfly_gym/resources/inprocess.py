"""In-process resources: objects built by a factory and driven from their own thread.

Callers reach the object through a typed proxy (:class:`ObjectProxy` with :func:`forward`ed methods, one
class per simulator), never by method-name strings, so a misspelt method fails at import or type-check
time; with ``InProcessSpec(isolation="process")`` the same proxy drives the object in a child process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import operator
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ..errors import ConfigError, ResourceDied, ResourceStartError
from ..utils.imports import load_object
from .base import Resource, ResourceStatus
from .spec import InProcessSpec

__all__ = ["InProcessResource", "ObjectProxy", "forward"]

log = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")


class _DaemonWorker:
    """One daemon thread running submitted calls in order (a one-thread executor).

    ``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit, before
    ``atexit`` hooks run, so one call stuck in a dead simulator (a stopped JVM, an engine that never
    answers) would keep the interpreter from exiting.  A daemon thread never does.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name}: cannot schedule new calls after shutdown")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put((fut, fn))
        return fut

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                fut.set_exception(e)
            else:
                fut.set_result(result)
            del fut, fn, item

    def shutdown(self) -> None:
        """Cancel queued calls and let the thread end after the running one (never waits)."""
        with self._lock:
            self._shutdown = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            self._queue.put(None)


class InProcessResource(Resource):
    """An object made by ``spec.factory(**spec.kwargs)``, owned by one worker thread.

    Every call (:meth:`call`, :meth:`run`, start, reset, health check) runs on that
    (daemon) thread, one at a time, so the event loop never blocks on the object and a
    non-thread-safe object is never entered twice.  ``close()`` runs on a separate
    thread with ``spec.close_timeout`` so a stuck instance can still be abandoned.

    With ``spec.isolation == "process"``, :attr:`obj` is a
    :class:`~agentfly_gym.resources.isolated.ChildProcessObject` (the handle of the object living in a
    child process) and :meth:`invoke` forwards each call there; the worker thread still orders the calls.

    A start that is abandoned (its caller cancelled or timed out) keeps running on the worker
    thread: whatever the factory eventually returns is closed as soon as it returns, and
    :meth:`adestroy` waits for that (up to ``spec.start_timeout`` seconds), so the pool counts
    the instance against its capacity until it is really gone.
    """

    def __init__(self, spec: InProcessSpec, *, labels: dict[str, str] | None = None) -> None:
        super().__init__(spec, labels=labels)
        self.isolated = spec.isolation == "process"
        self.spec: InProcessSpec = spec
        self.obj: Any = None
        self._worker = _DaemonWorker(f"afg-{self.id}")
        self._dead: str | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()  # orders the factory's completion against release
        self._start_future: concurrent.futures.Future | None = None

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the instance's thread and return its result.

        Raises:
            ResourceDied: the instance was released.
        """
        if self._closed.is_set():
            raise ResourceDied(f"{self.id} was released")
        try:
            fut = self._worker.submit(lambda: fn(*args, **kwargs))
        except RuntimeError:
            raise ResourceDied(f"{self.id} was released") from None
        return await asyncio.wrap_future(fut)

    async def invoke(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(obj, *args, **kwargs)`` where the object lives and return its result.

        ``fn`` is typically an unbound method of the object's class (``Simulator.step``); with
        ``isolation="process"`` it runs in the child process (``fn`` travels by reference, arguments and
        result are pickled).  Prefer a typed :class:`ObjectProxy` over calling this directly.

        Raises:
            ResourceDied: the instance was released, or its child process exited.
            Exception: whatever ``fn`` raised.
        """
        obj = self.obj
        if obj is None:
            raise ResourceDied(f"{self.id} has no object (not started, or released)")
        if self.isolated:
            return await self.run(obj.invoke, fn, args, kwargs)
        return await self.run(fn, obj, *args, **kwargs)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``obj.<method>(*args, **kwargs)`` by name (untyped; environments use an :class:`ObjectProxy`)."""
        return await self.invoke(operator.methodcaller(method, *args, **kwargs))

    @property
    def child_pid(self) -> int | None:
        """The pid of the child process holding the object (``isolation="process"``), else None."""
        return getattr(self.obj, "pid", None) if self.isolated else None

    def mark_dead(self, reason: str) -> None:
        """Record that the object stopped working (e.g. a step timed out); status becomes UNHEALTHY."""
        self._dead = reason
        self._status = ResourceStatus.UNHEALTHY

    async def start(self) -> None:
        kwargs = dict(self.spec.factory_kwargs)
        if self.isolated:  # the factory is imported and called in the child; this process holds a handle
            from .isolated import ChildProcessObject

            factory: Callable[..., Any] = functools.partial(
                ChildProcessObject, self.spec.factory, start_timeout=self.spec.start_timeout,
                close_timeout=self.spec.close_timeout, name=f"afg-{self.spec.label}-{self.id}")
            kwargs = {"kwargs": kwargs}
        else:
            factory = load_object(self.spec.factory, what="factory")
        self._status = ResourceStatus.STARTING
        if self._closed.is_set():
            raise ResourceDied(f"{self.id} was released before it started")
        fut = self._worker.submit(lambda: factory(**kwargs))
        self._start_future = fut
        fut.add_done_callback(self._factory_done)  # runs first, on the worker thread
        try:
            await asyncio.wrap_future(fut)  # cancelling this cancels the factory only if it has not begun
        except (ConfigError, ResourceStartError):
            raise
        except Exception as e:
            raise ResourceStartError(f"{self.spec.label}: factory {self.spec.factory} failed: {type(e).__name__}: {e}") from e
        if self.obj is None:  # released while the factory ran: _factory_done closed its object
            raise ResourceDied(f"{self.id} was released while it started")
        self._status = ResourceStatus.READY

    def _factory_done(self, fut: concurrent.futures.Future) -> None:
        """The factory returned: hand the object to the resource, or close it if the resource was released."""
        if fut.cancelled() or fut.exception() is not None:
            return
        obj = fut.result()
        with self._lock:
            if not self._closed.is_set():
                self.obj = obj
                return
        log.info("%s: closing the object of a start that was abandoned", self.id)
        close = getattr(obj, "close", None)
        if callable(close):
            self._close_quietly(close)

    async def reset(self) -> None:
        fn = getattr(self.obj, "reset", None)
        if callable(fn):
            await self.run(fn)

    async def status(self) -> ResourceStatus:
        if self._status in (ResourceStatus.STOPPED, ResourceStatus.UNHEALTHY, ResourceStatus.CREATED):
            return self._status
        fn = getattr(self.obj, "healthy", None)
        if callable(fn):
            try:
                ok = await asyncio.wait_for(self.run(fn), timeout=10)
            except Exception:  # noqa: BLE001 - a failing health check is an unhealthy instance
                ok = False
            if not ok:
                self._status = ResourceStatus.UNHEALTHY
        return self._status

    def _take(self) -> tuple[bool, Any]:
        """Mark the resource closed; returns (whether this call closed it, the object to close)."""
        with self._lock:
            if self._closed.is_set():
                return False, None
            self._closed.set()
            obj, self.obj = self.obj, None
        self._status = ResourceStatus.STOPPED
        return True, obj

    async def adestroy(self) -> None:
        first, obj = self._take()
        if not first:
            return
        start = self._start_future
        if start is not None and not start.done():
            # an abandoned start: wait until the factory returns and _factory_done has closed its object
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(start)), self.spec.start_timeout)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001, S110 - a failed factory left nothing to close
                pass
            if not start.done():
                log.warning("%s: the abandoned start did not return within start_timeout=%.0fs; its object will be "
                            "closed when it does", self.id, self.spec.start_timeout)
        close = getattr(obj, "close", None)
        if callable(close):
            closer = threading.Thread(target=self._close_quietly, args=(close,), daemon=True, name=f"afg-close-{self.id}")
            closer.start()
            await asyncio.get_running_loop().run_in_executor(None, closer.join, self.spec.close_timeout)
            if closer.is_alive():
                log.warning("%s: close() did not return within %.0fs; abandoning it", self.id, self.spec.close_timeout)
        self._worker.shutdown()

    def destroy(self) -> None:
        first, obj = self._take()
        if not first:
            return
        start = self._start_future
        if start is not None and not start.done():  # give an abandoned start a moment to return and be closed
            concurrent.futures.wait([start], timeout=min(self.spec.start_timeout, 10.0))
        close = getattr(obj, "close", None)
        if callable(close):
            self._close_quietly(close)
        self._worker.shutdown()

    def _close_quietly(self, close: Callable[[], Any]) -> None:
        try:
            close()
        except Exception:
            log.warning("%s: close() raised", self.id, exc_info=True)


class ObjectProxy:
    """The typed, async face of an object held by an :class:`InProcessResource`.

    Subclass it once per simulator and declare each method with :func:`forward`::

        class ScienceWorldProxy(ObjectProxy):
            step = forward(ScienceWorldSimulator.step)

    ``await proxy.step("look around", admissible=True)`` then runs ``ScienceWorldSimulator.step`` on the
    resource's thread (or in its child process).  A method the simulator does not have fails when the
    proxy class is defined (an ``AttributeError`` at import), a misspelt proxy method is an
    ``AttributeError`` (and a type checker's error) at the call site, and the forwarded signature is the
    simulator's own.

    Args:
        resource: the live resource (from ``scope.acquire`` or ``manager.acquire_global``).
    """

    def __init__(self, resource: InProcessResource) -> None:
        self.resource = resource

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.resource.id})"


class forward(Generic[S, P, T]):  # noqa: N801 - used like a decorator
    """Declare an :class:`ObjectProxy` method that runs ``fn(obj, *args, **kwargs)`` where the object lives.

    Args:
        fn: an unbound method of the object's class (a module-level function taking the object first
            also works).  Typed so that ``proxy.m(...)`` has ``fn``'s parameters (without the object)
            and returns an awaitable of its result.
    """

    def __init__(self, fn: Callable[Concatenate[S, P], T]) -> None:
        if not callable(fn):
            raise TypeError(f"forward() needs a method of the object's class, got {fn!r}")
        self.fn = fn
        self.__doc__ = getattr(fn, "__doc__", None)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, proxy: None, owner: type) -> forward[S, P, T]: ...
    @overload
    def __get__(self, proxy: ObjectProxy, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, proxy: ObjectProxy | None, owner: type) -> Any:
        if proxy is None:
            return self
        fn, resource = self.fn, proxy.resource

        async def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return await resource.invoke(fn, *args, **kwargs)

        method.__name__ = getattr(self, "name", getattr(fn, "__name__", "method"))
        method.__doc__ = self.__doc__
        return method
