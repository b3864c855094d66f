"""Workarounds for the scienceworld package (1.2.x) and py4j (0.10.9.x), guarded by the versions they were
written for (:data:`TESTED`).

Everything :mod:`.simulator` does with the two packages' private names is here; nothing else of agentfly-gym
touches them.  With a version not in :data:`TESTED` (one warning per process, and
``tests/test_compat_versions.py`` fails naming it) the optional workarounds are off: JVMs start in this
process's group, calls are not pipelined (:func:`can_pipeline` is False: one py4j call per answer, the
public API), py4j frees Java objects from the garbage collector as it does by itself, and a closed client is
not marked disconnected.  What the simulator cannot run without (the package's gateway) is still read, so an
incompatible package fails at start with an error naming the attribute.

:func:`jvm_in_own_process_group`: the package starts its JVM with ``py4j.java_gateway.launch_gateway`` in the
caller's process group, so a terminal's Ctrl-C (SIGINT to the whole foreground group) kills every JVM at once,
and each rollout's py4j client then prints "Answer from Java side is empty" tracebacks while the run is being
stopped in order.  The package does not pass py4j's ``create_new_process_group`` (and that option runs
``os.setpgrp`` as a ``preexec_fn``, unsafe in a threaded process), so while the package launches a JVM, the
``Popen`` that ``launch_gateway`` calls gets ``process_group=0`` (Python 3.11+: set in the child without running
Python code there).  The JVM still dies with this process (py4j's ``die_on_exit``: its stdin closes), and the
rollout stops it itself on Ctrl-C.

:func:`defer_object_frees`: py4j tells the JVM about every Java object proxy the garbage collector frees, from
inside the collection, on whatever thread it interrupted: with a stopped (SIGSTOP) JVM that call never returns,
and on the event loop's thread it froze every rollout.  The client's ``garbage_collect_object`` then only queues
the id, and :func:`send_freed_objects` sends the queue from the simulator's own thread.

:func:`pipelined_call`: py4j's public API makes one network round trip per call and has no batch call; this
writes several calls' commands to one connection at once and reads the answers in order (see the function).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any
from ...utils.versions import untested_versions as _untested, verified as _verified

__all__ = ["TESTED", "can_pipeline", "defer_object_frees", "forget_package_env", "jvm_in_own_process_group",
           "mark_disconnected", "package_gateway", "pipelined_call", "send_freed_objects", "untested_versions"]

log = logging.getLogger(__name__)

#: The distributions whose private names this module uses, and the versions it was verified with.
TESTED: dict[str, tuple[str, ...]] = {"py4j": ("0.10.9.9",), "scienceworld": ("1.2.3",)}

_warned = threading.Event()


def untested_versions() -> dict[str, str]:
    """The installed distributions of :data:`TESTED` whose version was not verified:
    ``{name: installed version or "not installed"}``; empty when all are known."""
    return _untested(TESTED)


def _applies() -> bool:
    """True where the installed versions are the verified ones; else False (one warning per process)."""
    return _verified(TESTED, _warned, log,
                     "ScienceWorld: the py4j workarounds (own process group, pipelined calls, deferred object frees) "
                     "are off: verified with %s, installed %s")


def _noop() -> None:
    return None


# ------------------------------------------------------------------------------------ the package's env
def package_gateway(env: Any) -> Any:
    """The py4j ``JavaGateway`` of a ``scienceworld.ScienceWorldEnv`` (the package keeps it private, as
    ``_gateway``).

    Raises:
        AttributeError: the package has no such attribute (an incompatible version).
    """
    return env._gateway


def forget_package_env(env: Any) -> None:
    """After :class:`~.simulator.ScienceWorldSimulator` closed ``env``'s JVM itself: remove the package's
    object-tree temporary folder, and make the package's ``close()`` (which its ``__del__`` calls, with py4j
    calls, whenever the garbage collector gets to it, at an arbitrary point of another thread's work) a no-op
    on this instance.  Best effort."""
    with contextlib.suppress(Exception):
        env._obj_tree_tempdir.cleanup()
    disarm_package_env(env)


def disarm_package_env(env: Any) -> None:
    """Make the package's ``close()`` a no-op on ``env`` (a closed or half-made instance, whose ``__del__``
    would otherwise raise or call a dead JVM from inside a later garbage collection)."""
    env.close = _noop


@contextlib.contextmanager
def jvm_in_own_process_group() -> Iterator[None]:
    """While the block runs, JVMs launched by py4j start in a process group of their own (see the module
    docstring).  Not thread-safe by itself: hold the simulator's launch lock around it.  A no-op with
    untested versions or before Python 3.11."""
    if not _applies() or sys.version_info < (3, 11):
        yield
        return
    import py4j.java_gateway as gateway

    original = gateway.Popen
    if original is not subprocess.Popen:  # someone else patched it: leave it alone
        yield
        return
    gateway.Popen = functools.partial(subprocess.Popen, process_group=0)
    try:
        yield
    finally:
        gateway.Popen = original


# ------------------------------------------------------------------------------------ py4j's client
def defer_object_frees(gateway: Any, queue: Any) -> bool:
    """From now on the garbage collector's frees of ``gateway``'s Java object proxies only append the object
    id to ``queue`` (a ``collections.deque``); :func:`send_freed_objects` sends them.  Returns False (nothing
    changed) with untested versions."""
    if not _applies():
        return False
    gateway._gateway_client.garbage_collect_object = queue.append
    return True


def send_freed_objects(gateway: Any, queue: Any) -> None:
    """Tell the JVM which Java objects in ``queue`` Python no longer references (py4j's memory management),
    on the calling thread."""
    if not queue:
        return
    client = gateway._gateway_client
    send = type(client).garbage_collect_object  # the class's method: the instance's one only queues
    while queue:
        send(client, queue.popleft())


def mark_disconnected(gateway: Any) -> None:
    """Mark ``gateway``'s client disconnected, so that the finalizers of its Java object proxies stop trying to
    reach a dead JVM.  (Each failed attempt logs an error with a traceback, and formatting that traceback from
    inside a garbage collection that interrupted an ``ast.parse`` elsewhere trips CPython 3.11's "AST
    constructor recursion depth mismatch".)  Best effort; nothing with untested versions."""
    if not _applies():
        return
    with contextlib.suppress(Exception):
        gateway._gateway_client.is_connected = False


def can_pipeline(gateway: Any) -> bool:
    """Whether :func:`pipelined_call` can be used: a verified py4j, its client's connection methods, and
    ``TCP_QUICKACK`` (Linux), without which every pipelined answer waits for a delayed acknowledgement."""
    client = getattr(gateway, "_gateway_client", None)
    return _applies() and hasattr(socket, "TCP_QUICKACK") and all(
        hasattr(client, a) for a in ("_get_connection", "_give_back_connection", "converters"))


def pipelined_call(server: Any, calls: tuple[tuple[Any, ...], ...]) -> list[Any]:
    """Send ``calls`` (``(method, *args)``; ``method``: a name of ``server``'s or a py4j member of
    another object on the same gateway) to the JVM on one py4j connection in one write, then read
    the answers in order: one network round trip instead of one per call.

    The commands are the ones py4j's ``JavaMember.__call__`` sends (its protocol, built by the
    member's own ``_build_args``), and each answer goes through py4j's ``get_return_value``, so
    values and Java exceptions come back exactly as from separate calls.  py4j's Java side serves one
    connection's commands one after another on one thread, so each call sees exactly the state it would
    see when called alone.  A call whose arguments py4j would convert into temporary Java objects is not
    pipelined (ours are strings and ints).  Only where :func:`can_pipeline`.

    Raises:
        Py4JJavaError: a call raised in the JVM (the first such call; all answers are read first).
        Py4JNetworkError: the connection failed (it is closed, not reused).
    """
    from py4j import protocol as proto

    client = server._gateway_client
    members, payload = [], []
    for name, *args in calls:
        member = getattr(server, name) if isinstance(name, str) else name
        args_command, temp_args = member._build_args(*args)
        if temp_args:  # converted collections: let py4j manage their lifetime
            for t in temp_args:
                if hasattr(t, "_detach"):
                    t._detach()
            return [(getattr(server, n) if isinstance(n, str) else n)(*a) for n, *a in calls]
        members.append(member)
        payload.append(proto.CALL_COMMAND_NAME + member.command_header + args_command + proto.END_COMMAND_PART)
    connection = client._get_connection()
    answers = []
    try:
        connection.socket.sendall("".join(payload).encode("utf-8"))
        for _ in members:
            _quickack(connection.socket)
            answer = proto.smart_decode(connection.stream.readline()[:-1])
            if answer.startswith(proto.RETURN_MESSAGE):
                answer = answer[1:]
            if not answer.strip():
                raise proto.Py4JNetworkError("Answer from Java side is empty", when=proto.EMPTY_RESPONSE)
            answers.append(answer)
    except Exception as e:
        connection.close(True)
        if isinstance(e, proto.Py4JNetworkError):
            raise
        raise proto.Py4JNetworkError("Error while sending or receiving", e, proto.ERROR_ON_RECEIVE) from e
    if any(proto.is_fatal_error(a) for a in answers):
        connection.close(False)
    else:
        client._give_back_connection(connection)
    return [proto.get_return_value(a, client, m.target_id, m.name) for a, m in zip(answers, members)]


def _quickack(sock: Any) -> None:
    """Have this socket acknowledge what it receives at once (Linux ``TCP_QUICKACK``; the kernel
    drops back to delayed acknowledgements by itself, hence one call per answer read).

    py4j's Java side writes each answer as its own small segment with Nagle's algorithm on, so
    it holds the second answer until the first is acknowledged; with delayed acknowledgements
    that costs ~40 ms per pipelined call (measured: 48-52 ms for a folded step of 2 ms).
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
