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
"""

from __future__ import annotations

import asyncio
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
        server = env._server
        host_pid = getattr(server, "pid", os.getpid())
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


# ---------------------------------------------------------------------- main
def main() -> int:
    C.setup_env_vars()
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--parts", default="overhead,acquire,webshop", help="comma-separated: overhead, acquire, webshop")
    p.add_argument("--steps", type=int, default=None, help="steps (and calls) per side; default 300 x scale, >= 30")
    p.add_argument("--webshop-workers", type=int, default=4)
    args = p.parse_args()
    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    unknown = parts - {"overhead", "acquire", "webshop"}
    if unknown:
        p.error(f"unknown part(s) {sorted(unknown)}; valid: overhead, acquire, webshop")
    steps = args.steps or C.scaled(300, args.scale, 30)
    res = C.Result("bench_ray_manager", args)
    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (repo, str(Path(__file__).resolve().parent),
                                                           os.environ.get("PYTHONPATH")) if x)
    import ray

    # address="local": a cluster of its own, never one another process on this machine left running
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    res.data["ray"] = ray.__version__
    res.data["results"] = {}
    try:
        if "overhead" in parts:
            res.data["results"]["overhead"] = asyncio.run(measure_overhead(steps))
            o = res.data["results"]["overhead"]
            print(f"[overhead] Ray actor call floor {o['ray_actor_call_floor_s'] * 1e3:.2f} ms; step median local {o['median_s']['step_local'] * 1e3:.2f} ms, ray "
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
    panels = [k for k in ("overhead", "acquire", "webshop") if k in d]
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
