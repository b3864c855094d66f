"""``InProcessSpec(isolation="process")`` and the typed proxies: a real child interpreter per instance.

The object here is a small tally defined in this module (the child imports it by its factory path, as
it imports a simulator); the WebShop server in its own process is tested in ``test_webshop.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from agentfly_gym.errors import ConfigError, ResourceDied
from agentfly_gym.resources.inprocess import InProcessResource, ObjectProxy, forward
from agentfly_gym.resources.manager import ResourceManager
from agentfly_gym.resources.spec import InProcessSpec
from proctools import alive, wait_gone
from waiting import until

pytestmark = pytest.mark.timeout(120)


class Unpicklable(Exception):
    def __init__(self, what: str, handle: object) -> None:
        super().__init__(what)
        self.handle = handle


class Tally:
    """A counter that reports the process it lives in."""

    def __init__(self, start: int = 0, fail: bool = False) -> None:
        if fail:
            raise ConfigError(f"fail={fail!r}: this tally refuses to start")
        self.n = start
        self.closed_marker: str | None = None

    def add(self, k: int = 1) -> int:
        self.n += k
        return self.n

    def where(self) -> int:
        return os.getpid()

    def divide(self, by: int) -> float:
        return self.n / by

    def explode_unpicklably(self) -> None:
        raise Unpicklable("a lock cannot be pickled", __import__("threading").Lock())

    def reset(self) -> None:
        self.n = 0


class TallyProxy(ObjectProxy):
    add = forward(Tally.add)
    where = forward(Tally.where)
    divide = forward(Tally.divide)
    explode_unpicklably = forward(Tally.explode_unpicklably)


def _spec(**kw) -> InProcessSpec:
    return InProcessSpec(factory="test_isolation:Tally", isolation="process", max_instances=1,
                         start_timeout=60.0, **kw)


def test_isolation_is_validated_and_a_forward_typo_fails_at_definition():
    with pytest.raises(ConfigError, match="isolation='fork'"):
        InProcessSpec(factory="test_isolation:Tally", isolation="fork")
    with pytest.raises(AttributeError, match="ad"):
        class Typo(ObjectProxy):  # noqa: F841 - the class body is what fails
            add = forward(Tally.ad)  # type: ignore[attr-defined]
    assert not hasattr(TallyProxy, "ad")


async def test_same_proxy_in_a_thread_and_in_a_child_process():
    async with ResourceManager() as m:
        async with m.scope("t") as scope:
            thread = TallyProxy(await scope.acquire(InProcessSpec(factory="test_isolation:Tally", kwargs={"start": 1})))
            child = TallyProxy(await scope.acquire(_spec(kwargs={"start": 1})))
            assert await thread.add(2) == await child.add(2) == 3
            assert await thread.where() == os.getpid()
            pid = await child.where()
            assert pid != os.getpid()
            assert pid == child.resource.child_pid
            assert thread.resource.child_pid is None
            assert await child.resource.call("add", k=4) == 7  # the untyped call still reaches the child


async def test_errors_cross_as_clear_exceptions():
    async with ResourceManager() as m:
        async with m.scope("e") as scope:
            p = TallyProxy(await scope.acquire(_spec()))
            with pytest.raises(ZeroDivisionError) as ei:
                await p.divide(0)
            assert "in divide" in str(ei.value.__cause__)  # the child's traceback
            with pytest.raises(RuntimeError, match="Unpicklable: a lock cannot be pickled"):
                await p.explode_unpicklably()
            assert await p.add() == 1  # the child survives its object's errors
        with pytest.raises(ConfigError, match="fail=True: this tally refuses to start"):
            await m.pool(_spec(kwargs={"fail": True})).acquire()
        with pytest.raises(ConfigError, match="cannot import module"):  # as in a thread
            await m.pool(InProcessSpec(factory="no_such_module_xyz:Thing", isolation="process")).acquire()


async def test_a_killed_child_is_a_handled_death_and_the_pool_replaces_it():
    async with ResourceManager() as m:
        spec = _spec()
        async with m.scope("k") as scope:
            r = await scope.acquire(spec)
            assert isinstance(r, InProcessResource)
            p = TallyProxy(r)
            await p.add(5)
            pid = r.child_pid
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(ResourceDied, match=f"process {pid} was killed by signal 9 during Tally.add"):
                await p.add()
        async with m.scope("k2") as scope:  # the health check on reuse finds it dead
            p2 = TallyProxy(await scope.acquire(spec))
            assert p2.resource is not r
            assert await p2.add() == 1
            assert p2.resource.child_pid != pid
            pid2 = p2.resource.child_pid
        assert m.metrics()[spec.key]["replaced"] == 1
    assert not wait_gone([pid2], 10)  # closing the manager stopped the child


def test_children_die_with_a_sigkilled_parent(tmp_path):
    """SIGKILL leaves the parent no chance to clean up: the child goes by itself (PDEATHSIG / watcher)."""
    script = textwrap.dedent("""
        import asyncio, sys, time
        from agentfly_gym.resources.manager import ResourceManager
        from agentfly_gym.resources.spec import InProcessSpec

        async def main():
            m = ResourceManager()
            a = await m.acquire_global(InProcessSpec(factory="collections:Counter", isolation="process"))
            b = await m.acquire_global(InProcessSpec(factory="fractions:Fraction", kwargs={"numerator": 3},
                                                     isolation="process"))
            print(a.child_pid, b.child_pid, flush=True)
            time.sleep(600)  # alive until the test SIGKILLs it

        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        children = [int(x) for x in parent.stdout.readline().split()]
        assert len(children) == 2
        assert all(alive(c) for c in children)
    finally:
        parent.kill()
        parent.wait()
    assert not wait_gone(children, 20), "a child outlived its SIGKILLed parent"


async def test_released_while_starting_leaves_no_child():
    async with ResourceManager() as m:
        pool = m.pool(_spec())
        task = asyncio.ensure_future(pool.acquire())
        await until(_children, 30, "the child interpreter to start")  # cancelled while it starts
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not [p for p in _children() if alive(p)]


def _children() -> list[int]:
    from proctools import live_processes

    return sorted(live_processes(["agentfly_gym.resources.isolated"], children_of=os.getpid()))
