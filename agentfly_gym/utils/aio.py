"""A process-wide background event loop that runs the async core for the sync API.

Gymnasium's ``reset``/``step`` are synchronous; ours wrap the async methods by running
them on one daemon thread's loop, so the same resources (and the default resource
manager of that loop) serve every sync caller, also from inside a running loop such as
a notebook's.  Nothing starts at import: the thread is created on first use.

A forked child (e.g. a worker of Gymnasium's ``AsyncVectorEnv`` with the ``fork`` start method)
inherits the loop object but not its thread: it forgets the parent's loop (:mod:`agentfly_gym.utils.forks`)
and starts its own on first use (and so gets its own default manager), instead of waiting forever on a
loop nobody runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .forks import forget_in_child

T = TypeVar("T")


class _LoopThread:
    """The background loop and the daemon thread that runs it (both made on first :meth:`get`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or self.loop.is_closed():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self.thread = threading.Thread(target=run, name="agentfly-gym-loop", daemon=True)
                self.thread.start()
                ready.wait()
                self.loop = loop
            return self.loop

    def stop(self) -> None:
        loop, self.loop = self.loop, None
        if loop is not None and not loop.is_closed() and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)


_background = _LoopThread()


@forget_in_child
def _forget_parent_loop() -> None:
    """In a forked child: the parent's loop thread does not exist here (its lock may be held); start afresh."""
    _background.__init__()


def background_loop() -> asyncio.AbstractEventLoop:
    """The background loop, started on first call."""
    return _background.get()


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the background loop and block until it finishes; return its result.

    Raises whatever the coroutine raises.  Must not be called from the background loop itself.
    """
    loop = background_loop()
    if threading.current_thread() is _background.thread:
        coro.close()
        raise RuntimeError("run_sync called from the agentfly-gym background loop; await the coroutine instead")
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except (KeyboardInterrupt, concurrent.futures.TimeoutError):
        fut.cancel()
        raise


def close_background_loop() -> None:
    """Stop the background loop (used at interpreter exit, after resources were torn down).

    At exit no coroutine is run: thread pools refuse new work by then, so resources are
    torn down synchronously (:meth:`ResourceManager.close`) by the caller.
    """
    _background.stop()
