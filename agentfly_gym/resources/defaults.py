"""The manager each event loop uses by default: made by :func:`~agentfly_gym.resources.select.default_manager`
(which chooses its kind), kept here so that code below the managers (a Ray host actor closing what its loop
acquired) can find it without importing the choice of manager."""

from __future__ import annotations

import asyncio
import weakref

from .protocol import Manager

__all__ = ["loop_default", "set_loop_default"]

_default_managers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Manager] = weakref.WeakKeyDictionary()


def loop_default(loop: asyncio.AbstractEventLoop | None = None) -> Manager | None:
    """The open default manager of ``loop`` (default: the running loop), or None when none was made or it is closed.

    Raises:
        RuntimeError: no ``loop`` is given and no loop is running.
    """
    m = _default_managers.get(loop or asyncio.get_running_loop())
    return None if m is None or m.closed else m


def set_loop_default(loop: asyncio.AbstractEventLoop, manager: Manager) -> None:
    """Make ``manager`` the default manager of ``loop`` (kept while the loop lives)."""
    _default_managers[loop] = manager
