"""Process checks for the tests, read from /proc (Linux): which simulator, engine or server processes live."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterable


def _stat(pid: str) -> tuple[str, str, int] | None:
    """(comm, state, ppid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1: stat.rindex(")")]
    state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
    return comm, state, int(ppid)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    st = _stat(str(pid))
    return st is not None and st[1] != "Z"


def cpu_ticks(pid: int) -> int:
    """CPU time ``pid`` has used so far (user + system, in clock ticks: 1/100 s on Linux); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on: utime is field 14, stime 15
    return int(fields[11]) + int(fields[12])


TREE_MARKER = "AGENTFLY_TEST_TREE"
"""Environment variable that tags the processes a test starts (children inherit it, orphans keep it)."""


def mark_tree(monkeypatch) -> str:
    """Tag every process this test starts from now on: set :data:`TREE_MARKER` to a fresh value in
    this process's environment (undone by ``monkeypatch`` at the test's end) and return the value,
    for :func:`live_processes` ``(marker=...)`` and for the ``env`` of a subprocess the test starts."""
    value = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(TREE_MARKER, value)
    return value


def _marked(pid: str, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{TREE_MARKER}={marker}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in out}
        out |= frontier
    return out


def live_processes(names: Iterable[str], *, children_of: int | None = None, zombies: bool = False,
                   marker: str | None = None) -> set[int]:
    """Pids whose name or command line contains one of ``names``.

    Args:
        children_of: only direct children of this pid (e.g. ``os.getpid()``).
        zombies: include zombie processes.
        marker: only this test's processes: those that carry ``marker`` (see :func:`mark_tree`; a
            leaked process keeps it when its parent exits) or descend from this process.
    """
    names = tuple(names)
    found = set()
    stats = {pid: _stat(pid) for pid in os.listdir("/proc") if pid.isdigit()}
    mine = (_descendants(os.getpid(), {int(p): st[2] for p, st in stats.items() if st is not None})
            if marker is not None else set())
    for pid, st in stats.items():
        if st is None or (st[1] == "Z" and not zombies) or (children_of is not None and st[2] != children_of):
            continue
        if marker is not None and int(pid) not in mine and not _marked(pid, marker):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if any(n in st[0] or n in cmd for n in names):
            found.add(int(pid))
    return found


def wait_gone(pids: Iterable[int], timeout: float = 20.0) -> set[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; return those still alive."""
    left = {p for p in pids if alive(p)}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if alive(p)}
    return left


def default_sigint() -> None:
    """``preexec_fn`` for a child that the test interrupts with SIGINT: a test run started in the background
    (``make test &``) inherits SIGINT ignored, and Python then keeps ignoring it; the child gets the default
    disposition, as an interactive user's Ctrl-C would find, and SIGINT unblocked (a mask is inherited too)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def pids_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


async def procs_settle(marker: str, *, present: bool, timeout: float = 10.0) -> bool:
    """Wait up to ``timeout`` s until host processes with ``marker`` exist (``present``) or are gone; report which.

    Polling, not a fixed sleep: a loaded CI machine may take a while to start or reap a sandboxed command.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while bool(pids_with(marker)) != present and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return bool(pids_with(marker)) == present


def pids_with_env(name: str, value: str) -> dict[int, str]:
    """Pids (with their command lines) whose environment holds ``name=value``: a whole process tree whose root
    the test started with that variable, however its processes were re-parented (e.g. a Ray node's)."""
    needle = f"{name}={value}".encode()
    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                pass
    return found


def host_usage(path: str) -> tuple[int, int]:
    """``(bytes allocated, inodes)`` below ``path`` on the host, as ``du`` counts them (links not followed)."""
    import contextlib

    blocks = inodes = 0
    for dirpath, dirs, files in os.walk(path):
        for n in dirs + files:
            with contextlib.suppress(OSError):
                blocks += os.lstat(os.path.join(dirpath, n)).st_blocks
            inodes += 1
    return blocks * 512, inodes
