"""Blocking user code (a sync tool, a sync reward) on a daemon thread of its own.

``asyncio.to_thread`` would run it on the loop's default executor: a call stuck past its timeout would hold one of
that pool's few workers for good (a handful of them stop every later sync tool and reward of the process), and the
interpreter waits for that pool's threads at exit, so one stuck call keeps a finished training script alive.  Here
each call gets its own daemon thread: a call abandoned at its timeout costs one idle thread, nothing else waits on it,
and the process exits without it.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any

from ..errors import ToolError

__all__ = ["UserCodeExit", "run_in_daemon_thread"]


class UserCodeExit(ToolError, RuntimeError):
    """User code run on a thread (a sync tool or reward) raised ``SystemExit`` or ``KeyboardInterrupt``
    (e.g. ``argparse`` on bad arguments calls ``sys.exit(2)``); the original is the ``__cause__``."""


def _settle(fut: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if fut.done():  # abandoned (the caller's timeout cancelled it)
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


async def run_in_daemon_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``await`` ``fn(*args, **kwargs)`` run on a new daemon thread (with the caller's context variables).

    Returns what ``fn`` returns; raises what it raises, except ``SystemExit`` and ``KeyboardInterrupt``, which come
    back as :class:`UserCodeExit` (so they cannot stop the event loop).  Cancelling the await (e.g. ``asyncio.wait_for``'s timeout)
    abandons the thread: it runs on until ``fn`` returns, and its result is dropped.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()
    ctx = contextvars.copy_context()

    def target() -> None:
        try:
            value, error = ctx.run(fn, *args, **kwargs), None
        except Exception as e:  # noqa: BLE001 - handed to the awaiting coroutine
            value, error = None, e
        except BaseException as e:  # noqa: BLE001 - SystemExit (argparse, sys.exit) or KeyboardInterrupt from user code
            # set on a future and awaited, it would stop the event loop itself (asyncio re-raises both out of the
            # loop): the awaiting coroutine gets an ordinary exception instead
            value, error = None, UserCodeExit(f"{type(e).__name__}({', '.join(map(repr, e.args))})")
            error.__cause__ = e
        try:
            loop.call_soon_threadsafe(_settle, fut, value, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=target, name=f"afg-tool-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await fut
