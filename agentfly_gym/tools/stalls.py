"""An async tool that blocks the event loop: what a tool's timeout can stop, and how the rest is reported.

A tool's timeout (``asyncio.timeout``) stops a coroutine only at an ``await``.  A tool written as ``async def`` that
blocks instead (``time.sleep``, a blocking HTTP or database client, a long pure-Python computation) holds the event
loop, and with it every rollout on that loop, until it returns: no timeout can interrupt it, because no code on the
loop runs meanwhile.  An async tool cannot be run elsewhere (its resources and clients belong to the loop), nor
can a blocking one be told from a well-behaved one before it runs.  So :func:`watch_loop_stalls` drives an async
tool's coroutine step by step (a step: the code it runs between two ``await``\\s, all of it on the loop) and times
each step:

* a watchdog thread (one per tool, :class:`StallWatch`) wakes at the call's deadline; when the tool still holds the
  loop then, it logs a WARNING naming the tool, the line it is blocked at and the fix (the loop cannot log anything
  while it is held);
* a step that holds the loop across the deadline ends the call: the coroutine is closed and
  :class:`ToolBlockedLoop` (a ``TimeoutError``) raised, so the model gets a timeout error and the late result is
  dropped, as if the timeout had held (every other rollout on the loop was still stalled meanwhile);
* a step that holds the loop over :data:`STALL_WARN_S` but ends in time is logged once per tool (WARNING).

The fix is the tool's own: write it as a plain ``def`` (it then runs on a daemon thread of its own, see
:mod:`.threads`, where its timeout holds) or ``await asyncio.to_thread(...)`` its blocking part.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import types
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import ToolError

__all__ = ["STALL_WARN_S", "StallWatch", "ToolBlockedLoop", "watch_loop_stalls"]

log = logging.getLogger(__name__)

#: Seconds one step of an async tool may hold the event loop before it is logged (once per tool) as a stall.
STALL_WARN_S = 1.0

_FIX = ("a blocking call inside 'async def' (time.sleep, a blocking client, a long computation) holds the event loop "
        "and every rollout on it, and no timeout can stop it; make the tool a plain 'def' (it then runs on a thread "
        "of its own and its timeout holds) or await its blocking part with asyncio.to_thread(...)")


class ToolBlockedLoop(ToolError, TimeoutError):
    """An async tool held the event loop past its call's deadline (a blocking call inside ``async def``).

    Attributes:
        tool: the tool's name.
        held_s: seconds its last step held the loop.
        timeout: the tool's timeout, seconds.
    """

    def __init__(self, tool: str, held_s: float, timeout: float | None) -> None:
        super().__init__(f"the tool {tool!r} blocked the event loop for {held_s:.1f} s, past its timeout of {timeout} s "
                         "(a blocking call inside 'async def'); its result is dropped")
        self.tool, self.held_s, self.timeout = tool, held_s, timeout


def _where(coro: Any) -> str:
    """``file:line`` of the innermost coroutine frame of ``coro`` (best effort, read from another thread)."""
    try:
        while getattr(coro, "cr_await", None) is not None and getattr(coro.cr_await, "cr_frame", None) is not None:
            coro = coro.cr_await
        frame = coro.cr_frame
        return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
    except Exception:  # noqa: BLE001  (a frame changing under us: the report goes out without it)
        return "?"


class _Watch:
    """One call's state, shared with the watchdog thread: when the running step began (None between steps)."""

    __slots__ = ("name", "coro", "timeout", "wake", "step_start", "done")

    def __init__(self, name: str, coro: Any, timeout: float | None, wake: float) -> None:
        self.name, self.coro, self.timeout, self.wake = name, coro, timeout, wake
        self.step_start: float | None = None
        self.done = False

    def at_deadline(self, clock: Callable[[], float]) -> None:
        start = self.step_start
        if self.done or start is None:
            return  # between steps: asyncio's timeout cancels the call now
        log.warning("tool %r has held the event loop for %.1f s, past its timeout of %s s, at %s: every rollout on this "
                    "loop is stalled until it returns; %s", self.name, clock() - start, self.timeout,
                    _where(self.coro), _FIX)


class StallWatch:
    """What one tool keeps about its stalls: whether a stall within the timeout was logged yet, and the watchdog,
    a daemon thread (started on the first call with a deadline, gone after :attr:`IDLE_S` without one) that wakes
    at the deadline of each running call; one per tool, so a call costs a lock and no thread start."""

    IDLE_S = 10.0

    def __init__(self) -> None:
        self.warned = False
        self._cond = threading.Condition()
        self._watches: set[_Watch] = set()
        self._thread: threading.Thread | None = None
        self._sleep_until = math.inf

    def __reduce__(self) -> tuple[type, tuple]:  # a copy (a pickled tool) starts with no thread and no stall seen
        return StallWatch, ()

    def add(self, watch: _Watch) -> None:
        with self._cond:
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():  # first use, idle exit, or a forked child
                self._thread = threading.Thread(target=self._run, name=f"afg-stall-watch-{watch.name}", daemon=True)
                self._sleep_until = -math.inf
                self._thread.start()
            elif watch.wake < self._sleep_until:
                self._cond.notify()

    def remove(self, watch: _Watch) -> None:
        with self._cond:
            self._watches.discard(watch)

    def _run(self) -> None:
        clock = time.monotonic
        with self._cond:
            while True:
                now = clock()
                for w in [w for w in self._watches if w.wake <= now]:
                    self._watches.discard(w)
                    w.at_deadline(clock)
                if self._watches:
                    self._sleep_until = min(w.wake for w in self._watches)
                    self._cond.wait(self._sleep_until - now)
                    continue
                self._sleep_until = now + self.IDLE_S
                if not self._cond.wait(self.IDLE_S) and not self._watches:
                    self._thread = None
                    self._sleep_until = math.inf
                    return


@types.coroutine
def _drive(coro: Coroutine[Any, Any, Any], watch: _Watch, clock: Callable[[], float], deadline: float | None,
           stalls: StallWatch) -> Any:
    """``yield from coro``, timing each step (see the module docstring)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        start = clock()
        watch.step_start = start
        result: Any = None
        finished = False
        try:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            finally:
                watch.step_start = None
                end = clock()
        except StopIteration as stop:
            finished, result = True, stop.value
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except BaseException:
            if deadline is not None and start < deadline < end:
                raise ToolBlockedLoop(watch.name, end - start, watch.timeout) from None
            raise
        held = end - start
        if deadline is not None and start < deadline < end:  # it held the loop across its deadline
            if not finished:
                try:
                    coro.close()
                except RuntimeError:  # it awaited again while closing ("ignored GeneratorExit"): dropped anyway
                    pass
            log.warning("tool %r blocked the event loop for %.1f s, past its timeout of %s s: its result is dropped; "
                        "%s", watch.name, held, watch.timeout, _FIX)
            raise ToolBlockedLoop(watch.name, held, watch.timeout)
        if held > STALL_WARN_S and not stalls.warned:
            stalls.warned = True
            log.warning("tool %r held the event loop for %.1f s in one step (logged once per tool): every rollout on "
                        "this loop waited; %s", watch.name, held, _FIX)
        if finished:
            return result
        try:
            value, error = (yield yielded), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # noqa: BLE001  (thrown in by the task, e.g. a cancellation: passed to the tool)
            value, error = None, e


async def watch_loop_stalls(coro: Coroutine[Any, Any, Any], *, name: str, timeout: float | None,
                            deadline: float | None, stalls: StallWatch) -> Any:
    """``await coro`` (an async tool's call), watching for steps that block the event loop.

    Args:
        coro: the tool's coroutine (not yet started).
        name: the tool's name (for messages).
        timeout: the tool's timeout in seconds (for messages).
        deadline: the call's deadline in the loop's clock (``loop.time()``; e.g. ``asyncio.timeout(...).when()``),
            or None (no deadline: stalls are still logged).
        stalls: the tool's :class:`StallWatch`.

    Returns:
        What ``coro`` returns; raises what it raises.

    Raises:
        ToolBlockedLoop: a step of ``coro`` held the loop across ``deadline`` (the coroutine is closed).
    """
    loop = asyncio.get_running_loop()
    watch = None
    if deadline is not None:
        watch = _Watch(name, coro, timeout, time.monotonic() + max(0.0, deadline - loop.time()) + 0.05)
        stalls.add(watch)
    try:
        return await _drive(coro, watch or _Watch(name, coro, timeout, math.inf), loop.time, deadline, stalls)
    finally:
        if watch is not None:
            watch.done = True
            stalls.remove(watch)
