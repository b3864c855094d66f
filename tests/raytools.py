"""A tiny pooled object for the Ray manager tests, and a check of how many instances lived at once.

``Counted`` is an ``InProcessSpec`` factory: every instance writes a start line when it is built and a stop
line when it is closed (time in ns, pid) into ``events_dir``, so the tests count live instances from
outside the cluster.  It runs in Ray worker processes, which import it from this folder (the test puts
the folder on the ``PYTHONPATH`` of the cluster's nodes).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


class Counted:
    """An object whose state (a list) must be empty at the start of every lease (reset on reuse)."""

    def __init__(self, events_dir: str, delay: float = 0.0) -> None:
        if delay:
            time.sleep(delay)  # a slow constructor (a simulator's start), what the tests that pass it measure
        self.uid = uuid.uuid4().hex[:8]
        self.events = Path(events_dir) / f"{self.uid}.log"
        self._write("start")
        self.state: list[str] = []
        self.resets = 0

    def _write(self, what: str) -> None:
        with open(self.events, "a") as f:
            f.write(f"{what} {time.time_ns()} {os.getpid()}\n")

    def step(self, text: str) -> tuple[str, int, int]:
        """Append ``text``; returns (this instance's uid, the state's length, resets so far)."""
        self.state.append(text)
        return self.uid, len(self.state), self.resets

    def pid(self) -> int:
        return os.getpid()

    def reset(self) -> None:
        self.state.clear()
        self.resets += 1

    def close(self) -> None:
        self._write("stop")


class StuckReset(Counted):
    """A ``Counted`` whose first reset (of whichever instance claims the ``stuck`` marker in ``events_dir`` first)
    blocks for ``stuck_s`` seconds: a reset that hangs, for the tests of one stuck reset among several."""

    def __init__(self, events_dir: str, stuck_s: float = 15.0) -> None:
        super().__init__(events_dir)
        self.stuck_s = stuck_s

    def reset(self) -> None:
        try:
            os.close(os.open(self.events.parent / "stuck", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return super().reset()
        time.sleep(self.stuck_s)
        return super().reset()


def lifetimes(events_dir: str | Path) -> list[tuple[int, int | None]]:
    """(start ns, stop ns or None) of every instance that wrote to ``events_dir``."""
    out = []
    for p in Path(events_dir).glob("*.log"):
        start = stop = None
        for line in p.read_text().splitlines():
            what, t, _pid = line.split()
            if what == "start":
                start = int(t)
            elif what == "stop":
                stop = int(t)
        if start is not None:
            out.append((start, stop))
    return out


def max_alive(events_dir: str | Path) -> int:
    """The most instances alive at one moment (an instance without a stop line counts until now)."""
    points = []
    for start, stop in lifetimes(events_dir):
        points.append((start, 1))
        points.append((stop if stop is not None else time.time_ns(), -1))
    best = cur = 0
    for _t, d in sorted(points, key=lambda x: (x[0], x[1])):
        cur += d
        best = max(best, cur)
    return best


def pids(events_dir: str | Path) -> set[int]:
    """The processes that hosted an instance."""
    return {int(line.split()[2]) for p in Path(events_dir).glob("*.log") for line in p.read_text().splitlines()}


class FailingReset(Counted):
    """A ``Counted`` whose first reset (of whichever instance claims the ``failed`` marker in ``events_dir`` first)
    raises: the host's local pool replaces that instance in place."""

    def reset(self) -> None:
        try:
            os.close(os.open(self.events.parent / "failed", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return super().reset()
        raise RuntimeError("this reset fails")


class Holder:
    """A Ray actor that leases one instance of a spec with its own RayResourceManager and keeps it."""

    async def hold(self, spec) -> str:
        from agentfly_gym.resources.ray import RayResourceManager

        self.manager = RayResourceManager(placement={"*": {"resources": {"sim": 1}}})
        self.lease = await self.manager.pool(spec).acquire()
        return self.lease.instance_id


class Setting:
    """An in-process object that reports the manager kind its host process is set to (``AGENTFLY_GYM_MANAGER``)."""

    def kind(self) -> str:
        from agentfly_gym.resources.select import manager_kind

        return manager_kind()
