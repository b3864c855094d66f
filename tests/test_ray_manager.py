"""The cluster-wide resource manager on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``).

One cluster per module: a head node and two worker nodes that offer the custom resource ``sim`` (one of
them also ``docker``); the fault test adds (and kills) a node of its own.  Pooled instances are ``tests/raytools.py``'s ``Counted``
(it logs when each instance lives, so the cap is checked from outside) and real Chess-v0 puzzles hosted
in Ray actors (``RemoteEnv``).  Several drivers are separate processes connected to the cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster

from agentfly_gym.envs.remote import RemoteEnv
from agentfly_gym.errors import ConfigError, ResourceStartError, ResourceTimeout
from agentfly_gym.resources import ContainerSpec, InProcessSpec
from agentfly_gym.resources.ray import RayResourceManager
from agentfly_gym.resources.select import manager_kind

from proctools import alive, pids_with_env
from raytools import lifetimes, max_alive, pids

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SIM = {"*": {"resources": {"sim": 1}}}


def wait_for(cond, timeout: float = 60.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    old = os.environ.get("PYTHONPATH")
    # the nodes' workers import agentfly_gym and tests/raytools.py from here
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(REPO), old) if p)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"sim": 2})
    c.add_node(num_cpus=1, resources={"sim": 2, "docker": 2})
    ray.init(address=c.address, namespace="afg-test", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def counted(tmp_path: Path, cap: int, **kw) -> InProcessSpec:
    return InProcessSpec(factory="raytools:Counted", kwargs={"events_dir": str(tmp_path), **kw}, max_instances=cap)


def pool_actor_names() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("agentfly-pool-")}


DRIVER = textwrap.dedent("""
    import asyncio, json, sys, ray
    from agentfly_gym.resources import InProcessSpec
    from agentfly_gym.resources.ray import RayResourceManager
    address, events, cap, n, rounds, out = sys.argv[1:7]
    ray.init(address=address, namespace="afg-test", log_to_driver=False)
    spec = InProcessSpec(factory="raytools:Counted", kwargs={"events_dir": events}, max_instances=int(cap))
    async def one(m, i, r):
        async with m.scope(f"{i}-{r}") as scope:
            obj = await scope.acquire(spec, timeout=120)
            first = await obj.call("step", "a")
            await asyncio.sleep(0.2)  # a rollout's hold time: the leases of several drivers overlap
            second = await obj.call("step", "b")
            return [first, second, obj.uses]
    async def main():
        async with RayResourceManager(placement={"*": {"resources": {"sim": 1}}}) as m:
            res = []
            for r in range(int(rounds)):
                res += await asyncio.gather(*(one(m, i, r) for i in range(int(n))))
            return res
    json.dump(asyncio.run(main()), open(out, "w"))
""")


def start_driver(cluster, tmp_path: Path, events: Path, name: str, cap: int, n: int, rounds: int) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address, str(events), str(cap), str(n), str(rounds),
                             str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, out


@pytest.mark.slow
def test_cap_holds_across_driver_processes_and_reuse_is_reset(cluster, tmp_path):
    """Three drivers (this process and two others) lease a pool of cap 3 at once: never more than 3
    instances live in the cluster, every lease starts from a reset state, instances are reused."""
    events = tmp_path / "events"
    events.mkdir()
    spec = counted(events, 3)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            pool = m.pool(spec)  # this process makes the pool actor, so it outlives the other drivers
            drivers = [start_driver(cluster, tmp_path, events, f"d{i}", 3, 3, 2) for i in range(2)]

            async def one(i):
                async with m.scope(f"main-{i}") as scope:
                    obj = await scope.acquire(spec, timeout=120)
                    first = await obj.call("step", "x")
                    await asyncio.sleep(0.2)  # a rollout's hold time: the leases of several drivers overlap
                    return [first, await obj.call("step", "y"), obj.uses]

            mine = []
            for _ in range(2):
                mine += await asyncio.gather(*(one(i) for i in range(3)))
            results = list(mine)
            for proc, out in drivers:
                log, _ = await asyncio.to_thread(proc.communicate, timeout=300)
                assert proc.returncode == 0, log[-3000:]
                results += json.loads(out.read_text())
            snap = await pool.fetch_snapshot()
            return results, snap

    results, snap = asyncio.run(main())
    assert len(results) == 18
    for first, second, _uses in results:
        assert first[1] == 1 and second[1] == 2, f"a lease did not start from a reset state: {first}, {second}"
        assert first[0] == second[0]  # the same instance for the whole lease
    assert max_alive(events) <= 3, f"{max_alive(events)} instances lived at once with a cap of 3"
    assert snap["peak_live"] <= 3
    assert snap["started"] <= 3
    assert snap["acquires"] == 18
    assert snap["reused"] == 18 - snap["started"]
    assert max(r[2] for r in results) > 1
    assert any(r[0][2] > 0 for r in results)  # the object's own reset ran on reuse


@pytest.mark.slow
def test_fifo_timeout_and_cancelled_acquisitions_strand_nothing(cluster, tmp_path):
    spec = counted(tmp_path, 1)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            pool = m.pool(spec)
            holder = await pool.acquire()
            with pytest.raises(ResourceTimeout, match="capacity 1"):
                await pool.acquire(timeout=0.5)
            # a waiter cancelled while it waits
            t = asyncio.create_task(pool.acquire())
            await asyncio.to_thread(wait_for, lambda: ray.get(pool.handle.snapshot.remote())["waiting"] == 1, 30, "a waiter")
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            # FIFO: waiters are served in the order they arrived
            order: list[int] = []

            async def waiter(i):
                r = await pool.acquire(timeout=60)
                order.append(i)
                await pool.release(r)

            tasks = []
            for i in range(3):
                tasks.append(asyncio.create_task(waiter(i)))
                await asyncio.to_thread(wait_for, lambda: ray.get(pool.handle.snapshot.remote())["waiting"] == i + 1,
                                        30, f"{i + 1} waiters")
            await pool.release(holder)
            await asyncio.gather(*tasks)
            assert order == [0, 1, 2]
            # cancelled right after asking, before or after the grant arrives: the instance comes back
            for delay in (0.0, 0.05, 0.3):
                t = asyncio.create_task(pool.acquire())
                await asyncio.sleep(delay)  # the moment of the cancellation is the thing under test
                t.cancel()
                try:
                    r = await t
                    await pool.release(r)
                except asyncio.CancelledError:
                    pass
            r = await pool.acquire(timeout=30)  # would time out had any cancelled acquisition kept the lease
            snap = await pool.fetch_snapshot()
            assert snap["in_use"] == 1
            assert snap["live"] == 1
            await pool.release(r)
            await asyncio.to_thread(wait_for, lambda: ray.get(pool.handle.snapshot.remote())["in_use"] == 0, 30, "release")

    asyncio.run(main())


@pytest.mark.slow
def test_idle_instances_stop_after_max_idle_time_and_the_next_lease_starts_one(cluster, tmp_path):
    """As in the local pool: an instance nobody leases again within ``max_idle_time`` is stopped (its object
    closed, counted as ``recycled``) while the manager stays open; a later lease starts a fresh one."""
    events = tmp_path / "events"
    events.mkdir()
    spec = InProcessSpec(factory="raytools:Counted", kwargs={"events_dir": str(events)}, max_instances=2,
                         max_idle_time=2.0)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            pool = m.pool(spec)
            a, b = await pool.acquire(), await pool.acquire()
            await pool.release(a)
            await pool.release(b)
            # both are back: idle, or already recycled where the round trips under load took max_idle_time
            first = await pool.fetch_snapshot()
            assert first["idle"] + first["recycled"] == 2, first
            deadline = time.monotonic() + 60
            while (snap := await pool.fetch_snapshot())["live"]:
                assert time.monotonic() < deadline, f"idle instances still live: {snap}"
                await asyncio.sleep(0.2)
            assert snap["recycled"] == 2
            assert snap["idle"] == 0
            # the host closes a recycled object after the pool has counted it: wait for both close events
            while not all(stop is not None for _start, stop in lifetimes(events)):
                assert time.monotonic() < deadline, f"the objects were not closed: {lifetimes(events)}"
                await asyncio.sleep(0.2)
            c = await pool.acquire()
            snap = await pool.fetch_snapshot()
            await pool.release(c)
            return snap

    snap = asyncio.run(main())
    assert snap["started"] == 3
    assert snap["live"] == 1


@pytest.mark.slow
def test_global_resource_is_one_per_cluster_or_per_node(cluster, tmp_path):
    spec = counted(tmp_path, 4)

    async def main():
        async with RayResourceManager() as a, RayResourceManager() as b:
            ga, gb = await a.acquire_global(spec), await b.acquire_global(spec)
            assert ga.instance_id == gb.instance_id  # two processes' managers, one instance
            uid = (await ga.call("step", "x"))[0]
            assert (await gb.call("step", "y"))[0] == uid
        async with RayResourceManager(global_scope="node") as c:
            gc = await c.acquire_global(spec)
            assert gc.node_id == ray.get_runtime_context().get_node_id()

    asyncio.run(main())


def test_bad_settings_name_the_value(cluster, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="gpu_slot"):
        RayResourceManager(placement={"*": {"resources": {"gpu_slot": 1}}}).pool(counted(tmp_path, 1))
    with pytest.raises(ConfigError, match="global_scope='rack'"):
        RayResourceManager(global_scope="rack")
    with pytest.raises(ConfigError, match="resources='docker' must map resource names to amounts"):
        RayResourceManager(placement={"container": {"resources": "docker"}})
    monkeypatch.setenv("AGENTFLY_GYM_MANAGER", "auto")
    assert manager_kind() == "ray"  # this process is connected to Ray
    monkeypatch.setenv("AGENTFLY_GYM_MANAGER", "cluster")
    with pytest.raises(ConfigError, match="'cluster'"):
        manager_kind()


@pytest.mark.slow
def test_killed_node_ends_its_rollouts_with_an_error_and_others_finish(cluster, tmp_path):
    """Chess puzzles hosted on a node that is killed mid-episode end truncated with info["error"]; the
    puzzles hosted elsewhere play to the end; the lease of a client process on that node comes back; a new
    episode starts on a replacement node."""
    doomed = cluster.add_node(num_cpus=1, resources={"doomed": 3})
    cluster.wait_for_nodes()
    held = counted(tmp_path, 1)
    placement = {"*": {"resources": {"sim": 1}}, "doomed": {"resources": {"doomed": 1}}}

    async def main():
        async with RayResourceManager(placement=placement) as m:
            await m.pool(held).attach()  # this process makes (and owns) the pool, so it outlives the holder
            holder = ray.remote(__import__("raytools").Holder).options(num_cpus=0, resources={"doomed": 1}).remote()
            await holder.hold.remote(held)  # a client on the doomed node holds the only instance
            assert (await m.pool(held).fetch_snapshot())["in_use"] == 1
            safe = [RemoteEnv("agentfly/Chess-v0", max_instances=2, manager=m, step_timeout=120) for _ in range(2)]
            lost = [RemoteEnv("agentfly/Chess-v0", {"max_rating": 3000}, max_instances=2, manager=m, step_timeout=120)
                    for _ in range(2)]
            for e in lost:  # a distinct spec (kwargs differ), placed on the doomed node by its name
                e.spec_of_host = dataclasses.replace(e.spec_of_host, name="doomed")
            infos = await asyncio.gather(*(e.areset(seed=i) for i, e in enumerate(safe + lost)))
            nodes = [e.scope.resources[e.spec_of_host.key].node_id for e in safe + lost]
            assert set(nodes[2:]) == {doomed.node_id}
            assert doomed.node_id not in nodes[:2]
            cluster.remove_node(doomed)
            outs = []
            for e, (_obs, info) in zip(safe + lost, infos):
                done, steps = False, 0
                while not done and steps < 40:
                    action = (info.get("admissible_actions") or ["e2e4"])[0]
                    _obs, _r, term, trunc, info = await e.astep(action)
                    done, steps = term or trunc, steps + 1
                outs.append((term, trunc, info.get("error")))
            for term, trunc, err in outs[:2]:
                assert err is None
                assert (term or trunc)
            for term, trunc, err in outs[2:]:
                assert trunc and not term and err and "died" in err, err
            # the dead node's client gave its lease back (the pool watches its clients' nodes)
            other = await m.pool(held).acquire(timeout=90)
            await m.pool(held).release(other)
            replacement = cluster.add_node(num_cpus=1, resources={"doomed": 2})
            obs, info = await lost[0].areset(seed=5)
            assert info["error"] is None
            assert obs
            assert lost[0].scope.resources[lost[0].spec_of_host.key].node_id == replacement.node_id
            for e in safe + lost:
                await e.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_shutdown_and_sigterm_leave_no_actor_or_process(cluster, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    spec = counted(events, 2)

    async def main():
        m = RayResourceManager(placement=SIM)
        async with m.scope("s") as scope:
            obj = await scope.acquire(spec)
            pid = await obj.call("pid")
        await m.aclose()
        return pid

    pid = asyncio.run(main())
    wait_for(lambda: not alive(pid), 60, "the host process to end")
    wait_for(lambda: not pool_actor_names(), 60, "the pool actors to end")
    # a driver killed by SIGTERM in the middle of its rollouts
    proc, _out = start_driver(cluster, tmp_path, events, "term", 2, 2, 50)
    wait_for(lambda: pool_actor_names(), 120, "the driver's pool")
    wait_for(lambda: len(list(events.glob("*.log"))) >= 2, 120, "the driver's instances")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    wait_for(lambda: not pool_actor_names(), 60, "the driver's pool actors to end")
    wait_for(lambda: all(stop is not None for _start, stop in lifetimes(events)), 60, "every instance to be closed")
    wait_for(lambda: not any(alive(p) for p in pids(events)), 60, "every host process to end")


@pytest.mark.slow
def test_an_instance_host_is_set_to_a_local_manager_through_its_runtime_env(cluster):
    """A client in a job whose processes say ``AGENTFLY_GYM_MANAGER=ray`` (as verl's workers do): the host actor
    of an instance is set to ``local`` by its ``runtime_env`` (merged over the client's), so what the instance
    needs is started beside it, not pooled in the cluster again; the host changes no ``os.environ``."""

    @ray.remote(num_cpus=0)
    class Client:
        async def kinds(self) -> tuple:
            from agentfly_gym.resources.select import manager_kind

            async with RayResourceManager(placement=SIM) as m:
                async with m.scope("s") as scope:
                    obj = await scope.acquire(InProcessSpec(factory="raytools:Setting", max_instances=1))
                    return manager_kind(), await obj.call("kind")

    client = Client.options(runtime_env={"env_vars": {"AGENTFLY_GYM_MANAGER": "ray"}}).remote()
    try:
        assert ray.get(client.kinds.remote(), timeout=300) == ("ray", "local")
    finally:
        ray.kill(client)


@pytest.mark.slow
def test_remote_env_gives_the_same_episode_hosted_locally_and_on_ray(cluster):
    """The same seed and actions give the same observations, rewards and infos whether the Chess env is
    hosted in this process (a local manager) or in a Ray actor on a worker node."""
    from agentfly_gym.resources import ResourceManager

    async def play(manager):
        env = RemoteEnv("agentfly/Chess-v0", manager=manager)
        obs, info = await env.areset(seed=3)
        trace = [(obs, info["task_id"], info["fen"])]
        for action in ("Action: zz", info["admissible_actions"][0]):
            obs, reward, term, trunc, info = await env.astep(action)
            trace.append((obs, reward, term, trunc, info["fen"], info["error"]))
        await env.aclose()
        return trace

    async def main():
        async with ResourceManager() as local, RayResourceManager(placement=SIM) as remote:
            return await play(local), await play(remote)

    here, there = asyncio.run(main())
    assert here == there
    assert here[1][2:4] == (False, False)
    assert here[1][5] is None


@pytest.mark.slow
@pytest.mark.docker
def test_container_lives_on_a_docker_node_and_is_removed_at_close(cluster, docker_client):
    """A real Docker container placed by the ``docker`` node resource: its commands run through the host
    actor on that node, its reuse resets it, and closing the manager removes it."""
    spec = ContainerSpec(image="agentfly/base", backend="docker", max_instances=1, memory="256m", disk=None)
    docker_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("docker"))

    async def main():
        async with RayResourceManager(placement={"container": {"resources": {"docker": 1}}}) as m:
            label = {"label": f"agentfly.manager={m.id}"}
            async with m.scope("r1") as scope:
                box = await scope.acquire(spec)
                assert box.node_id == docker_node
                r = await box.exec("echo hi > /tmp/mark && cat /tmp/mark")
                assert r.exit_code == 0
                assert r.output.strip() == "hi"
                assert len(docker_client.containers.list(filters=label)) == 1
            async with m.scope("r2") as scope:
                box = await scope.acquire(spec)
                assert box.uses == 2
                r = await box.exec("test -e /tmp/mark && echo leaked || echo clean")
                assert r.output.strip() == "clean"  # reset on reuse, done where the container lives
        return label

    label = asyncio.run(main())
    wait_for(lambda: not docker_client.containers.list(all=True, filters=label), 60, "the container to be removed")


def test_verl_plugin_shares_the_cluster_pools_when_the_setting_says_ray(cluster, monkeypatch):
    """``AGENTFLY_GYM_MANAGER=ray``: the plugin's per-worker manager is a RayResourceManager of this job."""
    from agentfly_gym_verl import runtime

    monkeypatch.setenv("AGENTFLY_GYM_MANAGER", "ray")
    monkeypatch.setenv("AGENTFLY_GYM_RAY_GLOBAL", "node")

    async def main():
        m = runtime.get_manager()
        try:
            assert isinstance(m, RayResourceManager)
            assert m.global_scope == "node"
            assert m.namespace == ray.get_runtime_context().namespace
        finally:
            await runtime.aclose()
        assert m.closed

    asyncio.run(main())


@pytest.mark.slow
def test_runner_plays_pooled_envs_through_typed_proxies_on_ray(cluster, monkeypatch):
    """``agentfly-gym rollout`` under ``AGENTFLY_GYM_MANAGER=ray``: Chess games against Stockfish (an engine pool
    reached through its typed proxy) and ScienceWorld (a JVM pool) play on the cluster, and the summary reads the
    Ray pools' metrics under the local pool's names."""
    from transformers import AutoTokenizer

    from agentfly_gym.rollout import RandomPolicy, RolloutConfig, run_rollouts
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir

    monkeypatch.setenv("AGENTFLY_GYM_MANAGER", "ray")
    monkeypatch.setenv("AGENTFLY_GYM_RAY_PLACEMENT", json.dumps(SIM))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir()))
    config = RolloutConfig(env_ids=["Chess-v0", "ScienceWorld-v0"], num_trajectories=4, concurrency=4, max_turns=2,
                           env_kwargs={"Chess-v0": {"mode": "play", "max_instances": 2},
                                       "ScienceWorld-v0": {"max_instances": 2, "with_admissible_actions": True}})
    result = asyncio.run(run_rollouts(config, RandomPolicy(seed=0), chat, progress=False))
    assert result.summary["errors"] == 0, [t.error for t in result.trajectories]
    assert all(t.num_turns >= 1 for t in result.trajectories)
    res = result.summary["resources"]
    assert res["started"] >= 2
    assert 2 <= res["max_in_use"] <= 4
    assert set(res["pools"])


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.0, 2.0])
def test_sigterm_while_ray_starts_leaves_no_process_and_writes_the_summary(tmp_path, after):
    """``AGENTFLY_GYM_MANAGER=ray agentfly-gym rollout`` starts a local Ray (``ray.init``, seconds); a SIGTERM in
    the middle of that start (``after`` seconds after its first Ray process appeared) is held until the start
    has finished, then cancels the run as any SIGTERM does: exit status 143, summary.json written
    (interrupted), and no process of the run's tree left (the Ray node's, its dashboard's helpers) shortly
    after.  Processes are told apart by a variable in their environment, so others' Ray stays out of it."""
    import shutil
    import tempfile

    mark = os.urandom(8).hex()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # a Ray of its own: its own temp folder (short, for Ray's socket paths), so it neither finds this module's
    # cluster nor anyone else's through the address file ray.init reads
    ray_tmp = tempfile.mkdtemp(prefix="afg-ray-", dir="/tmp")
    env.update(AGENTFLY_GYM_MANAGER="ray", AFG_TEST_TREE=mark, RAY_TMPDIR=ray_tmp)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "agentfly_gym", "rollout", "--env", "Chess-v0", "--policy", "random",
                             "-n", "2", "--max-turns", "2", "--no-progress", "--output-dir", str(out)],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: any("gcs_server" in c or "raylet" in c for c in pids_with_env("AFG_TEST_TREE", mark).values()),
                 120, "Ray's first processes")
        time.sleep(after)  # the moment of the SIGTERM within Ray's start is the thing under test
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=180)
        assert proc.returncode == 143, output[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["interrupted"] is True
        wait_for(lambda: not pids_with_env("AFG_TEST_TREE", mark), 30, "every process of the run to end")
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)


HOLDER = textwrap.dedent("""
    import asyncio, sys, ray
    from agentfly_gym.resources import InProcessSpec
    from agentfly_gym.resources.ray import RayResourceManager
    address, events = sys.argv[1:3]
    ray.init(address=address, namespace="afg-test", log_to_driver=False)
    spec = InProcessSpec(factory="raytools:Counted", kwargs={"events_dir": events}, max_instances=1)
    async def main():
        m = RayResourceManager(placement={"*": {"resources": {"sim": 1}}})
        obj = await m.pool(spec).acquire(timeout=120)
        print("held", await obj.call("pid"), flush=True)
        await asyncio.sleep(3600)  # holds the lease until the test kills this driver
    asyncio.run(main())
""")


@ray.remote(num_cpus=0)
class _Holder:
    """A worker process (an actor) that leases the pool's one instance and keeps it."""

    async def hold(self, events: str) -> int:
        self.manager = RayResourceManager(placement=SIM)
        self.lease = await self.manager.pool(counted(Path(events), 1)).acquire(timeout=120)
        return os.getpid()


@pytest.mark.slow
def test_leases_of_a_sigkilled_client_come_back(cluster, tmp_path):
    """A client process killed with SIGKILL on a node that stays up (a driver, then a worker) never detaches; the
    pool finds its process gone in the cluster's tables and takes its lease back, so the next acquisition of the
    pool's single instance is served instead of waiting until the pool ends."""
    events = tmp_path / "events"
    events.mkdir()
    spec = counted(events, 1)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            await m.pool(spec).attach()  # this process keeps the pool (its owner) while the holders come and go
            log = tmp_path / "holder.log"
            with open(log, "w") as err:
                holder = subprocess.Popen([sys.executable, "-c", HOLDER, cluster.address, str(events)],
                                          stdout=subprocess.PIPE, stderr=err, text=True)
            try:
                line = await asyncio.to_thread(holder.stdout.readline)  # "held <pid>", or "" if it died
                assert line.startswith("held"), log.read_text()[-3000:]
            finally:
                holder.kill()
                holder.wait()
            async with m.scope("after-driver") as scope:
                obj = await scope.acquire(spec, timeout=90)
                assert (await obj.call("step", "x"))[1] == 1           # reset: nothing of the dead client's lease
            actor = _Holder.remote()
            pid = await actor.hold.remote(str(events))
            os.kill(pid, signal.SIGKILL)
            async with m.scope("after-worker") as scope:
                await scope.acquire(spec, timeout=90)
            snap = await m.pool(spec).fetch_snapshot()
            assert snap["clients"] == 1
            assert snap["started"] == 1
            assert snap["timeouts"] == 0

    asyncio.run(main())


async def _until_async(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def test_cluster_pool_serves_larger_priority_first_and_its_age_bound_keeps_the_rest_from_starving(cluster, tmp_path):
    """Issue 29: capacity 1.  A waiter of priority 1 is overtaken by a stream of priority-100 acquisitions (three
    acquirers, each holding the instance 0.2 s and queueing again): with no age bound it is never served while
    the stream lasts (2 s); with an age bound of 1 s it is served once it has waited 1 s, before the stream ends."""
    spec = counted(tmp_path, 1)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            pool = m.pool(spec)
            served: list[tuple[str, float]] = []
            stop = asyncio.Event()

            async def waiting(n: int) -> bool:
                return (await pool.fetch_snapshot())["waiting"] >= n

            async def low(name: str) -> None:
                res = await pool.acquire(priority=1.0, timeout=60)
                served.append((name, time.monotonic()))
                await pool.release(res)

            async def high() -> None:
                while not stop.is_set():
                    res = await pool.acquire(priority=100.0, timeout=60)
                    served.append(("high", time.monotonic()))
                    await asyncio.sleep(0.2)
                    await pool.release(res)

            async def trial(name: str, bound: float | None, run_for: float) -> float | None:
                """Seconds the low waiter waited, if it was served while the stream ran for ``run_for`` s."""
                await pool.set_priority_age_bound(bound)
                served.clear()
                stop.clear()
                holder = await pool.acquire()
                t0 = time.monotonic()
                waiter = asyncio.create_task(low(name))
                await _until_async(lambda: waiting(1))
                stream = [asyncio.create_task(high()) for _ in range(3)]
                await _until_async(lambda: waiting(4))
                await pool.release(holder)
                t_release = time.monotonic()
                await asyncio.sleep(run_for)
                stop.set()
                await asyncio.gather(waiter, *stream)
                names = [n for n, _ in served]
                assert names.index(name) > 0, "priority: the stream overtook the older low-priority waiter"
                t_low = dict(served)[name]
                return t_low - t0 if t_low < t_release + run_for else None

            assert await trial("starved", None, 2.0) is None  # without the bound: starved while the stream lasts
            waited = await trial("aged", 1.0, 3.0)
            assert waited is not None and waited >= 1.0, waited
            snap = await pool.fetch_snapshot()
            assert snap["timeouts"] == 0
            assert snap["waiting"] == 0
            assert snap["peak_live"] == 1

    asyncio.run(main())


def test_priorities_travel_to_the_cluster_pool_and_larger_is_served_first(cluster, tmp_path):
    """Issue 29: a scope's acquisition priority (set for the rollout's task) reaches the pool actor, which
    serves its waiters larger first (FIFO among equal and unknown ones)."""
    from agentfly_gym.resources.priority import acquire_priority

    spec = counted(tmp_path, 1)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            pool = m.pool(spec)
            holder = await pool.acquire()
            order: list[int] = []

            async def rollout(i: int, p: float | None):
                with acquire_priority(p):
                    async with m.scope(f"r{i}", acquire_timeout=60) as scope:
                        await scope.acquire(spec)
                        order.append(i)

            tasks = []
            for i, p in enumerate((1.0, None, 10.0, 1.0)):
                tasks.append(asyncio.create_task(rollout(i, p)))
                await asyncio.to_thread(wait_for, lambda: ray.get(pool.handle.snapshot.remote())["waiting"] == i + 1,
                                        30, f"{i + 1} waiters")
            await pool.release(holder)
            await asyncio.gather(*tasks)
            assert order == [2, 0, 3, 1]

    asyncio.run(main())


# ---------------------------------------------------------------------- one host actor per node
def host_pids_by_node(snap: dict) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for inst in snap["instances"].values():
        out.setdefault(inst["node_id"], set()).add(inst["pid"])
    return out


def test_one_host_per_node_holds_all_its_instances_as_they_grow(cluster, tmp_path):
    """With ``hosting="node"`` a pool has one host process per node however many instances it holds
    there (each instance's ``sim`` reservation still decides where it goes: 8 per node at 0.25 of the node's 2);
    with ``hosting="instance"`` (the earlier design) each instance has a process of its own."""
    events = tmp_path / "events"
    events.mkdir()
    spec = counted(events, 16)

    async def main():
        async with RayResourceManager(placement={"*": {"resources": {"sim": 0.25}}}, hosting="node") as m:
            pool = m.pool(spec)
            held, seen = [], []
            for n in (2, 8, 16):
                held += await asyncio.gather(*(pool.acquire(timeout=60) for _ in range(n - len(held))))
                by_node = host_pids_by_node(await pool.fetch_snapshot())
                seen.append((n, {node: len(p) for node, p in by_node.items()}))
                uids = await asyncio.gather(*(r.call("step", "x") for r in held))
                assert len({u[0] for u in uids}) == n  # n distinct objects, each its own state
            snap = await pool.fetch_snapshot()
            assert snap["hosting"] == "node"
            assert snap["hosts"] == 2
            assert snap["live"] == 16
            # an object reports the process it runs in: the host's, one per node
            pids_seen = {await r.call("pid") for r in held}
            assert pids_seen == {p for ps in host_pids_by_node(snap).values() for p in ps}
            for r in held:
                await pool.release(r)
        async with RayResourceManager(placement=SIM, hosting="instance") as old:
            pool = old.pool(counted(events, 2))
            a, b = await pool.acquire(timeout=60), await pool.acquire(timeout=60)
            assert await a.call("pid") != await b.call("pid")
            snap = await pool.fetch_snapshot()
            assert snap["hosting"] == "instance"
            assert snap["hosts"] == 2
            await pool.release(a)
            await pool.release(b)
        return seen

    seen = asyncio.run(main())
    for n, per_node in seen:
        assert set(per_node.values()) == {1}, f"{n} instances: host processes per node {per_node}"
    assert len(seen[-1][1]) == 2  # 16 instances at 8 per node: both sim nodes
    assert max_alive(events) <= 16
    with pytest.raises(ConfigError, match="hosting='thread'"):
        RayResourceManager(hosting="thread")


def test_a_dead_host_loses_all_its_instances_and_the_next_acquire_replaces_them(cluster, tmp_path):
    """SIGKILL of a node's host process: every instance it held is lost (the leased ones raise ResourceDied on
    their next call, the idle one is discarded when it would be reused), the pool counts them dead, and the next
    acquisitions start fresh instances in a new host on that node."""
    from agentfly_gym.errors import ResourceDied

    events = tmp_path / "events"
    events.mkdir()
    spec = counted(events, 4)

    async def main():
        async with RayResourceManager(placement={"*": {"resources": {"sim": 0.25}}}, hosting="node") as m:
            pool = m.pool(spec)
            first = await pool.acquire(timeout=60)
            node = first.node_id
            rest = await asyncio.gather(*(pool.acquire(timeout=60, node_id=node) for _ in range(2)))
            idle = await pool.acquire(timeout=60, node_id=node)
            await pool.release(idle)
            leased = [first, *rest]
            pid = await first.call("pid")
            assert {await r.call("pid") for r in leased} == {pid}  # one host holds them all
            os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(wait_for, lambda: not alive(pid), 30, "the host to die")
            for r in leased:
                with pytest.raises(ResourceDied):
                    await r.call("step", "x")
                await pool.release(r)
            fresh = await asyncio.gather(*(pool.acquire(timeout=60, node_id=node) for _ in range(2)))
            out = [await r.call("step", "y") for r in fresh]
            new_pids = {await r.call("pid") for r in fresh}
            snap = await pool.fetch_snapshot()
            for r in fresh:
                await pool.release(r)
            return out, new_pids, pid, snap

    out, new_pids, old_pid, snap = asyncio.run(main())
    assert all(o[1] == 1 for o in out)  # fresh objects
    assert len(new_pids) == 1
    assert old_pid not in new_pids
    assert snap["died"] == 4
    assert snap["started"] == 6
    assert snap["live"] == 2
    assert snap["hosts"] >= 1


def test_batched_calls_run_in_order_in_one_round_trip(cluster, tmp_path):
    """``batch`` runs several calls on one instance in order where it lives and returns their results; a call
    that raises stops the batch there (the calls after it do not run) and its error reaches the caller."""
    events = tmp_path / "events"
    events.mkdir()
    spec = counted(events, 1)

    def length(obj) -> int:
        return len(obj.state)

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            async with m.scope("b") as scope:
                obj = await scope.acquire(spec, timeout=60)
                out = await obj.batch([("step", ("a",)), ("step", ("b",), {}), ("pid",), (length,)])
                with pytest.raises(AttributeError):
                    await obj.batch([("step", ("c",)), ("no_such_method",), ("step", ("d",))])
                after = await obj.call("step", "e")
                return out, after

    out, after = asyncio.run(main())
    assert [o[1] for o in out[:2]] == [1, 2]
    assert out[0][0] == out[1][0]
    assert isinstance(out[2], int)
    assert out[3] == 2
    assert after[1] == 4  # "c" ran, "d" did not: a, b, c, e


@pytest.mark.slow
def test_acquisitions_and_releases_of_one_turn_travel_in_one_call(cluster, tmp_path):
    """Eight acquisitions made in one turn of a process's event loop reach the pool actor in one call, their
    releases in one more, and the instances that came back are reset with one call per host
    (throughput); every lease of a reused instance still starts from its reset state."""
    spec = counted(tmp_path, 8)

    async def main():
        async with RayResourceManager(placement={"*": {"resources": {"sim": 0.25}}}) as m:
            pool = m.pool(spec)
            await pool.prewarm(8)
            before = await pool.fetch_snapshot()
            leases = await asyncio.gather(*(pool.acquire(timeout=60) for _ in range(8)))
            firsts = [await r.call("step", "x") for r in leases]
            for r in leases:
                await pool.release(r)
            after = await pool.fetch_snapshot()
            return before, after, firsts, {r.instance_id for r in leases}

    before, after, firsts, ids = asyncio.run(main())
    assert before["live"] == 8
    assert before["idle"] == 8
    assert len(ids) == 8
    assert after["acquire_calls"] - before["acquire_calls"] == 1
    assert after["release_calls"] - before["release_calls"] == 1
    assert 1 <= after["recycle_calls"] - before["recycle_calls"] <= after["hosts"]
    assert all(f[1] == 1 and f[2] >= 1 for f in firsts), firsts  # a reset object, reset at least once
    assert after["idle"] == 8
    assert after["reused"] - before["reused"] == 8


@pytest.mark.slow
def test_a_timed_out_wait_is_a_timeout_and_one_stuck_reset_fails_alone(cluster, tmp_path):
    """An acquisition that times out while it waits raises ResourceTimeout (not a lost-request error), however
    short its timeout; three instances of one host that come back in one turn are reset in one call, and the one
    whose reset hangs past ``start_timeout`` is replaced alone: the other two are handed out again at once."""
    events = tmp_path / "events"
    events.mkdir()
    # start_timeout is also each reset's limit: long enough for a start on a loaded machine, short of the stuck 30 s
    spec = InProcessSpec(factory="raytools:StuckReset", kwargs={"events_dir": str(events), "stuck_s": 30.0},
                         max_instances=3, start_timeout=12.0)

    async def main():
        async with RayResourceManager(placement={"*": {"resources": {"sim": 0.25}}}) as m:
            pool = m.pool(spec)
            first = await pool.acquire(timeout=60)
            rest = await asyncio.gather(*(pool.acquire(timeout=60, node_id=first.node_id) for _ in range(2)))
            for timeout in (0, 0.01, 0.05, 0.2):
                with pytest.raises(ResourceTimeout) as e:
                    await pool.acquire(timeout=timeout)
                assert "\n" not in str(e.value), str(e.value)  # the pool's own error, not Ray's traceback
            for r in (first, *rest):
                await pool.release(r)
            t0 = time.monotonic()
            again = await asyncio.gather(*(pool.acquire(timeout=60) for _ in range(2)))
            took = time.monotonic() - t0
            uses = sorted(r.uses for r in again)
            for r in again:
                await pool.release(r)
            return took, uses, await pool.fetch_snapshot()

    took, uses, snap = asyncio.run(main())
    assert uses == [2, 2] and took < 25, (took, uses)  # the two healthy ones, not fresh starts after the stuck one
    assert snap["died"] == 1 and snap["timeouts"] >= 4 and snap["in_use"] == 0, snap


def test_a_pin_to_an_absent_node_fails_at_once_and_a_reset_replaced_on_its_host_is_counted(cluster, tmp_path):
    """An acquisition pinned to a node that is not in the cluster fails at once, naming the node (not a timeout of
    "no instance became free"); an instance whose reset raises is replaced in place by its host's local pool, and
    the cluster snapshot counts it (``replaced_on_host``, and the local pool's ``replaced``)."""
    events = tmp_path / "events"
    events.mkdir()
    spec = InProcessSpec(factory="raytools:FailingReset", kwargs={"events_dir": str(events)}, max_instances=1)
    absent = "ab" * 28

    async def main():
        async with RayResourceManager(placement=SIM) as m:
            pool = m.pool(spec)
            r = await pool.acquire(timeout=60)
            t0 = time.monotonic()
            with pytest.raises(ResourceStartError, match=absent) as e:  # not the ResourceTimeout of a wait
                await pool.acquire(timeout=600, node_id=absent)
            took = time.monotonic() - t0
            await pool.release(r)
            again = await pool.acquire(timeout=60)
            pid, uses = again.pid, again.uses
            await pool.release(again)
            return took, str(e.value), pid == r.pid, uses, await pool.fetch_snapshot()

    took, message, same_host, uses, snap = asyncio.run(main())
    # at once: long before the acquire's 600 s timeout (60 s leaves a loaded machine's Ray calls their time)
    assert took < 60 and "not a live node" in message and "\n" not in message, (took, message)
    assert same_host and uses == 2, (same_host, uses)  # the same cluster instance, its object replaced on its host
    assert snap["replaced_on_host"] == 1 and snap["replaced"] == 1 and snap["died"] == 0, snap
    assert len(lifetimes(events)) == 2, lifetimes(events)  # the first object stopped, its replacement started
