"""Fork safety, in one place: what a forked child must forget of its parent, and the one hook that does it.

A child made by ``os.fork`` (Gymnasium's ``AsyncVectorEnv`` with the ``fork`` start method, a
``multiprocessing`` fork pool) inherits the parent's memory but only the thread that forked: every object
another thread served (a loop it ran, a queue it drained, a lock it held at that moment, a pipe to a worker
process) is a copy that nobody serves in the child, and waiting on it waits forever.

Resource managers need nothing here.  A child runs its environments on an event loop of its own and gets a
default manager of its own (:func:`agentfly_gym.resources.default_manager`: one per loop), and with it its
own Docker client, thread pool and disk watchdog (:mod:`agentfly_gym.resources.services`); a pool bound to
the parent's loop refuses the child's (``EventLoopMismatch``).  What is process-wide and owned by no
manager is registered here with :func:`forget_in_child`:

* the background event loop of the synchronous API (:mod:`agentfly_gym.utils.aio`): its thread;
* the ALFWorld translation worker (:mod:`agentfly_gym.envs.alfworld.engine_cache`): its thread and pipes.

Each is started again on first use in the child.  This module registers the package's only
``os.register_at_fork`` hook (``tests/test_process_state.py`` counts them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

__all__ = ["forget_in_child"]

log = logging.getLogger(__name__)

_in_child: list[Callable[[], None]] = []


def forget_in_child(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn()`` in every child forked after this call, before anything else runs there (a decorator).

    ``fn`` drops the parent's copy of a process-wide object so that the child makes its own on first use;
    it must not block or start threads.  Returns ``fn``.
    """
    _in_child.append(fn)
    return fn


def _after_fork_in_child() -> None:
    for fn in _in_child:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failing hook must not break the child's start
            log.warning("forgetting the parent's %s in a forked child failed", getattr(fn, "__qualname__", fn),
                        exc_info=True)


os.register_at_fork(after_in_child=_after_fork_in_child)
