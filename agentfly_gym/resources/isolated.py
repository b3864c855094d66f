"""An object built and driven in a child process: ``InProcessSpec(isolation="process")``.

:class:`ChildProcessObject` starts a fresh interpreter (``python -c``, so the parent's ``__main__`` is never
re-imported, unlike ``multiprocessing``'s spawn), builds ``factory(**kwargs)`` there and then runs calls sent over a pipe, one at a time: the parent sends
``fn, args, kwargs`` and the child answers ``fn(obj, *args, **kwargs)``.  ``fn`` travels by reference
(pickled by its qualified name), so it is an unbound method of the object's class
(``WebShopServer.step``) or another module-level callable; arguments and results are pickled.

Guarantees:

- The child dies with its parent, also when the parent is killed with SIGKILL: on Linux the child
  asks for ``SIGKILL`` on its parent's death (``prctl(PR_SET_PDEATHSIG)``; the "parent" is the thread
  that started it, which is the owning resource's worker thread and lives as long as the resource),
  and everywhere a watcher thread exits the child once its parent process is gone.
- An exception raised by the object crosses as the same exception (its remote traceback attached as
  ``__cause__``), or as a ``RuntimeError`` naming its type where it cannot be pickled.
- A child that exited (killed, crashed) turns every later call into :class:`ResourceDied` naming its
  pid and exit code; nothing hangs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ..errors import ResourceDied, ResourceStartError

__all__ = ["ChildProcessObject"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_INTERVAL = 0.5  # seconds between the child's checks that its parent is alive


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in the child process (attached as ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def _die_with_parent(parent_pid: int) -> None:
    """In the child: be killed when the parent goes (PDEATHSIG on Linux, plus a watcher thread)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - the watcher thread still covers it
            pass
    if os.getppid() != parent_pid:  # the parent went before the request took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(_WATCH_INTERVAL)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="afg-parent-watch", daemon=True).start()


def _error_reply(e: BaseException) -> tuple[str, Any, str]:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        pickle.loads(pickle.dumps(e))
        return ("err", e, tb)
    except Exception:  # noqa: BLE001 - an exception that cannot cross is replaced by one that can
        return ("err", RuntimeError(f"{type(e).__module__}.{type(e).__qualname__}: {e}"), tb)


def _child_main(fd: int) -> None:
    """The child process (``python -c``): build the object, answer calls until told to close or the pipe breaks."""
    conn = Connection(fd)
    factory_path, kwargs, parent_pid, path = conn.recv()
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    sys.path[:] = path
    from ..utils.imports import load_object

    try:
        obj = load_object(factory_path, what="factory")(**kwargs)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(_error_reply(e))
        return
    conn.send(("ok", os.getpid(), ""))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the parent is gone
            break
        fn: Any = None
        try:
            msg = pickle.loads(data)
            if msg is None:
                break
            fn, args, kw = msg
            reply: tuple[str, Any, str] = ("ok", fn(obj, *args, **kw), "")
        except Exception as e:  # noqa: BLE001 - handed to the caller (also a call this process cannot unpickle)
            reply = _error_reply(e)
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable result is the caller's error
            if isinstance(e, (BrokenPipeError, EOFError)):
                break
            conn.send(_error_reply(TypeError(f"the result of {getattr(fn, '__qualname__', fn)!r} cannot be sent "
                                             f"to the parent process: {type(e).__name__}: {e}")))
    close = getattr(obj, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - the process ends anyway
            log.warning("close() raised in the child process", exc_info=True)


def _call_optional(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.<name>()`` where the object has that method, else ``default`` (runs in the child)."""
    fn = getattr(obj, name, None)
    return fn() if callable(fn) else default


class ChildProcessObject:
    """The parent's handle of an object living in a child process.

    Args:
        factory: ``"package.module:callable"`` (imported in the child).
        kwargs: the factory's keyword arguments (pickled to the child).
        start_timeout: seconds the child may take to build the object.
        close_timeout: seconds :meth:`close` waits for the child to close its object and exit.
        name: the child process's name (logs, ``ps``).

    Raises:
        ResourceStartError: the child exited or did not build the object within ``start_timeout``.
        Exception: whatever the factory raised in the child (e.g. ``ConfigError``), re-raised here.

    Not thread-safe: the owning :class:`~agentfly_gym.resources.inprocess.InProcessResource` makes every
    call from its one worker thread.
    """

    def __init__(self, factory: str, kwargs: dict[str, Any], *, start_timeout: float = 120.0,
                 close_timeout: float = 30.0, name: str = "afg-child") -> None:
        self.close_timeout = close_timeout
        self.name = name
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", f"from agentfly_gym.resources.isolated import _child_main; "
                 f"_child_main({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        except OSError as e:
            ours.close()
            raise ResourceStartError(f"{name}: cannot start a child process: {e}") from e
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        try:
            self._conn.send((factory, dict(kwargs), os.getpid(), list(sys.path)))
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as e:
            self._stop()
            raise ResourceStartError(f"{name}: the kwargs of {factory} cannot be sent to a child process: {e}") from e
        deadline = time.monotonic() + start_timeout
        while not self._conn.poll(0.2):
            if not self.alive and not self._conn.poll(0):
                self._stop()
                raise ResourceStartError(f"{name}: the child process {self._proc.pid} exited (exit code "
                                         f"{self._proc.returncode}) while building {factory}")
            if time.monotonic() > deadline:
                self._stop()
                raise ResourceStartError(f"{name}: {factory} was not built within start_timeout={start_timeout}s")
        status, payload, tb = self._recv("the start")
        if status == "err":
            self._stop()
            raise self._rebuild(payload, tb)

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the child process is running."""
        return self._proc.poll() is None

    def _died(self, what: str) -> ResourceDied:
        try:
            self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        code = self._proc.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited (exit code {code})"
        return ResourceDied(f"{self.name}: the child process {self._proc.pid} {how} during {what}")

    def _recv(self, what: str) -> tuple[str, Any, str]:
        try:
            return self._conn.recv()
        except (EOFError, OSError) as e:
            raise self._died(what) from e

    @staticmethod
    def _rebuild(exc: BaseException, tb: str) -> BaseException:
        exc.__cause__ = _RemoteTraceback(tb)
        return exc

    def invoke(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None) -> Any:
        """Run ``fn(obj, *args, **kwargs)`` in the child and return its result (blocking).

        Raises:
            ResourceDied: the child has exited (before or during the call).
            Exception: what ``fn`` raised in the child.
        """
        what = getattr(fn, "__qualname__", repr(fn))
        if not self.alive:
            raise self._died(what)
        try:
            self._conn.send((fn, tuple(args), dict(kwargs or {})))
        except (OSError, ValueError) as e:
            raise self._died(what) from e
        status, payload, tb = self._recv(what)
        if status == "err":
            raise self._rebuild(payload, tb)
        return payload

    # the optional methods InProcessResource looks for, forwarded to the child's object
    def reset(self) -> None:
        self.invoke(_call_optional, ("reset",))

    def healthy(self) -> bool:
        return self.alive and bool(self.invoke(_call_optional, ("healthy", True)))

    def close(self) -> None:
        """Ask the child to close its object and exit; terminate it, then kill it, if it does not within
        ``close_timeout`` seconds."""
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._stop(self.close_timeout)

    def _stop(self, timeout: float = 0.0) -> None:
        for stop in (None, self._proc.terminate, self._proc.kill):
            if stop is not None:
                stop()
            try:
                self._proc.wait(timeout if stop is None else 5)
                break
            except subprocess.TimeoutExpired:
                continue
        self._conn.close()
