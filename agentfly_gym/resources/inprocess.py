"""In-process resources: objects built by a factory and driven from their own thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ConfigError, ResourceDied, ResourceStartError
from .base import Resource, ResourceStatus
from .spec import InProcessSpec

__all__ = ["InProcessResource", "load_factory"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``"package.module:attr.path"`` and return the callable.

    Raises:
        ConfigError: the module or attribute does not exist or is not callable.
    """
    mod_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"factory {path!r}: cannot import module {mod_name!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ConfigError(f"factory {path!r}: module {mod_name!r} has no attribute {attr!r}") from e
    if not callable(obj):
        raise ConfigError(f"factory {path!r} is not callable")
    return obj


class InProcessResource(Resource):
    """An object made by ``spec.factory(**spec.kwargs)``, owned by one worker thread.

    Every call (:meth:`call`, :meth:`run`, start, reset, health check) runs on that
    thread, one at a time, so the event loop never blocks on the object and a
    non-thread-safe object is never entered twice.  ``close()`` runs on a separate
    thread with ``spec.close_timeout`` so a stuck instance can still be abandoned.
    """

    def __init__(self, spec: InProcessSpec, *, labels: dict[str, str] | None = None) -> None:
        super().__init__(spec, labels=labels)
        self.spec: InProcessSpec = spec
        self.obj: Any = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"afg-{self.id}")
        self._dead: str | None = None
        self._closed = threading.Event()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the instance's thread and return its result."""
        if self._closed.is_set():
            raise ResourceDied(f"{self.id} was released")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``self.obj.<method>(*args, **kwargs)`` on the instance's thread."""
        return await self.run(getattr(self.obj, method), *args, **kwargs)

    def mark_dead(self, reason: str) -> None:
        """Record that the object stopped working (e.g. a step timed out); status becomes UNHEALTHY."""
        self._dead = reason
        self._status = ResourceStatus.UNHEALTHY

    async def start(self) -> None:
        factory = load_factory(self.spec.factory)
        self._status = ResourceStatus.STARTING
        try:
            self.obj = await self.run(factory, **self.spec.factory_kwargs)
        except ConfigError:
            raise
        except Exception as e:
            raise ResourceStartError(f"{self.spec.label}: factory {self.spec.factory} failed: {type(e).__name__}: {e}") from e
        self._status = ResourceStatus.READY

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
            except Exception:
                ok = False
            if not ok:
                self._status = ResourceStatus.UNHEALTHY
        return self._status

    async def release(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        obj, self.obj = self.obj, None
        self._status = ResourceStatus.STOPPED
        close = getattr(obj, "close", None)
        if callable(close):
            closer = threading.Thread(target=self._close_quietly, args=(close,), daemon=True, name=f"afg-close-{self.id}")
            closer.start()
            await asyncio.get_running_loop().run_in_executor(None, closer.join, self.spec.close_timeout)
            if closer.is_alive():
                log.warning("%s: close() did not return within %.0fs; abandoning it", self.id, self.spec.close_timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def terminate_sync(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        obj, self.obj = self.obj, None
        close = getattr(obj, "close", None)
        if callable(close):
            self._close_quietly(close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _close_quietly(self, close: Callable[[], Any]) -> None:
        try:
            close()
        except Exception:
            log.warning("%s: close() raised", self.id, exc_info=True)
