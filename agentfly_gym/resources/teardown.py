"""Teardown at process end: no container, sandbox, simulator or server outlives its Python process.

One owner: every :class:`~agentfly_gym.resources.ResourceManager` keeps a registry of the live
instances it built and registers itself here (:func:`watch`) when it is created; so does the
cluster-wide :class:`~agentfly_gym.resources.ray.RayResourceManager` (its ``close`` detaches
from the cluster pools, whose last user stops their instances).  At interpreter
exit (``atexit``: a normal exit, an uncaught exception, Ctrl-C's ``KeyboardInterrupt``; in a
``multiprocessing`` child, whose exit skips ``atexit``, its exit finalizers) and on SIGTERM, :func:`close_all` calls ``destroy()`` on every live instance of every
manager not yet closed, in parallel threads (removing a container takes a round trip to the
engine), bounded by :data:`DESTROY_TIMEOUT` seconds.

Signal handlers belong to the application: making a manager or an environment installs none.  The
SIGTERM teardown handler (:func:`install`) is installed by ``agentfly-gym`` (every command) and, for the
length of a run, by :func:`agentfly_gym.rollout.runner.run_rollouts` (:func:`sigterm_teardown`);
a script that makes environments itself and wants SIGTERM to stop its containers, simulators and
engines calls ``agentfly_gym.resources.teardown.install()`` once, on the main thread.  Without it a
SIGTERM ends the process by default and what it started is left to ``agentfly-gym resources gc``
(exit by ``sys.exit``, an uncaught exception or Ctrl-C tears down without any handler: ``atexit``).

A library started on the way that would install a SIGTERM handler of its own (``ray.init``) is started
under :func:`hold_sigterm`, so a SIGTERM during its start neither cuts it short nor displaces the
application's handler.

Backends install no handler of their own; they implement ``Resource.destroy`` (synchronous,
idempotent, never raises).  What a SIGKILLed process leaves is found by its ownership labels and
removed by ``agentfly-gym resources gc`` (:mod:`agentfly_gym.resources.containers.ownership`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Resource

__all__ = ["DESTROY_TIMEOUT", "SigtermHold", "close_all", "hold_sigterm", "install", "sigterm_teardown",
           "destroy_all", "watch"]

log = logging.getLogger(__name__)

DESTROY_TIMEOUT = 30.0
"""Seconds :func:`destroy_all` waits for the instances' ``destroy`` calls together."""

# ResourceManager or RayResourceManager -> the pid that made it (a forked child must not tear down its parent's)
_live_managers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_atexit_registered = False
_finalizer_pid: int | None = None  # the process that registered the multiprocessing finalizer
_lock = threading.Lock()


def watch(manager: Any, *, run_first: bool = False) -> None:
    """Tear ``manager``'s live instances down at exit, and on SIGTERM where the application installed
    :func:`install` (while it is not closed).

    ``manager`` is a :class:`~agentfly_gym.resources.ResourceManager` or any manager with ``id``,
    ``closed`` and ``close()`` (the Ray-backed one).  Registers the ``atexit`` hook once per
    process; installs no signal handler.

    Args:
        run_first: move the exit hook behind every hook registered so far, so that it runs before
            them (``atexit`` runs the last registered first).  A manager whose teardown needs a
            library that registers its own shutdown at exit (Ray: ``ray.init`` registers
            ``ray.shutdown``) passes it after starting that library.
    """
    global _atexit_registered
    with _lock:
        _live_managers[manager] = os.getpid()
        if run_first and _atexit_registered:
            atexit.unregister(_close_all_at_exit)
            _atexit_registered = False
        if not _atexit_registered:
            atexit.register(_close_all_at_exit)
            _atexit_registered = True
        _finalize_in_multiprocessing_child()


def _finalize_in_multiprocessing_child() -> None:
    """In a ``multiprocessing`` child (e.g. a worker of Gymnasium's ``AsyncVectorEnv``), also tear down
    when its target returns: such a child ends with ``os._exit``, which skips ``atexit``, but first
    runs ``multiprocessing``'s own exit finalizers."""
    global _finalizer_pid
    import multiprocessing
    import multiprocessing.util

    # per process: a forked child inherits this module's flags but not the parent's finalizers
    if _finalizer_pid != os.getpid() and multiprocessing.parent_process() is not None:
        multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=100)
        _finalizer_pid = os.getpid()


def destroy_all(instances: Iterable[Resource], *, timeout: float = DESTROY_TIMEOUT) -> None:
    """Call ``destroy()`` on every instance, in parallel threads; best effort, never raises.

    Falls back to one after the other where no thread can be started (interpreter shutdown).
    """
    items = list(dict.fromkeys(instances))  # unique, in order

    def one(r: Resource) -> None:
        try:
            r.destroy()
        except Exception:  # pragma: no cover - best effort while dying
            log.debug("destroy failed for %r", r, exc_info=True)

    if len(items) <= 1:
        for r in items:
            one(r)
        return
    threads: list[threading.Thread] = []
    for r in items:
        t = threading.Thread(target=one, args=(r,), name="afg-teardown", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no new threads at interpreter shutdown
            one(r)
            continue
        threads.append(t)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def close_all() -> None:
    """Tear down every live instance of every manager this process made and has not closed (synchronously)."""
    pid = os.getpid()
    with _lock:
        managers = [m for m, owner in list(_live_managers.items()) if owner == pid and not m.closed]
    for m in managers:
        try:
            m.close()
        except Exception:  # pragma: no cover - best effort while dying
            log.debug("closing manager %s failed", m.id, exc_info=True)


def _close_all_at_exit() -> None:
    """Interpreter exit: tear down every live manager's instances, then stop the background loop.

    Thread pools refuse new work at this point, so no coroutine (and no ``release()``) runs;
    each resource's ``destroy()`` does the work.
    """
    from ..utils.aio import close_background_loop

    close_all()
    close_background_loop()


_prev_sigterm = None


def _on_sigterm(signum, frame) -> None:
    """SIGTERM: tear down every live manager's instances, then behave as the previous handler did."""
    try:
        close_all()
    except Exception:  # noqa: BLE001, S110 # pragma: no cover - best effort while dying
        pass
    prev = _prev_sigterm
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install() -> bool:
    """Make SIGTERM release every live resource (containers, sandboxes, JVMs, engines, servers)
    before the process ends.  For the application to call (``agentfly-gym`` does, and
    :func:`sigterm_teardown` for a run): making a manager or an environment never installs it.  Idempotent.

    Python runs ``atexit`` hooks on a normal exit and on Ctrl-C (``KeyboardInterrupt``), but not
    when SIGTERM's default action kills the process; this handler tears resources down
    synchronously and then lets the default action end the process.  Only the main thread may
    install signal handlers (off it this installs nothing).
    Installed only while SIGTERM has its default action: an application that handles SIGTERM
    itself (e.g. by cancelling its tasks, as ``agentfly-gym rollout`` does) stays in charge.

    Returns:
        Whether the handler is installed.
    """
    global _prev_sigterm
    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(signal.SIGTERM) is _on_sigterm
    cur = signal.getsignal(signal.SIGTERM)
    if cur is _on_sigterm:
        return True
    if cur not in (signal.SIG_DFL, None):  # the application handles SIGTERM itself (e.g. cancels its tasks)
        return False
    _prev_sigterm = cur
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


@contextlib.contextmanager
def sigterm_teardown():
    """:func:`install` for the length of the block, then the handler that was there before is put back.

    What a runner that may own the process (:func:`agentfly_gym.rollout.runner.run_rollouts`) does around
    its run.  A no-op where :func:`install` installs nothing (off the main thread, or SIGTERM already
    handled by the application).  Yields whether the teardown handler is in charge.
    """
    before = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    installed = install()
    try:
        yield installed
    finally:
        if (installed and before is not _on_sigterm and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is _on_sigterm):
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


class SigtermHold:
    """What :func:`hold_sigterm` yields: whether a SIGTERM arrived, and the handler a library asked for meanwhile.

    Attributes:
        received: a SIGTERM arrived while held (it is delivered when the hold ends).
        library_handler: what a starting library asked to install (see :meth:`keep`), or None.
    """

    def __init__(self) -> None:
        self.received = False
        self.library_handler: Any = None

    def _hold(self, signum, frame) -> None:
        self.received = True

    def keep(self, handler: Any) -> None:
        """Record ``handler`` instead of installing it (a library's ``signal.signal(SIGTERM, handler)`` stand-in)."""
        self.library_handler = handler


@contextlib.contextmanager
def hold_sigterm():
    """Hold SIGTERM while a library that installs a SIGTERM handler of its own starts (``ray.init``).

    A process stopped half-way through such a start leaves what it had begun behind (``ray.init`` cut
    short by SIGTERM orphans the Ray dashboard's helper processes for up to a minute).  Inside the block a
    SIGTERM is only recorded; when the block ends (the start finished or failed), the handler in charge is
    put back and the signal is delivered to it, so the process ends the way it ends on any other SIGTERM.
    The handler put back is the application's own (one that was there before: e.g. ``agentfly-gym
    rollout``'s, which cancels the run and saves what finished), else the one the library asked for through
    :meth:`SigtermHold.keep` (Ray's exits through ``atexit``, where Ray and these managers shut down), else
    the one that was there (the default action, or :func:`install`'s).

    A no-op off the main thread (only the main thread receives signal handlers' calls).
    """
    hold = SigtermHold()
    if threading.current_thread() is not threading.main_thread():
        yield hold
        return
    prev = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, hold._hold)
    try:
        yield hold
    finally:
        application = prev is signal.SIG_IGN or (callable(prev) and prev is not _on_sigterm)
        if application or hold.library_handler is None:
            signal.signal(signal.SIGTERM, prev if prev is not None else signal.SIG_DFL)
        else:
            signal.signal(signal.SIGTERM, hold.library_handler)
        if hold.received:
            signal.raise_signal(signal.SIGTERM)
