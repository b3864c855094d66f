"""Waiting for something to happen in a test: poll the condition itself until a deadline, never a fixed sleep.

A fixed sleep is a guess at how long something takes; on a loaded 2-core CI machine the guess is wrong in one
direction (the test flakes) and on a fast one in the other (the test waits for nothing).  Where no event exists
(a process to exit, a waiter to queue in a pool, a file to be written by another process), poll the real
condition with a deadline and fail with what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
               interval: float = 0.05) -> T:
    """Call ``cond`` every ``interval`` s until it returns a true value, and return that value.

    Raises:
        AssertionError: ``cond`` was still false after ``timeout`` seconds (the message names ``what``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def until(cond: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
                interval: float = 0.02) -> T:
    """:func:`wait_until` on the running event loop (the loop keeps running between the checks)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = cond()
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


def threads_running(path_part: str, function: str | None = None, *, thread_prefix: str = "") -> list[str]:
    """Names of this process's threads now running code from a file whose path contains ``path_part`` (in
    ``function``, if given), among the threads whose name starts with ``thread_prefix``: e.g. whether a blocking
    call made in a worker thread is still under way, where the call offers no event of its own."""
    import sys
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    busy = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, "")
        if not name.startswith(thread_prefix):
            continue
        while frame is not None:
            code = frame.f_code
            if path_part in code.co_filename and (function is None or code.co_name == function):
                busy.append(name)
                break
            frame = frame.f_back
    return busy
