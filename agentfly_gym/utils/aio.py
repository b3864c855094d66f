"""A process-wide background event loop that runs the async core for the sync API.

Gymnasium's ``reset``/``step`` are synchronous; ours wrap the async methods by running
them on one daemon thread's loop, so the same resources (and the default resource
manager of that loop) serve every sync caller, also from inside a running loop such as
a notebook's.  Nothing starts at import: the thread is created on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The background loop, started on first call."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=run, name="agentfly-gym-loop", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the background loop and block until it finishes; return its result.

    Raises whatever the coroutine raises.  Must not be called from the background loop itself.
    """
    loop = background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("run_sync called from the agentfly-gym background loop; await the coroutine instead")
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except (KeyboardInterrupt, concurrent.futures.TimeoutError):
        fut.cancel()
        raise


def on_background_loop() -> bool:
    """True when called from the background loop's thread."""
    return _thread is not None and threading.current_thread() is _thread


def shutdown_background_loop(timeout: float = 30.0) -> None:
    """Close the background loop's default resource manager, then stop the loop (used at exit)."""
    global _loop
    loop = _loop
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    from ..resources.manager import _default_managers

    manager = _default_managers.get(loop)
    if manager is not None and not manager.closed:
        try:
            asyncio.run_coroutine_threadsafe(manager.aclose(), loop).result(timeout)
        except Exception:
            manager.close_sync()
    loop.call_soon_threadsafe(loop.stop)
    _loop = None
