"""A ``uvicorn.Server`` that says when it accepts connections, and one that exits when asked from another thread:
what the OpenEnv bridge's servers wait on instead of polling uvicorn's ``started`` flag."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["exit_when_set", "started_server"]


def started_server(config: Any, *, on_started: Any = None) -> Any:
    """A ``uvicorn.Server`` for ``config`` that calls ``on_started()`` once it accepts connections (at the end of
    uvicorn's public ``Server.startup``), so nobody polls its ``started`` flag."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and on_started is not None:
                on_started()

    return _Server(config)


def exit_when_set(stop: threading.Event, server: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Ask ``server`` to exit (on ``loop``) once ``stop`` is set, from a daemon thread that waits on it."""
    def wait() -> None:
        stop.wait()
        try:
            loop.call_soon_threadsafe(setattr, server, "should_exit", True)
        except RuntimeError:  # the loop is closed: the server has ended already
            pass

    threading.Thread(target=wait, name="openenv-serve-stop", daemon=True).start()
