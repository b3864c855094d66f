"""Faults injected into real rollouts: nothing leaks, nothing hangs, no fault ends more than its episode.

Each case drives the real thing: Stockfish engines, a ScienceWorld JVM, the ALFWorld planner's child
process, the ``agentfly-gym`` command.  Cases whose failure mode is a hang run in a child Python with a
time limit, so a regression fails the test instead of hanging the suite.  The longer campaign (many
rollouts, every env, hypothesis-generated actions) is ``benchmarks/bench_faults.py``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium
import pytest
from proctools import alive, live_processes, wait_gone
from waiting import threads_running, until

import agentfly_gym  # noqa: F401  (registers the envs)
from agentfly_gym.resources import ResourceManager

pytestmark = pytest.mark.timeout(300)


def _run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child Python did not exit within {timeout}s (a hang): {(e.stderr or b'')[-2000:]!r}")


ABANDONED_STARTS = """
    import asyncio, os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from proctools import live_processes
    import gymnasium, agentfly_gym
    from agentfly_gym.errors import ResourceTimeout
    from agentfly_gym.resources import ResourceManager

    seen, peak, stop = set(), [0], threading.Event()

    def watch():  # every Stockfish child of this process, and the most alive at once
        while not stop.is_set():
            now = live_processes(["stockfish"], children_of=os.getpid())
            seen.update(now)
            peak[0] = max(peak[0], len(now))
            time.sleep(0.002)

    async def main():
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        m = ResourceManager()
        env = gymnasium.make("agentfly/Chess-v0", mode="play", reset_timeout=0.005, max_instances=1, manager=m).unwrapped
        timeouts = 0
        for i in range(5):
            try:
                await env.areset(seed=i)
            except ResourceTimeout:
                timeouts += 1
            await asyncio.sleep(0.2)  # the cut-short start goes on in the background: the cap must hold across it
        await env.aclose()
        await m.aclose()
        stop.set()
        watcher.join(10)
        left = live_processes(["stockfish"], children_of=os.getpid())
        print(timeouts, peak[0], " ".join(map(str, sorted(seen))), "|", " ".join(map(str, sorted(left))))

    asyncio.run(main())
"""


@pytest.mark.slow
def test_cut_short_engine_starts_are_closed_counted_and_do_not_block_exit():
    """Chess play mode, reset_timeout=0.005, max_instances=1: each reset is cut short while Stockfish starts."""
    r = _run_child(ABANDONED_STARTS, os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr[-3000:]
    head, _, left = r.stdout.strip().rpartition("|")
    timeouts, peak, *seen = head.split()
    assert int(timeouts) == 5
    assert int(peak) <= 1, f"{peak} engines alive at once with max_instances=1"
    assert left.strip() == "", f"engines {left} alive after the manager closed"
    assert not wait_gone([int(p) for p in seen], 10)


NO_CLOSE = """
    import asyncio, sys
    import gymnasium, agentfly_gym

    async def main(how):
        env = gymnasium.make("agentfly/Chess-v0", mode="play", engine_depth=1).unwrapped  # the default manager
        await env.areset(seed=0)
        await env.astep("e2e4")
        print(*[r.obj.pid for r in env.scope.resources.values()], flush=True)
        if how == "error":
            raise RuntimeError("the user's script crashed")

    asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("how", ["return", "error"])
def test_async_script_that_never_closes_exits(how):
    r = _run_child(NO_CLOSE, how, timeout=90)
    assert r.returncode == (0 if how == "return" else 1), r.stderr[-3000:]
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 1
    assert not wait_gone(pids, 10), "the engine outlived its Python"


@pytest.mark.slow
def test_sigterm_to_rollout_while_an_engine_starts(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentfly_gym", "rollout", "--env", "Chess-v0", "--policy", "random", "-n", "200",
         "--concurrency", "4", "--no-progress", "--output-dir", str(tmp_path), "--env-kwargs",
         '{"Chess-v0": {"mode": "play", "max_instances": 1, "reset_timeout": 0.005}}'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    seen: set[int] = set()
    deadline = time.monotonic() + 180
    while not seen and proc.poll() is None and time.monotonic() < deadline:
        seen |= live_processes(["stockfish"], children_of=proc.pid)
        time.sleep(0.002)
    assert seen, f"no engine was started: {proc.stdout.read()[-2000:] if proc.poll() is not None else ''}"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("agentfly-gym rollout hung after SIGTERM while an engine was starting")
    assert proc.returncode in (143, -signal.SIGTERM), proc.stdout.read()[-2000:]
    assert not wait_gone(seen, 10)


@pytest.mark.slow
async def test_stopped_jvm_does_not_block_the_event_loop():
    """A SIGSTOPped JVM: a garbage collection on the loop's thread frees a Java proxy, then a step times out."""
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/ScienceWorld-v0", manager=m, max_instances=1, step_timeout=5).unwrapped
        await env.areset(options={"task_id": "boil:0"})
        sim = env.scope.resources[env.resource_spec.key]
        proxy = await sim.run(lambda: sim.obj._server.getPossibleActions())  # a py4j JavaList proxy
        pid = sim.obj.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            del proxy
            gc.collect()  # py4j's finalizer used to call the stopped JVM from here, forever
            assert time.monotonic() - t0 < 60  # "forever" before (a loaded machine's collection takes seconds)
            obs, reward, terminated, truncated, info = await env.astep("look around")
            assert truncated
            assert "step_timeout" in info["error"]
        finally:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
    assert not wait_gone([pid], 30)


@pytest.mark.slow
async def test_simulator_killed_during_load_is_retried_on_a_fresh_one():
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/ScienceWorld-v0", manager=m, max_instances=2).unwrapped
        reset = asyncio.ensure_future(env.areset(options={"task_id": "boil:0"}))
        key = env.resource_spec.key
        while True:  # the JVM is up and the reset is about to load the task on it
            r = env._scope.resources.get(key) if env._scope is not None else None
            if (r is not None and r.obj is not None) or reset.done():
                break
            await asyncio.sleep(0.002)
        assert not reset.done()
        pid = r.obj.pid
        os.kill(pid, signal.SIGSTOP)  # hold the load ...
        # the reset's thread calls the stopped JVM (the task's variations, then the load): it waits for an answer
        await until(lambda: threads_running(os.path.join("scienceworld", "simulator.py")), 30,
                    "the reset to call the stopped JVM")
        os.kill(pid, signal.SIGKILL)  # ... and kill the JVM under it
        obs, info = await reset
        fresh = env.scope.resources[key]
        assert fresh is not r
        assert fresh.obj.pid != pid
        assert info["task_id"] == "boil:0"
        assert "boil" in obs
        assert m.pool(env.resource_spec).metrics.replaced >= 1
        await env.aclose()


PLANNER_PARENT = """
    import subprocess, sys, time
    from agentfly_gym.envs.alfworld import planner
    # the planner's child exactly as compute_plan starts it; its stdin is a pipe the test keeps open, so
    # without the parent-death handling it would wait for a request forever
    child = subprocess.Popen([sys.executable, "-P", str(planner._WORKER), str(__import__("os").getpid())],
                             stdin=int(sys.argv[1]), pass_fds=(int(sys.argv[1]),))
    print(child.pid, flush=True)
    time.sleep(600)  # alive until the test kills it
"""


def test_alfworld_planner_child_dies_with_its_parent():
    read_end, write_end = os.pipe()
    try:
        parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PLANNER_PARENT), str(read_end)],
                                  stdout=subprocess.PIPE, text=True, pass_fds=(read_end,), env=dict(os.environ))
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()
        parent.wait(30)
        left = wait_gone([child], 15)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, "the planner child outlived its parent"
    finally:
        os.close(read_end)
        os.close(write_end)


R2E_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "r2e", "tasks.jsonl")
MALFORMED_R2E_ACTIONS = [
    '{"name": "execute_bash", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5001,  # RecursionError in json
    '{"name": "execute_bash", "arguments": "' + "[" * 5000 + '"}',
    "<function=execute_bash>\n<parameter=cmd>echo a\x00b</parameter>\n</function>",  # NUL in argv
    '{"name": "execute_bash", "arguments": {"cmd": "ls\\u0000"}}',
    "<function=file_editor>\n<parameter=command>view</parameter>\n<parameter=path>/testbed/\x00</parameter>\n</function>",
    "<function=a>" * 5000,
    "<tool_call>" * 5000,
    "\ud800 lone surrogate <function=execute_bash><parameter=cmd>echo \udfff</parameter></function>",
]


@pytest.fixture(params=["sandbox", "docker"])
def r2e_backend(request) -> dict:
    if request.param == "docker":
        return {"backend": "docker", "image": request.getfixturevalue("r2e_docker_image")}
    return {"backend": "sandbox", "image": "host"}


@pytest.mark.slow
async def test_malformed_r2e_actions_are_error_observations_not_episode_ends(r2e_backend):
    from agentfly_gym.envs.r2egym import R2EGymEnv

    async with ResourceManager() as m:
        env = R2EGymEnv(tasks=R2E_FIXTURES, manager=m, bash_timeout=10.0, **r2e_backend)
        await env.areset(seed=0)
        for action in MALFORMED_R2E_ACTIONS:
            t0 = time.monotonic()
            obs, reward, terminated, truncated, info = await env.astep(action)
            assert not (terminated or truncated) and info["error"] is None, (action[:80], obs[:300], info["error"])
            assert "ERROR" in obs or "Exit code" in obs, obs[:300]
            assert time.monotonic() - t0 < 30
        obs, *_ = await env.astep("<function=execute_bash>\n<parameter=cmd>echo still-here</parameter>\n</function>")
        assert "still-here" in obs
        await env.aclose()


class SlowThing:
    """A factory product whose construction waits for the test's ``gate``; records its closing."""

    built: list[SlowThing] = []
    building = threading.Event()
    gate = threading.Event()

    def __init__(self) -> None:
        SlowThing.building.set()
        assert SlowThing.gate.wait(60)
        self.closed = False
        SlowThing.built.append(self)

    def close(self) -> None:
        self.closed = True


async def test_cut_short_in_process_start_is_closed_and_holds_its_slot():
    from agentfly_gym.errors import ResourceTimeout
    from agentfly_gym.resources import InProcessSpec

    SlowThing.built.clear()
    SlowThing.building.clear()
    SlowThing.gate.clear()
    spec = InProcessSpec(factory="test_faults:SlowThing", max_instances=1)
    async with ResourceManager() as m:
        pool = m.pool(spec)
        acquire = asyncio.ensure_future(pool.acquire())
        assert await asyncio.to_thread(SlowThing.building.wait, 60)
        acquire.cancel()  # the caller gives up while the factory runs
        with pytest.raises(asyncio.CancelledError):
            await acquire
        assert pool.size == 1  # the factory still runs: its slot stays taken
        with pytest.raises(ResourceTimeout):
            await pool.acquire(timeout=0.05)
        SlowThing.gate.set()  # the factory returns now
        await until(lambda: pool.size == 0, 10, "the late instance to be closed")
        assert len(SlowThing.built) == 1
        assert SlowThing.built[0].closed
        r = await pool.acquire()  # the slot is usable again
        assert isinstance(r.obj, SlowThing)
        assert not r.obj.closed
        await pool.release(r)
    assert len(SlowThing.built) == 2
    assert all(t.closed for t in SlowThing.built)
