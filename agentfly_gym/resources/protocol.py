"""The contract every resource manager keeps: :class:`Manager`.

Two managers implement it: :class:`~agentfly_gym.resources.ResourceManager` (pools in this process) and
:class:`~agentfly_gym.resources.ray.RayResourceManager` (pools shared by every process of a Ray job).
Environments, the vector env, rewards and the rollout runner take any ``Manager``;
:func:`~agentfly_gym.resources.select.default_manager` returns the one ``AGENTFLY_GYM_MANAGER`` names.

Both managers subclass :class:`Manager` explicitly, so they share its one implementation of :meth:`scope`
(a new :class:`~agentfly_gym.resources.scope.RolloutScope` of the manager's :attr:`scope_class`) and of
``async with``; everything else is each manager's own.  ``isinstance(obj, Manager)`` also holds for any
other object with these members (the protocol is runtime-checkable).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from .base import Resource
from .scope import RolloutScope, open_scope
from .spec import ResourceSpec

__all__ = ["Manager"]


@runtime_checkable
class Manager(Protocol):
    """Owns one pool per spec key and hands out rollout leases (:meth:`scope`) and shared ones
    (:meth:`acquire_global`).  One manager belongs to one event loop.

    Attributes:
        id: labels every resource the manager starts (containers carry it, so orphans can be reaped).
        acquire_timeout: default seconds an acquisition may wait on a saturated pool (None: no limit).
        scope_class: the :class:`RolloutScope` (sub)class :meth:`scope` makes.
    """

    id: str
    acquire_timeout: float | None
    scope_class: ClassVar[type[RolloutScope]] = RolloutScope

    def scope(self, scope_id: str | None = None, *, acquire_timeout: float | None = None,
              priority: float | None = None) -> RolloutScope:
        """A rollout scope: ``async with manager.scope("traj-3") as scope: ...``.

        Args:
            scope_id: the scope's id (``"scope-<n>"`` by default).
            acquire_timeout: default seconds an acquisition in the scope may wait (default: the manager's).
            priority: the scope's acquisitions' priority on saturated pools (larger first; None: the running
                task's, see :mod:`agentfly_gym.resources.priority`, else FIFO).

        Raises:
            PoolClosedError: the manager is closed.
        """
        return open_scope(self, self.scope_class, scope_id, acquire_timeout=acquire_timeout, priority=priority)

    def pool(self, spec: ResourceSpec) -> Any:
        """The pool of ``spec.key``, made on first use (``acquire``, ``release``, ``prewarm``, ``snapshot``).

        Raises:
            PoolClosedError: the manager is closed.
        """
        ...

    @property
    def pools(self) -> dict[str, Any]:
        """The pools made so far, by spec key."""
        ...

    async def acquire_global(self, spec: ResourceSpec, *, user: Any = None) -> Resource:
        """The shared instance of ``spec`` (a WebShop server, an LLM judge), started on first call.

        Args:
            user: who holds it (kept as a weak reference) until :meth:`leave_global`; once every user
                has left it is released ``spec.max_idle_time`` seconds later unless acquired again.
        """
        ...

    def leave_global(self, spec: ResourceSpec, user: Any) -> None:
        """``user`` (as given to :meth:`acquire_global`) no longer needs the shared instance of ``spec``."""
        ...

    async def destroy_global(self, spec: ResourceSpec) -> None:
        """Stop the shared instance of ``spec`` if one is live."""
        ...

    async def prewarm(self, spec: ResourceSpec, n: int | None = None) -> None:
        """Start ``n`` (default ``spec.min_idle``) idle instances of ``spec`` ahead of demand."""
        ...

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per pool (by spec key): in use, idle, waiting, started, reused, acquire wait and start times (seconds)."""
        ...

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` or :meth:`close` ran."""
        ...

    async def aclose(self) -> None:
        """Release every instance of every pool, in use or idle; idempotent."""
        ...

    def close(self) -> None:
        """Synchronous best-effort teardown (interpreter exit, SIGTERM, no loop available)."""
        ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
