"""The lifecycle every resource follows: start, reset, status, adestroy (destroy at exit)."""

from __future__ import annotations

import abc
import enum
import itertools
import time
from typing import TYPE_CHECKING, Any

from .spec import ResourceSpec

if TYPE_CHECKING:
    from .services import Services

__all__ = ["Resource", "ResourceStatus"]

_ids = itertools.count(1)


class ResourceStatus(enum.Enum):
    """Where a resource instance is in its lifecycle.

    ``READY`` is the only healthy state a pool hands out; ``UNHEALTHY`` and ``STOPPED``
    instances are destroyed and replaced.
    """

    CREATED = "created"
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"


class Resource(abc.ABC):
    """One live instance of a :class:`ResourceSpec`.

    Backends subclass this and implement the four async lifecycle methods.  Pools call
    them; tool, environment and reward code never allocate or clean up by themselves.

    Attributes:
        spec: the spec this instance was built from.
        id: ``"<kind>-<n>"``, unique in this process.
        uses: how many times a pool has handed this instance out.
        labels: backend metadata (e.g. the manager id a container is labelled with).
        services: the shared helpers of the manager that built this instance
            (:class:`~agentfly_gym.resources.services.Services`; set by the manager before ``start``), or
            None for an instance made by hand.  A backend takes its process-level helpers (clients,
            thread pools) from here, never from module globals.
    """

    services: Services | None = None

    def __init__(self, spec: ResourceSpec, *, labels: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.id = f"{spec.kind}-{next(_ids)}"
        self.uses = 0
        self.labels: dict[str, str] = dict(labels or {})
        self.created_at = time.monotonic()
        self.last_released_at: float | None = None
        self._status = ResourceStatus.CREATED

    @abc.abstractmethod
    async def start(self) -> None:
        """Bring the instance up; raises :class:`~agentfly_gym.errors.ResourceStartError` on failure."""

    @abc.abstractmethod
    async def reset(self) -> None:
        """Return the instance to a clean state before it serves another rollout.

        Called by the pool on every re-acquisition; an exception here makes the pool
        discard the instance and start a fresh one.
        """

    @abc.abstractmethod
    async def status(self) -> ResourceStatus:
        """Check health now (e.g. is the process or container still alive)."""

    @abc.abstractmethod
    async def adestroy(self) -> None:
        """Stop the instance and free everything it holds; idempotent, never raises.

        Called by the pool only: a rollout gives its lease back with ``pool.release(resource)`` (or its
        scope does), and the pool decides whether the instance is kept for reuse or destroyed.
        """

    async def park(self) -> None:
        """Called by the pool when this instance goes back idle (no waiter took it): stop the last
        rollout's work now, e.g. its background processes, so an idle instance costs nothing.

        Default: nothing.  Never raises.  The next acquisition still calls :meth:`reset` first.
        """

    def destroy(self) -> None:
        """Synchronous, best-effort :meth:`adestroy` for interpreter exit and SIGTERM, when no event loop
        may run (:func:`agentfly_gym.resources.teardown.destroy_all` calls it); idempotent, never raises.
        Default: nothing (an in-process object dies with the process)."""

    def describe(self) -> dict[str, Any]:
        """A small JSON-able summary for logs and metrics."""
        return {"id": self.id, "kind": self.spec.kind, "pool": self.spec.key, "uses": self.uses, "status": self._status.value}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self._status.value} uses={self.uses}>"
