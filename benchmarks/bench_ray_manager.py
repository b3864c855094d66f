"""The cluster-wide resource manager (``RayResourceManager``) against the local one, on this machine's Ray.

Three measurements, on a local Ray started by the script (``ray.init``; a one-node cluster, so "across
the network" is across processes over Ray's RPC, the floor of what a real network adds):

- per-step overhead: Chess-v0 puzzles, stepping an unparsable move (a handled observation, the episode
  goes on) ``--steps`` times; in-process env (``gymnasium.make``) vs the same env hosted in a Ray actor
  (``RemoteEnv`` + ``RayResourceManager``: one actor call per step, text in and out); also one bare
  resource call (``dict.get`` on an ``InProcessSpec`` object) locally vs on a Ray-hosted instance.
  Goal: under 2 ms added per step (median).
- acquire latency of a reused instance across processes: two Ray actors (separate processes) take turns
  leasing the one instance of a pool (cap 1) and returning it; each lease after the first is a reuse that
  another process released, with the reset on reuse done where the instance lives.  Local reference: the
  same loop in one process with a local ``ResourceManager``.
- WebShop memory with 4 workers (Ray actors running a WebShop episode each: reset + a search): one
  server per worker (each worker's local manager loads its own catalog, index and spaCy model) vs one
  shared server (``RayResourceManager``, ``global_scope="cluster"``).  Memory is the PSS (proportional set
  size, ``/proc/<pid>/smaps_rollup``: shared pages split between the processes that map them) summed over
  the worker processes and the server's host process, minus the workers' PSS before the episode.

Two more, on a local 3-node ``ray.cluster_utils.Cluster`` (a head and two workers, each offering a ``slot``
resource), for both designs in the same run: ``hosting="node"`` (one host actor per node and pool holds
all the pool's instances there) and ``hosting="instance"`` (one host actor, a Ray worker process, per instance):

- memory per hosted instance (``--parts memory``): a pool of a cheap in-process kind (``builtins:dict``), instances
  spread over the nodes (``SPREAD``) and all held at once, at 8, 64 and 256 instances (``--sizes``).  Reported:
  the PSS of every Ray worker process of the cluster (the pool actor, the hosts, Ray's idle workers) per instance,
  and the growth over the cluster with the pool attached but empty, per instance (``added_per_instance``); and,
  for reference, what one such instance costs inside a local pool in this process (the instance itself).  Goal:
  under 5 MB per instance beyond the instance itself.  The per-instance design stops at ``--instance-max``
  instances (default 32, measured as a size of its own): 64 or 256 of its ~75-100 MB processes (6-23 GB, minutes
  of starts) do not fit a shared 2-core machine.
- acquisition throughput (``--parts throughput``): 4 driver processes (``--drivers``) connected to the cluster,
  each with ``--concurrency`` tasks that acquire (a reused instance, reset on its host when it came back) and
  release in a loop against one pool for ``--seconds``; acquires per second over all drivers.  Goal: >= 500/s.
  Also, over the measured window, the CPU time per acquire of each kind of process (the pool actor, the hosts, the
  drivers, Ray's own), read from the kernel's accounting, and the requests each call carried (the batching): the
  rate on a shared 2-core machine is bounded by the sum, and the pool actor's share bounds it on any machine.

A step that needs several calls on one instance can send them in one round trip (``RayResource.batch``); one Ray
actor call per step (about 1.8 ms for an empty call on this machine, ``ray_actor_call_floor_s``) is the floor of
any Ray-hosted step, whatever the hosting.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common as C

GOAL_ADDED_PER_STEP_S = 0.002
BAD_MOVE = "Action: not-a-move"


def pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------- per-step overhead
async def _steps(env: Any, n: int) -> list[float]:
    await env.areset(seed=0)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        _obs, _r, term, trunc, info = await env.astep(BAD_MOVE)
        out.append(time.perf_counter() - t)
        assert not (term or trunc), info
    return out


async def _calls(resource: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await resource.call("get", "key")
        out.append(time.perf_counter() - t)
    return out


async def measure_overhead(steps: int) -> dict[str, Any]:
    import gymnasium

    from agentfly_gym.envs.remote import RemoteEnv
    from agentfly_gym.resources import InProcessSpec, ResourceManager
    from agentfly_gym.resources.ray import RayResourceManager

    warm = max(3, steps // 10)
    spec = InProcessSpec(factory="builtins:dict", max_instances=1)
    async with ResourceManager() as local, RayResourceManager() as remote:
        env_local = gymnasium.make("agentfly/Chess-v0", manager=local, max_episode_steps=10 * (steps + warm)).unwrapped
        env_remote = RemoteEnv("agentfly/Chess-v0", {"max_episode_steps": 10 * (steps + warm)}, manager=remote,
                               max_episode_steps=10 * (steps + warm))
        await _steps(env_local, warm)
        await _steps(env_remote, warm)
        t_local = await _steps(env_local, steps)
        t_remote = await _steps(env_remote, steps)
        await env_local.aclose()
        await env_remote.aclose()
        async with local.scope("call") as s1, remote.scope("call") as s2:
            r1, r2 = await s1.acquire(spec), await s2.acquire(spec)
            await _calls(r1, warm)
            await _calls(r2, warm)
            c_local, c_remote = await _calls(r1, steps), await _calls(r2, steps)
    floor = await _ray_floor(steps + warm)
    med = {k: statistics.median(v) for k, v in
           {"step_local": t_local, "step_ray": t_remote, "call_local": c_local, "call_ray": c_remote}.items()}
    added = med["step_ray"] - med["step_local"]
    return {"steps": steps, "median_s": med, "p95_s": {"step_local": C.pct(t_local, 0.95), "step_ray": C.pct(t_remote, 0.95),
                                                       "call_local": C.pct(c_local, 0.95), "call_ray": C.pct(c_remote, 0.95)},
            "ray_actor_call_floor_s": floor, "added_per_step_s": added, "added_per_call_s": med["call_ray"] - med["call_local"],
            "goal_added_per_step_s": GOAL_ADDED_PER_STEP_S, "goal_met": added < GOAL_ADDED_PER_STEP_S}


class Echo:
    async def echo(self, x: Any) -> Any:
        return x


async def _ray_floor(n: int) -> float:
    """Median seconds of one awaited call to an empty async Ray actor method on this machine (Ray's own cost)."""
    import ray

    actor = ray.remote(Echo).options(num_cpus=0).remote()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await actor.echo.remote("x")
        out.append(time.perf_counter() - t)
    ray.kill(actor)
    return statistics.median(out[len(out) // 10:])


# ---------------------------------------------------------------------- acquire latency across processes
class Taker:
    """A Ray actor (its own process) that leases the pooled instance once per call."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.manager: Any = None

    async def take(self) -> float:
        from agentfly_gym.resources.ray import RayResourceManager

        if self.manager is None:
            self.manager = RayResourceManager()
        pool = self.manager.pool(self.spec)
        t = time.perf_counter()
        r = await pool.acquire()
        took = time.perf_counter() - t
        await r.call("get", "key")
        await pool.release(r)
        return took

    async def close(self) -> None:
        if self.manager is not None:
            await self.manager.aclose()


async def measure_acquire(rounds: int) -> dict[str, Any]:
    import ray

    from agentfly_gym.resources import InProcessSpec, ResourceManager
    from agentfly_gym.resources.ray import RayResourceManager

    spec = InProcessSpec(factory="builtins:dict", max_instances=1, name="bench-acquire")
    async with RayResourceManager() as owner:  # this process owns the pool actor for the whole run
        owner.pool(spec)
        takers = [ray.remote(Taker).options(num_cpus=0).remote(spec) for _ in range(2)]
        first = await takers[0].take.remote()  # the start
        lat = []
        for i in range(rounds):
            lat.append(await takers[(i + 1) % 2].take.remote())  # released by the other process just before
        snap = await owner.pool(spec).fetch_snapshot()
        await asyncio.gather(*(t.close.remote() for t in takers))
    local = []
    async with ResourceManager() as m:
        pool = m.pool(spec)
        await pool.release(await pool.acquire())
        for _ in range(rounds):
            t = time.perf_counter()
            r = await pool.acquire()
            local.append(time.perf_counter() - t)
            await pool.release(r)
    return {"rounds": rounds, "first_acquire_with_start_s": first, "ray_reuse_s": lat, "local_reuse_s": local,
            "ray_reuse_median_s": statistics.median(lat), "ray_reuse_p95_s": C.pct(lat, 0.95),
            "local_reuse_median_s": statistics.median(local), "pool": {k: snap[k] for k in ("started", "reused", "acquires")}}


# ---------------------------------------------------------------------- WebShop memory
class ShopWorker:
    """A Ray actor standing for one agent-loop worker: runs one WebShop episode with its manager."""

    def pid(self) -> int:
        return os.getpid()

    async def episode(self, shared: bool) -> dict[str, Any]:
        import gymnasium

        import agentfly_gym  # noqa: F401
        from agentfly_gym.resources import ResourceManager
        from agentfly_gym.resources.ray import RayResourceManager

        self.manager = RayResourceManager(global_scope="cluster") if shared else ResourceManager()
        env = gymnasium.make("agentfly/WebShop-v0", manager=self.manager).unwrapped
        t = time.perf_counter()
        await env.areset(seed=0)
        ready = time.perf_counter() - t
        obs, *_ = await env.astep("search[red shoes]")
        server = getattr(env._server, "resource", env._server)  # a typed proxy's resource (a RayResource on Ray)
        host_pid = getattr(server, "pid", os.getpid())  # a local server lives in the worker itself
        self.env = env
        return {"reset_s": ready, "server_pid": host_pid, "obs_chars": len(obs)}

    async def close(self) -> None:
        await self.env.aclose()
        await self.manager.aclose()


async def measure_webshop(workers: int) -> dict[str, Any]:
    import ray

    out: dict[str, Any] = {"workers": workers}
    for mode in ("per_worker", "shared"):
        ws = [ray.remote(ShopWorker).options(num_cpus=0).remote() for _ in range(workers)]
        pids = await asyncio.gather(*(w.pid.remote() for w in ws))
        await asyncio.sleep(1.0)
        before = sum(pss(p) for p in pids)
        t = time.perf_counter()
        eps = await asyncio.gather(*(w.episode.remote(mode == "shared") for w in ws))
        wall = time.perf_counter() - t
        servers = sorted({e["server_pid"] for e in eps})
        procs = sorted(set(pids) | set(servers))
        after = sum(pss(p) for p in procs)
        out[mode] = {"distinct_servers": len(servers),
                     "pss_before_bytes": before, "pss_after_bytes": after, "added_bytes": after - before,
                     "wall_s": wall, "reset_s": [e["reset_s"] for e in eps]}
        print(f"[webshop] {mode}: {len(servers)} server(s), +{(after - before) / 2**20:.0f} MiB PSS, {wall:.1f} s", flush=True)
        await asyncio.gather(*(w.close.remote() for w in ws))
        for w in ws:
            ray.kill(w)
    out["saved_bytes"] = out["per_worker"]["added_bytes"] - out["shared"]["added_bytes"]
    return out


# ---------------------------------------------------------------------- hosting designs on 3 nodes
HOSTINGS = ("node", "instance")
GOAL_MB_PER_INSTANCE = 5.0
GOAL_ACQUIRES_PER_S = 500.0


def ray_worker_pids() -> list[int]:
    """The Ray worker processes (actors', tasks', idle ones) under this process: the local cluster's."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if cmd.startswith("ray::") or "default_worker.py" in cmd:
            out.append(p.pid)
    return out


def cpu_by_process_kind(drivers: list[int]) -> dict[str, float]:
    """CPU seconds (user + system) spent so far by this process's tree, by kind: the pool actors, the host actors,
    the ``drivers`` (pids), Ray's own processes (GCS, raylets, idle workers, ...) and this process."""
    import psutil

    me = psutil.Process()
    out = {"pool_actor": 0.0, "hosts": 0.0, "drivers": 0.0, "ray_system": 0.0, "bench": 0.0}
    for p in [me, *me.children(recursive=True)]:
        try:
            cmd, t = " ".join(p.cmdline()), p.cpu_times()
        except psutil.Error:
            continue
        kind = ("bench" if p.pid == me.pid else "drivers" if p.pid in drivers else "pool_actor"
                if cmd.startswith("ray::PoolActor") else "hosts" if cmd.startswith("ray::ResourceHost") else "ray_system")
        out[kind] += t.user + t.system
    return out


def workers_pss() -> tuple[int, int]:
    """(summed PSS in bytes, number) of the cluster's Ray worker processes."""
    pids = ray_worker_pids()
    return sum(pss(p) for p in pids), len(pids)


async def _settle_pss(seconds: float = 3.0) -> tuple[int, int]:
    await asyncio.sleep(seconds)  # started workers finish importing; idle ones Ray prestarts come up
    return workers_pss()


async def measure_memory(sizes: list[int], instance_max: int) -> dict[str, Any]:
    from agentfly_gym.resources import InProcessSpec, ResourceManager
    from agentfly_gym.resources.ray import RayResourceManager

    cap = max(sizes)
    placement = {"*": {"resources": {"slot": 1}, "scheduling_strategy": "SPREAD"}}
    out: dict[str, Any] = {"sizes": sizes, "instance_max": instance_max, "goal_mb_per_instance": GOAL_MB_PER_INSTANCE}
    # the instance itself: the same kind in a local pool in this process
    spec = InProcessSpec(factory="builtins:dict", max_instances=cap, name="bench-mem-local")
    async with ResourceManager() as local:
        before = pss(os.getpid())
        held = await asyncio.gather(*(local.pool(spec).acquire() for _ in range(cap)))
        await asyncio.sleep(0.5)
        out["local_bytes_per_instance"] = (pss(os.getpid()) - before) / cap
        for r in held:
            await local.pool(spec).release(r)
    for hosting in HOSTINGS:
        spec = InProcessSpec(factory="builtins:dict", max_instances=cap, name=f"bench-mem-{hosting}")
        rows = []
        async with RayResourceManager(placement=placement, hosting=hosting) as m:
            pool = m.pool(spec)
            await pool.attach()
            base, nbase = await _settle_pss()
            held: list[Any] = []
            todo = sizes if hosting == "node" else sorted({n for n in sizes if n < instance_max} | {instance_max}
                                                          | {n for n in sizes if n > instance_max})
            for n in todo:
                if hosting == "instance" and n > instance_max:
                    rows.append({"instances": n, "skipped": f"over --instance-max {instance_max}: {n} Ray worker "
                                                           f"processes of ~75-100 MB (~{n * 0.09:.0f} GB) and minutes "
                                                           "of starts do not fit a shared 2-core machine"})
                    continue
                t = time.perf_counter()
                held += await asyncio.gather(*(pool.acquire(timeout=600) for _ in range(n - len(held))))
                took = time.perf_counter() - t
                await asyncio.gather(*(r.call("get", "k") for r in held))
                total, procs = await _settle_pss()
                snap = await pool.fetch_snapshot()
                prev = next((r for r in reversed(rows) if "skipped" not in r), None)
                marginal = (total - prev["workers_pss_bytes"]) / (n - prev["instances"]) if prev else None
                row = {"instances": n, "workers_pss_bytes": total, "worker_processes": procs, "hosts": snap["hosts"],
                       "marginal_per_instance_bytes": marginal,
                       "nodes": len({i["node_id"] for i in snap["instances"].values()}),
                       "pss_per_instance_bytes": total / n, "added_per_instance_bytes": (total - base) / n,
                       "start_s": took}
                rows.append(row)
                print(f"[memory] {hosting:8s} {n:4d} instances: {procs} worker processes, {row['hosts']} hosts on "
                      f"{row['nodes']} nodes, {total / 2**20:.0f} MiB PSS, {row['pss_per_instance_bytes'] / 2**20:.2f} "
                      f"MiB/instance ({row['added_per_instance_bytes'] / 2**20:.2f} over the empty cluster, "
                      + (f"{marginal / 2**20:.2f} per further instance" if marginal is not None else "first size")
                      + f"), started in {took:.1f} s",
                      flush=True)
            for r in held:
                await pool.release(r)
        out[hosting] = {"baseline_pss_bytes": base, "baseline_processes": nbase, "rows": rows}
        await asyncio.sleep(2.0)  # the pool and its hosts end before the next design is measured
    node_rows = [r for r in out["node"]["rows"] if "skipped" not in r]
    # the goal, at the largest size: the workers' growth per instance, less what the instance itself costs
    out["goal_met"] = bool(node_rows) and (node_rows[-1]["added_per_instance_bytes"]
                                           - out["local_bytes_per_instance"] < GOAL_MB_PER_INSTANCE * 2**20)
    return out


DRIVER = """
import asyncio, json, sys, time, ray
from agentfly_gym.resources import InProcessSpec
from agentfly_gym.resources.ray import RayResourceManager
address, hosting, cap, conc, start_at, seconds, out = sys.argv[1:8]
ray.init(address=address, namespace="afg-bench", log_to_driver=False)
spec = InProcessSpec(factory="builtins:dict", max_instances=int(cap), name=f"bench-tp-{hosting}")
async def main():
    async with RayResourceManager(placement={"*": {"resources": {"slot": 1}}}, hosting=hosting) as m:
        pool = m.pool(spec)
        await pool.attach()
        r = await pool.acquire(timeout=120)
        await pool.release(r)
        await asyncio.sleep(max(0.0, float(start_at) - time.time()))
        end = time.time() + float(seconds)
        lat, done = [], []
        async def loop():
            while time.time() < end:
                t = time.perf_counter()
                r = await pool.acquire(timeout=120)
                lat.append(time.perf_counter() - t)
                done.append(time.time())
                await pool.release(r)
        began = time.time()
        await asyncio.gather(*(loop() for _ in range(int(conc))))
        return lat, done, began
lat, done, began = asyncio.run(main())
json.dump({"latencies": lat, "done_at": done, "began": began}, open(out, "w"))
"""


async def measure_throughput(address: str, drivers: int, conc: int, seconds: float, tmp: Path) -> dict[str, Any]:
    import subprocess

    from agentfly_gym.resources import InProcessSpec
    from agentfly_gym.resources.ray import RayResourceManager

    cap = drivers * conc
    out: dict[str, Any] = {"drivers": drivers, "concurrency": conc, "seconds": seconds, "cap": cap,
                           "goal_acquires_per_s": GOAL_ACQUIRES_PER_S}
    for hosting in HOSTINGS:
        spec = InProcessSpec(factory="builtins:dict", max_instances=cap, name=f"bench-tp-{hosting}")
        async with RayResourceManager(placement={"*": {"resources": {"slot": 1}}}, hosting=hosting) as owner:
            pool = owner.pool(spec)
            await pool.attach()  # this process owns the pool for the whole measurement
            await pool.prewarm(cap)  # every acquisition below reuses an instance (reset on its host)
            start_at = time.time() + 30.0  # the drivers connect to Ray meanwhile (seconds each on 2 cores)
            procs = []
            for i in range(drivers):
                f = tmp / f"{hosting}-{i}.json"
                procs.append((subprocess.Popen([sys.executable, "-c", DRIVER, address, hosting, str(cap), str(conc),
                                                str(start_at), str(seconds), str(f)],
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), f))
            before = await pool.fetch_snapshot()
            await asyncio.sleep(max(0.0, start_at - time.time()))
            pids = [proc.pid for proc, _ in procs]
            cpu0 = cpu_by_process_kind(pids)
            await asyncio.sleep(seconds)
            cpu = {k: v - cpu0[k] for k, v in cpu_by_process_kind(pids).items()}  # over the measured window
            results = []
            for proc, f in procs:
                log, _ = await asyncio.to_thread(proc.communicate, timeout=300)
                if proc.returncode != 0:
                    raise RuntimeError(f"a driver failed: {log[-2000:]}")
                results.append(json.loads(f.read_text()))
            snap = await pool.fetch_snapshot()
        lat = [x for r in results for x in r["latencies"]]
        # counted over the window all drivers were running (a driver that connected late starts late)
        lo = max(r["began"] for r in results)
        hi = min(max(r["done_at"], default=lo) for r in results)
        window = max(hi - lo, 1e-9)
        n = sum(1 for r in results for t in r["done_at"] if lo <= t <= hi)
        out[hosting] = {"acquires": n, "window_s": window, "acquires_per_s": n / window,
                        "acquires_total": len(lat), "latency_median_s": statistics.median(lat),
                        "latency_p95_s": C.pct(lat, 0.95), "hosts": snap["hosts"], "started": snap["started"],
                        "drivers_start_spread_s": lo - min(r["began"] for r in results),
                        # CPU ms per acquire/release cycle by process kind, over the measured window (the rate on a
                        # shared 2-core machine is bounded by the sum; the pool actor, one process, bounds it anywhere)
                        "cpu_ms_per_acquire": {k: v / max(n, 1) * 1e3 for k, v in cpu.items()},
                        # acquisitions (releases, resets) per call that carried them: the batching
                        "acquires_per_call": (snap["acquires"] - before["acquires"])
                        / max(1, snap["acquire_calls"] - before["acquire_calls"]),
                        "releases_per_call": (snap["acquires"] - before["acquires"])
                        / max(1, snap["release_calls"] - before["release_calls"]),
                        "resets_per_call": (snap["reused"] - before["reused"])
                        / max(1, snap["recycle_calls"] - before["recycle_calls"])}
        per = out[hosting]["cpu_ms_per_acquire"]
        print(f"[throughput] {hosting:8s}: {n / window:.0f} acquires/s from {drivers} drivers x {conc} "
              f"(median {statistics.median(lat) * 1e3:.1f} ms, p95 {C.pct(lat, 0.95) * 1e3:.1f} ms; goal >= "
              f"{GOAL_ACQUIRES_PER_S:.0f}/s); CPU ms per acquire: "
              + ", ".join(f"{k} {v:.2f}" for k, v in per.items())
              + f"; per call: {out[hosting]['acquires_per_call']:.1f} acquires, "
              f"{out[hosting]['releases_per_call']:.1f} releases, {out[hosting]['resets_per_call']:.1f} resets",
              flush=True)
    out["goal_met"] = out["node"]["acquires_per_s"] >= GOAL_ACQUIRES_PER_S
    return out


def run_cluster_parts(parts: set[str], args: Any, res: C.Result) -> None:
    """The issue-28 parts, on a local 3-node cluster of their own."""
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    slots = max(max(args.sizes), args.drivers * args.concurrency)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "resources": {"slot": slots}})
    for _ in range(2):
        c.add_node(num_cpus=1, resources={"slot": slots})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="afg-bench", log_to_driver=False)
    try:
        if "memory" in parts:
            res.data["results"]["memory"] = asyncio.run(measure_memory(args.sizes, args.instance_max))
        if "throughput" in parts:
            with tempfile.TemporaryDirectory() as tmp:
                res.data["results"]["throughput"] = asyncio.run(
                    measure_throughput(c.address, args.drivers, args.concurrency, args.seconds, Path(tmp)))
    finally:
        ray.shutdown()
        c.shutdown()


# ---------------------------------------------------------------------- main
def main() -> int:
    C.setup_env_vars()
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--parts", default="overhead,acquire,webshop,memory,throughput",
                   help="comma-separated: overhead, acquire, webshop (one local node); memory, throughput (3 nodes)")
    p.add_argument("--steps", type=int, default=None, help="steps (and calls) per side; default 300 x scale, >= 30")
    p.add_argument("--webshop-workers", type=int, default=4)
    p.add_argument("--sizes", default="8,64,256", help="memory: instances held at once, growing")
    p.add_argument("--instance-max", type=int, default=32,
                   help="memory: the most instances of hosting='instance' (measured there too); default 32")
    p.add_argument("--drivers", type=int, default=4, help="throughput: driver processes")
    p.add_argument("--concurrency", type=int, default=8, help="throughput: acquire loops per driver")
    p.add_argument("--seconds", type=float, default=None, help="throughput: seconds measured; default 8 x scale, >= 3")
    args = p.parse_args()
    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    valid = {"overhead", "acquire", "webshop", "memory", "throughput"}
    if parts - valid:
        p.error(f"unknown part(s) {sorted(parts - valid)}; valid: {', '.join(sorted(valid))}")
    args.sizes = sorted(int(x) for x in args.sizes.split(",") if x.strip())
    args.seconds = args.seconds or max(3.0, 8.0 * args.scale)
    steps = args.steps or C.scaled(300, args.scale, 30)
    res = C.Result("bench_ray_manager", args)
    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (repo, str(Path(__file__).resolve().parent),
                                                           os.environ.get("PYTHONPATH")) if x)
    import ray

    res.data["ray"] = ray.__version__
    res.data["results"] = {}
    if parts & {"memory", "throughput"}:
        run_cluster_parts(parts, args, res)
    if not parts & {"overhead", "acquire", "webshop"}:
        return C.finish(res, plot)
    # address="local": a cluster of its own, never one another process on this machine left running
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        if "overhead" in parts:
            res.data["results"]["overhead"] = asyncio.run(measure_overhead(steps))
            o = res.data["results"]["overhead"]
            print(f"[overhead] Ray actor call floor {o['ray_actor_call_floor_s'] * 1e3:.2f} ms (one Ray call per step, "
                  f"several calls batched into it with RayResource.batch, is the floor of a Ray-hosted step); step median local {o['median_s']['step_local'] * 1e3:.2f} ms, ray "
                  f"{o['median_s']['step_ray'] * 1e3:.2f} ms, added {o['added_per_step_s'] * 1e3:.2f} ms "
                  f"(goal < {GOAL_ADDED_PER_STEP_S * 1e3:.0f} ms: {'met' if o['goal_met'] else 'NOT met'})", flush=True)
        if "acquire" in parts:
            res.data["results"]["acquire"] = asyncio.run(measure_acquire(max(10, steps // 5)))
            a = res.data["results"]["acquire"]
            print(f"[acquire] reuse across processes: median {a['ray_reuse_median_s'] * 1e3:.2f} ms "
                  f"(local {a['local_reuse_median_s'] * 1e3:.3f} ms)", flush=True)
        if "webshop" in parts:
            res.data["results"]["webshop"] = asyncio.run(measure_webshop(args.webshop_workers))
    finally:
        ray.shutdown()
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    d = res.data["results"]
    panels = [k for k in ("overhead", "acquire", "webshop", "memory", "throughput") if k in d]
    fig, axes = C.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.8), squeeze=False)
    for ax, k in zip(axes[0], panels):
        if k == "overhead":
            m = d[k]["median_s"]
            names = ["step local", "step Ray", "call local", "call Ray"]
            vals = [m["step_local"], m["step_ray"], m["call_local"], m["call_ray"]]
            ax.bar(names, [v * 1e3 for v in vals], color=["#4c72b0", "#dd8452"] * 2)
            if d[k].get("ray_actor_call_floor_s") is not None:
                ax.axhline(d[k]["ray_actor_call_floor_s"] * 1e3, color="gray", ls="--", label="empty Ray actor call")
                ax.legend(fontsize=8)
            ax.set_ylabel("median ms")
            ax.set_title(f"per step: +{d[k]['added_per_step_s'] * 1e3:.2f} ms (goal < 2)")
            ax.tick_params(axis="x", labelsize=8)
        elif k == "acquire":
            ax.hist([x * 1e3 for x in d[k]["ray_reuse_s"]], bins=20, color="#dd8452", label="Ray, other process")
            ax.axvline(d[k]["local_reuse_median_s"] * 1e3, color="#4c72b0", label="local median")
            ax.set_xlabel("acquire of a reused instance (ms)")
            ax.set_title(f"median {d[k]['ray_reuse_median_s'] * 1e3:.1f} ms")
            ax.legend(fontsize=8)
        elif k == "memory":
            for hosting, color in zip(HOSTINGS, ("#dd8452", "#4c72b0")):
                rows = [r for r in d[k][hosting]["rows"] if "skipped" not in r]
                ax.plot([r["instances"] for r in rows], [r["pss_per_instance_bytes"] / 2**20 for r in rows], "o-",
                        color=color, label=f"hosting={hosting}")
            ax.axhline(GOAL_MB_PER_INSTANCE, color="gray", ls="--", label="goal (5 MB)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("in-process instances held (3 nodes)")
            ax.set_ylabel("Ray workers' PSS per instance (MiB)")
            ax.set_title("memory per hosted instance")
            ax.legend(fontsize=8)
        elif k == "throughput":
            t = d[k]
            ax.bar([f"hosting={h}" for h in HOSTINGS], [t[h]["acquires_per_s"] for h in HOSTINGS],
                   color=["#dd8452", "#4c72b0"])
            ax.axhline(GOAL_ACQUIRES_PER_S, color="gray", ls="--", label="goal (500/s)")
            ax.set_ylabel("acquires per second")
            ax.set_title(f"{t['drivers']} drivers x {t['concurrency']}, one pool")
            ax.legend(fontsize=8)
        else:
            w = d[k]
            ax.bar(["server per worker", "one shared server"],
                   [w["per_worker"]["added_bytes"] / 2**20, w["shared"]["added_bytes"] / 2**20],
                   color=["#4c72b0", "#dd8452"])
            ax.set_ylabel("MiB added (PSS, workers + servers)")
            ax.set_title(f"WebShop, {w['workers']} workers")
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
