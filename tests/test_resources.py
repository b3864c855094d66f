"""The resource system's semantics: specs, pools, scopes, the manager.

The pool tests use ``Box``, a small real Resource (an in-memory object with a lifecycle
log) plugged in through ``ResourceManager(backend_factory=...)``; the in-process tests
use the real InProcessResource backend with a factory from this module.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from agentfly_gym.errors import (ConfigError, EventLoopMismatch, PoolClosedError, ResourceError, ResourceStartError,
                                 ResourceTimeout)
from agentfly_gym.resources import (ContainerSpec, InProcessResource, InProcessSpec, ModelAPISpec, ModelServiceSpec,
                                    Resource, ResourceManager, ResourceStatus)

LOG: list[tuple[str, str]] = []


class Box(Resource):
    """An in-memory resource recording its lifecycle; ``state`` is what a rollout writes."""

    start_delay = 0.0
    fail_start = False
    starting: asyncio.Event | None = None  # set when a start begins (a test that cancels a start waits for it)

    def __init__(self, spec):
        super().__init__(spec)
        self.state: dict = {}
        self.resets = 0
        self.released = False
        self.healthy = True

    async def start(self):
        if Box.starting is not None:
            Box.starting.set()
        await asyncio.sleep(self.start_delay)  # a slow start: the thing some tests cancel
        if self.fail_start:
            raise RuntimeError("boom")
        self._status = ResourceStatus.READY
        LOG.append(("start", self.id))

    async def reset(self):
        self.resets += 1
        self.state.clear()
        LOG.append(("reset", self.id))

    async def status(self):
        return ResourceStatus.READY if self.healthy and not self.released else ResourceStatus.UNHEALTHY

    async def adestroy(self):
        self.released = True
        LOG.append(("release", self.id))


def spec(**kw):
    kw.setdefault("max_instances", 2)
    return InProcessSpec(factory="test_resources:Counter", **kw)


def box_manager(**kw) -> ResourceManager:
    return ResourceManager(backend_factory=lambda s, m: Box(s), **kw)


# ----------------------------------------------------------------------------- specs
def test_spec_equality_hash_and_key():
    a = InProcessSpec(factory="m:f", kwargs={"x": 1, "y": [1, 2]}, max_instances=3)
    b = InProcessSpec(factory="m:f", kwargs={"y": [1, 2], "x": 1}, max_instances=3)
    c = InProcessSpec(factory="m:f", kwargs={"x": 2}, max_instances=3)
    assert a == b
    assert hash(a) == hash(b)
    assert a.key == b.key
    assert a.key != c.key
    assert a.key.startswith("inprocess:")
    assert a.factory_kwargs == {"x": 1, "y": (1, 2)}
    assert {a, b, c} == {a, c}
    assert ContainerSpec(image="x", memory="512m").memory == 512 * 1024**2
    assert ContainerSpec(image="x").key != ContainerSpec(image="y").key
    assert InProcessSpec(factory="m:f", name="a").key == InProcessSpec(factory="m:f", name="b").key


@pytest.mark.parametrize("make, words", [
    (lambda: InProcessSpec(factory="m:f", max_instances=0), "max_instances"),
    (lambda: InProcessSpec(factory="m:f", max_instances=2, min_idle=3), "min_idle"),
    (lambda: InProcessSpec(factory="not a path"), "factory"),
    (lambda: ContainerSpec(image=""), "image"),
    (lambda: ContainerSpec(image="x", memory="lots"), "memory"),
    (lambda: ContainerSpec(image="x", backend="podman"), "backend"),
    (lambda: ContainerSpec(image="x", cpus=0), "cpus"),
    (lambda: ModelServiceSpec(engine="tgi", model="m"), "engine"),
    (lambda: ModelServiceSpec(engine="vllm", model="m", gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (lambda: ModelAPISpec(base_url="localhost:8000", model="m"), "base_url"),
    (lambda: ModelAPISpec(base_url="http://x", model="m", api_key_env="not valid"), "api_key_env"),
    (lambda: InProcessSpec(factory="m:f", max_uses=0), "max_uses"),
])
def test_spec_validation_names_the_field(make, words):
    with pytest.raises(ConfigError, match=words) as info:
        make()
    assert info.value.field == words


# ----------------------------------------------------------------------------- scopes
async def test_same_scope_same_spec_same_instance_and_distinct_specs():
    async with box_manager() as m:
        s1, s2 = spec(), spec(kwargs={"other": 1})
        async with m.scope("r1") as scope:
            a = await scope.acquire(s1)
            assert await scope.acquire(s1) is a
            b = await scope.acquire(s2)
            assert b is not a
            assert b.spec == s2
            async with m.scope("r2") as other:
                assert await other.acquire(s1) is not a
        assert m.pool(s1).metrics.in_use == 0
        assert m.pool(s2).metrics.in_use == 0


async def test_concurrent_acquire_in_one_scope_shares_one_instance():
    async with box_manager() as m:
        async with m.scope("r") as scope:
            got = await asyncio.gather(*(scope.acquire(spec()) for _ in range(5)))
        assert len({id(r) for r in got}) == 1
        assert m.pool(spec()).metrics.started == 1


async def test_scope_releases_on_error_and_cancellation():
    async with box_manager() as m:
        s = spec(max_instances=1)
        with pytest.raises(RuntimeError):
            async with m.scope("err") as scope:
                await scope.acquire(s)
                raise RuntimeError("tool failed")
        assert m.pool(s).metrics.in_use == 0

        holding = asyncio.Event()

        async def rollout():
            async with m.scope("cancelled") as scope:
                await scope.acquire(s)
                holding.set()
                await asyncio.sleep(3600)  # holds the lease until the test cancels the rollout

        t = asyncio.create_task(rollout())
        await holding.wait()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert m.pool(s).metrics.in_use == 0
        async with m.scope("next") as scope:  # the single instance is free again
            await asyncio.wait_for(scope.acquire(s), 1)


async def test_scope_cannot_be_used_after_exit():
    async with box_manager() as m:
        async with m.scope("r") as scope:
            pass
        with pytest.raises(ResourceError, match="ended"):
            await scope.acquire(spec())


# ----------------------------------------------------------------------------- pool semantics
async def test_reused_instance_is_always_reset_before_handout():
    async with box_manager() as m:
        s = spec(max_instances=1)
        async with m.scope("a") as scope:
            r = await scope.acquire(s)
            r.state["secret"] = "previous rollout's reward"
        async with m.scope("b") as scope:
            r2 = await scope.acquire(s)
        assert r2 is r
        assert r.resets == 1
        assert r.state == {}
        met = m.pool(s).metrics
        assert (met.started, met.reused, met.resets) == (1, 1, 1)


async def test_capacity_holds_and_waiters_are_served_fifo():
    async with box_manager() as m:
        s = spec(max_instances=2)
        pool = m.pool(s)
        a, b = await pool.acquire(), await pool.acquire()
        order = []

        async def waiter(i):
            r = await pool.acquire()
            order.append(i)
            return r

        tasks = [asyncio.create_task(waiter(i)) for i in range(4)]
        await _until(lambda: pool.metrics.waiting == 4)
        assert pool.size == 2
        await pool.release(a)
        await pool.release(b)
        r0, r1 = await tasks[0], await tasks[1]
        await pool.release(r0)
        await pool.release(r1)
        for t in tasks[2:]:
            await pool.release(await t)
        assert order == [0, 1, 2, 3]
        assert pool.metrics.started == 2
        assert pool.metrics.max_in_use == 2


async def test_acquire_timeout_raises_clear_error_and_leaks_nothing():
    async with box_manager() as m:
        pool = m.pool(spec(max_instances=1))
        held = await pool.acquire()
        with pytest.raises(ResourceTimeout, match="capacity 1") as info:
            await pool.acquire(timeout=0.05)
        assert info.value.spec == pool.spec  # the field names the saturated pool's spec
        assert pool.metrics.waiting == 0
        assert pool.metrics.timeouts == 1
        await pool.release(held)
        r = await asyncio.wait_for(pool.acquire(), 1)
        assert r is held


async def test_cancelled_waiter_never_strands_an_instance():
    async with box_manager() as m:
        pool = m.pool(spec(max_instances=1))
        held = await pool.acquire()
        w1 = asyncio.ensure_future(pool.acquire())
        w2 = asyncio.ensure_future(pool.acquire())
        await _until(lambda: pool.metrics.waiting == 2)
        # release hands the instance to w1, and w1 is cancelled before it runs: it must pass it on
        await pool.release(held)
        w1.cancel()
        got = await asyncio.wait_for(w2, 1)
        assert got is held
        with pytest.raises(asyncio.CancelledError):
            await w1
        await pool.release(got)
        assert pool.size == 1
        assert pool.metrics.in_use == 0


async def test_cancel_during_start_frees_the_slot():
    Box.start_delay = 0.5
    Box.starting = asyncio.Event()
    try:
        async with box_manager() as m:
            pool = m.pool(spec(max_instances=1))
            t = asyncio.ensure_future(pool.acquire())
            await asyncio.wait_for(Box.starting.wait(), 10)  # the start runs: cancel it midway
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert pool.size == 0
            Box.start_delay = 0.0
            r = await asyncio.wait_for(pool.acquire(), 1)
            await pool.release(r)
    finally:
        Box.start_delay = 0.0
        Box.starting = None


async def test_unhealthy_instance_is_replaced():
    async with box_manager() as m:
        s = spec(max_instances=1)
        async with m.scope("a") as scope:
            r = await scope.acquire(s)
            r.healthy = False  # e.g. its container was killed
        async with m.scope("b") as scope:
            r2 = await scope.acquire(s)
        assert r2 is not r
        assert r.released
        assert m.pool(s).metrics.replaced == 1
        assert m.pool(s).metrics.started == 2


async def test_failed_start_raises_and_frees_the_slot():
    Box.fail_start = True
    try:
        async with box_manager() as m:
            pool = m.pool(spec(max_instances=1))
            with pytest.raises(ResourceStartError, match="boom"):
                await pool.acquire()
            assert pool.size == 0
            assert pool.metrics.start_failures == 1
            Box.fail_start = False
            await pool.release(await pool.acquire())
    finally:
        Box.fail_start = False


async def test_discard_stops_instance_and_frees_capacity():
    async with box_manager() as m:
        s = spec(max_instances=1)
        async with m.scope("a") as scope:
            r = await scope.acquire(s)
            await scope.discard(r)
            r2 = await scope.acquire(s)
        assert r2 is not r
        await _until(lambda: r.released)  # stopped in the background


async def test_min_idle_prewarms_and_tops_up():
    async with box_manager() as m:
        s = spec(max_instances=3, min_idle=2)
        await m.prewarm(s)
        pool = m.pool(s)
        assert pool.metrics.idle == 2
        assert pool.metrics.started == 2
        r = await pool.acquire()
        assert pool.metrics.started == 2
        assert pool.metrics.idle == 1
        await _until(lambda: pool.metrics.idle == 2)  # topped up in the background after the acquisition
        assert pool.metrics.started == 3
        await pool.release(r)
        assert pool.size == 3


async def _until(cond, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


async def test_idle_instances_expire_on_a_timer_and_are_reused_warm_before():
    """``max_idle_time`` releases an instance that nobody acquires again on a timer of the loop (asyncpg's
    ``max_inactive_connection_lifetime``), not at the next acquisition; acquired again in time, the same
    instance serves (reset), and ``min_idle`` instances stay."""
    async with box_manager() as m:
        s = spec(max_idle_time=0.3)
        pool = m.pool(s)
        r = await pool.acquire()
        await pool.release(r)
        r2 = await pool.acquire()
        assert r2 is r
        assert r.resets == 1
        assert not r.released
        await pool.release(r)
        await _until(lambda: r.released)                       # no acquisition needed
        assert pool.size == 0
        assert pool.metrics.idle == 0
        assert pool.metrics.recycled == 1

        s = spec(max_idle_time=0.2, min_idle=1, max_instances=2)
        pool = m.pool(s)
        a, b = await pool.acquire(), await pool.acquire()
        await pool.release(a)
        await pool.release(b)
        await _until(lambda: a.released or b.released)
        await asyncio.sleep(0.5)                                # the timer does not go below min_idle: time passes
        #                                                         (2.5 idle times) and nothing more happens
        assert pool.metrics.idle == 1
        assert pool.size == 1
        assert [a.released, b.released].count(True) == 1
    assert ContainerSpec(image="x").max_idle_time == 300.0     # containers expire by default


async def test_a_global_is_stopped_once_its_last_user_left_for_max_idle_time():
    """``acquire_global(spec, user=...)`` + ``leave_global``: the shared instance outlives its last user by
    ``spec.max_idle_time`` seconds (a new user in between keeps it), then stops; without users it stays."""
    async with box_manager() as m:
        s = spec(max_idle_time=0.3)
        u1, u2 = Box(s), Box(s)                                 # any weakly referenceable object is a user
        g = await m.acquire_global(s, user=u1)
        m.leave_global(s, u1)
        assert await m.acquire_global(s, user=u2) is g         # taken up again in time: the same instance
        await asyncio.sleep(0.5)                                # a user holds it: past the idle time, nothing happens
        assert not g.released
        m.leave_global(s, u2)
        await _until(lambda: g.released)
        g2 = await m.acquire_global(s)                         # a new one, kept (no user to leave)
        assert g2 is not g
        assert m.pool(s).metrics.recycled == 1
        await asyncio.sleep(0.5)                                # no user ever left: past the idle time, it stays
        assert not g2.released


async def test_max_uses_recycles_an_instance():
    async with box_manager() as m:
        s = spec(max_instances=1, max_uses=2)
        pool = m.pool(s)
        first = await pool.acquire()
        await pool.release(first)
        assert await pool.acquire() is first
        await pool.release(first)  # second use: retired
        await _until(lambda: first.released)
        fresh = await pool.acquire()
        assert fresh is not first
        assert pool.metrics.recycled == 1
        assert pool.metrics.started == 2
        await pool.release(fresh)


async def test_global_scope_shares_one_instance_until_close():
    m = box_manager()
    s = spec(max_instances=1)
    g = await asyncio.gather(*(m.acquire_global(s) for _ in range(4)))
    assert len({id(x) for x in g}) == 1
    await m.aclose()
    assert g[0].released
    with pytest.raises(PoolClosedError):
        m.scope("x")


async def test_manager_close_releases_in_use_and_idle_and_fails_waiters():
    m = box_manager()
    s = spec(max_instances=1)
    pool = m.pool(s)
    held = await pool.acquire()
    waiter = asyncio.ensure_future(pool.acquire())
    await _until(lambda: pool.metrics.waiting == 1)
    await m.aclose()
    with pytest.raises(PoolClosedError):
        await waiter
    assert held.released


async def test_pool_close_wakes_on_the_last_release_not_on_a_timer():
    """``close()`` waits for the in-use instances and ends with the release of the last one: a few turns of the
    loop after it, not on the next tick of a polling timer (it used to poll every 50 ms)."""
    m = box_manager()
    pool = m.pool(spec(max_instances=2))
    a, b = await pool.acquire(), await pool.acquire()
    closing = asyncio.ensure_future(pool.aclose())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not closing.done()
    assert not a.released
    await pool.release(a)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not closing.done()  # b is still in use
    await pool.release(b)
    for _ in range(5):  # wake-up, terminate(), the release tasks: no timer in between
        await asyncio.sleep(0)
    assert closing.done()
    assert closing.exception() is None
    assert a.released
    assert b.released
    assert pool.closed
    await m.aclose()


async def test_pool_close_timeout_releases_what_is_still_in_use():
    """``close(timeout=...)``: a holder that never gives back does not keep the pool open past the timeout."""
    m = box_manager()
    pool = m.pool(spec(max_instances=1))
    held = await pool.acquire()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await pool.aclose(timeout=0.2)
    assert 0.15 <= loop.time() - t0 < 2.0
    assert held.released
    assert pool.closed
    with pytest.raises(PoolClosedError):
        await pool.acquire()
    await m.aclose()


async def test_metrics_report_waits_and_counts():
    async with box_manager() as m:
        s = spec(max_instances=1)
        pool = m.pool(s)
        r = await pool.acquire()

        async def later():
            await asyncio.sleep(0.1)  # the hold time the metrics must report
            await pool.release(r)

        asyncio.create_task(later())
        r2 = await pool.acquire()
        await pool.release(r2)
        snap = m.metrics()[s.key]
        assert snap["acquired"] == 2
        assert snap["acquire_wait_max"] >= 0.08
        assert snap["acquire_wait_mean"] > 0
        assert snap["started"] == 1
        assert snap["reused"] == 1


async def test_many_tasks_racing_on_a_small_pool():
    """50 rollouts with random hold times and random cancellations on a pool of 3."""
    rng = random.Random(7)
    async with box_manager() as m:
        s = spec(max_instances=3)
        pool = m.pool(s)
        live = 0
        peak = 0

        async def rollout(i):
            nonlocal live, peak
            async with m.scope(f"r{i}") as scope:
                r = await scope.acquire(s)
                assert not r.state, "state leaked from a previous rollout"
                r.state["owner"] = i
                live += 1
                peak = max(peak, live)
                try:
                    await asyncio.sleep(rng.random() * 0.01)  # a random hold time (the race under test)
                    assert r.state["owner"] == i
                finally:
                    live -= 1

        tasks = [asyncio.create_task(rollout(i)) for i in range(50)]
        for t in rng.sample(tasks, 10):
            asyncio.get_running_loop().call_later(rng.random() * 0.05, t.cancel)
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in res)
        assert peak <= 3
        assert pool.size <= 3
        assert pool.metrics.in_use == 0
        assert pool.metrics.waiting == 0
        async with m.scope("final") as scope:  # nothing stranded: all 3 can still be had
            for k in range(3):
                await asyncio.wait_for(scope.acquire(spec(max_instances=3, kwargs={"k": k})), 1)


async def test_pool_rejects_use_from_another_event_loop():
    m = box_manager()
    pool = m.pool(spec())
    await pool.release(await pool.acquire())

    def other_loop():
        async def go():
            with pytest.raises(EventLoopMismatch, match="another event loop"):
                await pool.acquire()
        asyncio.run(go())

    th = threading.Thread(target=other_loop)
    th.start()
    th.join()
    await m.aclose()


# ----------------------------------------------------------------------------- in-process backend
class Counter:
    """A blocking, non-thread-safe object: records which thread calls it."""

    instances: list[Counter] = []

    def __init__(self, start: int = 0, other: int = 0, k: int = 0):
        self.n = start
        self.threads: set[str] = {threading.current_thread().name}
        self.closed = False
        Counter.instances.append(self)

    def incr(self, by: int = 1) -> int:
        self.threads.add(threading.current_thread().name)
        self.n += by
        return self.n

    def reset(self):
        self.n = 0

    def healthy(self):
        return not self.closed

    def close(self):
        self.closed = True


class Exploding:
    def __init__(self):
        raise ValueError("no engine here")


async def test_inprocess_resource_lifecycle_and_thread_affinity():
    async with ResourceManager() as m:
        s = InProcessSpec(factory="test_resources:Counter", kwargs={"start": 5}, max_instances=1)
        async with m.scope("a") as scope:
            r = await scope.acquire(s)
            assert isinstance(r, InProcessResource)
            assert await r.call("incr") == 6
            assert await r.run(r.obj.incr, 2) == 8
            obj = r.obj
            assert len(obj.threads) == 1
            assert threading.current_thread().name not in obj.threads
        async with m.scope("b") as scope:
            r2 = await scope.acquire(s)
            assert r2 is r
            assert r.obj.n == 0
    assert obj.closed


async def test_inprocess_bad_factory_errors():
    async with ResourceManager() as m:
        with pytest.raises(ConfigError, match="cannot import"):
            await m.pool(InProcessSpec(factory="no_such_module_xyz:Thing")).acquire()
        with pytest.raises(ConfigError, match="no attribute"):
            await m.pool(InProcessSpec(factory="test_resources:Nope")).acquire()
        with pytest.raises(ResourceStartError, match="no engine here"):
            await m.pool(InProcessSpec(factory="test_resources:Exploding")).acquire()
        for p in m.pools.values():
            assert p.size == 0


async def test_inprocess_unhealthy_object_is_replaced():
    async with ResourceManager() as m:
        s = InProcessSpec(factory="test_resources:Counter", kwargs={"k": 99}, max_instances=1)
        async with m.scope("a") as scope:
            r = await scope.acquire(s)
            r.obj.closed = True  # the object reports itself unhealthy
        async with m.scope("b") as scope:
            r2 = await scope.acquire(s)
        assert r2 is not r
        assert m.pool(s).metrics.replaced == 1
