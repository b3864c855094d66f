"""Priorities of waiting acquisitions: who gets a saturated pool's next free instance.

A pool serves its waiters FIFO unless they carry a priority.  A rollout that is predicted to run long
should start first when instances are scarce (longest-first list scheduling: the last wave, where one
long rollout keeps the batch waiting while the other slots idle, shrinks), so an acquisition may carry a
``priority`` (a number; larger is served first, e.g. the rollout's predicted seconds).  The rule, shared by
the in-process pool and the Ray cluster pool:

1. a waiter that has waited ``age_bound`` seconds or more is served before any other, oldest first
   (so nothing starves, whatever the priorities of later arrivals);
2. otherwise the waiter with the largest priority; ``None`` (nothing known) counts as 0;
3. ties, and waiters without priorities, in arrival order (FIFO).

A priority travels with the acquisition: :meth:`RolloutScope.acquire
<agentfly_gym.resources.scope.RolloutScope.acquire>` passes the scope's ``priority`` or, when it has none, the
one set for the running task with :func:`acquire_priority` (the rollout runners set it around each episode,
so an environment's own acquisitions carry it without knowing about it).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["DEFAULT_AGE_BOUND_S", "acquire_priority", "current_priority", "serve_order"]

T = TypeVar("T")

# seconds a prioritised waiter may be overtaken before it is served in arrival order
DEFAULT_AGE_BOUND_S = 300.0

# the priority of the running task's acquisitions (None: FIFO); a context variable, so each asyncio task
# (each rollout) has its own and tasks it spawns inherit it
_PRIORITY: contextvars.ContextVar[float | None] = contextvars.ContextVar("agentfly_gym_acquire_priority",
                                                                         default=None)


def current_priority() -> float | None:
    """The priority :func:`acquire_priority` set for the running task (None: none)."""
    return _PRIORITY.get()


class acquire_priority:  # noqa: N801 - used as a function-like context manager, as contextlib's are
    """``with acquire_priority(p):`` (or ``async with``): every acquisition made in the block, in this task and
    in tasks it starts, carries ``priority``.

    Args:
        priority: larger is served first among waiters of a saturated pool; None: FIFO.
    """

    __slots__ = ("priority", "_token")

    def __init__(self, priority: float | None) -> None:
        self.priority = None if priority is None else float(priority)
        self._token: contextvars.Token | None = None

    def __enter__(self) -> None:
        self._token = _PRIORITY.set(self.priority)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _PRIORITY.reset(self._token)
            self._token = None

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


def serve_order(waiters: Sequence[T], rank: Callable[[T], tuple[float | None, float]], *, now: float,
                age_bound: float | None = DEFAULT_AGE_BOUND_S) -> list[T]:
    """``waiters`` (in arrival order) in the order they are to be served (see the module's rule).

    Args:
        waiters: the waiting acquisitions, oldest first.
        rank: a waiter's ``(priority, enqueued_at)``; ``enqueued_at`` in the clock of ``now`` (seconds).
        now: the current time (``time.monotonic()``).
        age_bound: seconds after which a waiter is served in arrival order before any other (None: never).
    """
    def key(item: tuple[int, T]) -> tuple[int, float, int]:
        i, w = item
        priority, since = rank(w)
        if age_bound is not None and now - since >= age_bound:
            return (0, 0.0, i)
        return (1, -(priority or 0.0), i)

    return [w for _, w in sorted(enumerate(waiters), key=key)]
