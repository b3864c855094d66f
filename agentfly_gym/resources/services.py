"""What the backends of one resource manager share: e.g. the Docker backend's client, thread pool and
disk watchdog (:class:`~agentfly_gym.resources.containers.docker.engine.DockerEngine`).

Process-wide state belongs to a manager, not to a module: every
:class:`~agentfly_gym.resources.ResourceManager` has one :class:`Services`, hands it to each instance
it builds (:attr:`agentfly_gym.resources.Resource.services`, set right after the backend's ``create``,
before ``start``) and closes it when it closes, after its instances are gone.  A forked child (e.g. a
worker of Gymnasium's ``AsyncVectorEnv``) makes its own manager, so it never uses its parent's threads
or connections.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, TypeVar

__all__ = ["Service", "Services"]


class Service(Protocol):
    """A shared helper: made with no arguments, closed once (``close()``: idempotent, never raises)."""

    def close(self) -> None: ...


S = TypeVar("S", bound=Service)


class Services:
    """One instance of each service class, made on first :meth:`get`, all closed by :meth:`close`.

    Thread-safe (backends call :meth:`get` from their worker threads too).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[type, Any] = {}

    def get(self, cls: type[S]) -> S:
        """The one ``cls()`` of this manager, made on first call (again after :meth:`close`)."""
        with self._lock:
            obj = self._items.get(cls)
            if obj is None:
                obj = self._items[cls] = cls()
            return obj

    def close(self) -> None:
        """Close every service made so far (in the reverse order of their making); never raises."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
        for obj in reversed(items):
            try:
                obj.close()
            except Exception:  # noqa: BLE001, S110 - a service's close is best effort at teardown
                pass

    def __contains__(self, cls: type) -> bool:
        return cls in self._items
