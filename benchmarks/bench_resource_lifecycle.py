"""Resource lifecycle cost: a resource per turn vs per rollout (reuse) vs a pre-warmed pool.

N trajectories of T turns each, C in flight.  Every turn acquires the resource, does one
small piece of work on it (a container ``exec``; a Stockfish move) and waits a fixed
"generation" time; the trajectory's time in acquire / release (start and reset included,
as the pool does them on the acquisition path) is measured and compared with its wall time.

  per_turn     a fresh resource every turn (``max_uses=1``: each acquisition starts a new
               instance, each release stops it): what a rollout without a resource layer does.
  per_rollout  one resource per rollout scope, reused by all its turns (``scope.acquire`` of
               the same spec returns the same live instance); instances go back to the pool
               and are reset when the next rollout takes them.  No pre-warming.
  warm_pool    per_rollout plus ``min_idle = C``: the pool starts C instances before the
               rollouts begin (``manager.prewarm``) and keeps C idle ahead of demand.

Backends: the real Docker engine (``scripts/docker-engine.sh start``), the daemon-less
bubblewrap sandbox, and an in-process resource (Stockfish, ``InProcessSpec``).  A backend that
cannot run here is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from typing import Any

import _common as C

MODES = ("per_turn", "per_rollout", "warm_pool")


def make_spec(backend: str, capacity: int, mode: str) -> Any:
    from agentfly_gym.resources.spec import ContainerSpec

    extra = {"max_uses": 1} if mode == "per_turn" else {}
    if mode == "warm_pool":
        extra["min_idle"] = capacity
    if backend == "docker":
        return ContainerSpec(image="agentfly/base:latest", backend="docker", cpus=0.5, memory="256m",
                             max_instances=capacity, name=f"bench-docker-{mode}", **extra)
    if backend == "sandbox":
        return ContainerSpec(image="host", backend="sandbox", cpus=0.5, memory="256m", max_instances=capacity,
                             name=f"bench-sandbox-{mode}", **extra)
    from agentfly_gym.envs.chess.engine import engine_spec, find_stockfish

    spec = engine_spec(find_stockfish(), max_instances=capacity)
    return dataclasses.replace(spec, name=f"bench-stockfish-{mode}", **extra)


async def work(backend: str, res: Any) -> None:
    if backend == "inprocess":
        import chess

        from agentfly_gym.envs.chess.engine import EngineProxy

        await EngineProxy(res).play(chess.Board(), depth=4)
    else:
        r = await res.exec(["sh", "-c", "echo ok > /tmp/turn && cat /tmp/turn"], timeout=30)
        if r.exit_code != 0:
            raise RuntimeError(f"exec failed: {r}")


async def run_mode(backend: str, mode: str, n: int, turns: int, conc: int, gen_s: float) -> dict[str, Any]:
    from agentfly_gym.resources import ResourceManager

    spec = make_spec(backend, conc, mode)
    async with ResourceManager() as m:
        if mode == "warm_pool":
            t0 = time.monotonic()
            await m.prewarm(spec, conc)
            prewarm_s = time.monotonic() - t0
        else:
            prewarm_s = 0.0
        sem = asyncio.Semaphore(conc)
        recs: list[dict[str, Any]] = []

        async def trajectory(k: int) -> None:
            async with sem:
                rec = {"acquire": [], "release": [], "work": [], "wall": 0.0}
                t_start = time.monotonic()
                scope = m.scope(f"{mode}-{k}")
                try:
                    for _t in range(turns):
                        if mode == "per_turn":
                            scope = m.scope(f"{mode}-{k}-{_t}")
                        t0 = time.monotonic()
                        res = await scope.acquire(spec)
                        rec["acquire"].append(time.monotonic() - t0)
                        t0 = time.monotonic()
                        await work(backend, res)
                        rec["work"].append(time.monotonic() - t0)
                        await asyncio.sleep(gen_s)  # the policy's generation
                        if mode == "per_turn":
                            t0 = time.monotonic()
                            await scope.aclose()
                            rec["release"].append(time.monotonic() - t0)
                finally:
                    if mode != "per_turn":
                        t0 = time.monotonic()
                        await scope.aclose()
                        rec["release"].append(time.monotonic() - t0)
                rec["wall"] = time.monotonic() - t_start
                recs.append(rec)

        t0 = time.monotonic()
        await asyncio.gather(*(trajectory(k) for k in range(n)))
        wall = time.monotonic() - t0
        pool = m.metrics()
    lifecycle = [sum(r["acquire"]) + sum(r["release"]) for r in recs]
    first = [r["acquire"][0] for r in recs]
    later = [a for r in recs for a in r["acquire"][1:]]
    pm = next(iter(pool.values()), {})
    return {
        "backend": backend, "mode": mode, "wall_s": wall, "prewarm_s": prewarm_s,
        "trajectory_wall_s_median": C.median(r["wall"] for r in recs),
        "lifecycle_s_per_trajectory_median": C.median(lifecycle),
        "lifecycle_share_median": C.median(lc / r["wall"] for lc, r in zip(lifecycle, recs)),
        "first_acquire_s_median": C.median(first), "first_acquire_s_max": max(first),
        "later_acquire_s_median": C.median(later) if later else None,
        "release_s_median": C.median(x for r in recs for x in r["release"]),
        "work_s_median": C.median(x for r in recs for x in r["work"]),
        "started": pm.get("started"), "reused": pm.get("reused"), "start_time_mean_s": pm.get("start_time_mean"),
        "reset_time_mean_s": pm.get("reset_time_mean"), "acquire_wait_mean_s": pm.get("acquire_wait_mean"),
        "raw": recs,
    }


def available(backend: str) -> str | None:
    import shutil

    if backend == "docker":
        try:
            import docker

            docker.from_env(timeout=5).ping()
        except Exception as e:  # noqa: BLE001
            return f"no Docker engine answers ({type(e).__name__}: {e}); start one with scripts/docker-engine.sh start"
        try:
            docker.from_env(timeout=5).images.get("agentfly/base:latest")
        except Exception:  # noqa: BLE001
            return "image agentfly/base:latest is missing (agentfly-gym images build)"
        return None
    if backend == "sandbox":
        return None if shutil.which("bwrap") else "bubblewrap (bwrap) is not installed"
    try:
        from agentfly_gym.envs.chess.engine import find_stockfish

        find_stockfish()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="docker,sandbox,inprocess")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--gen-s", type=float, default=0.1, help="simulated generation seconds per turn")
    args = p.parse_args()
    C.setup_env_vars()
    res = C.Result("bench_resource_lifecycle", args)
    tiny = args.scale == 0
    conc = 2 if tiny else args.concurrency
    n = C.scaled(2 * conc, args.scale, minimum=conc) if not tiny else 2
    turns = 2 if tiny else args.turns
    repeats = args.repeats or (1 if tiny else 2)
    res.data["config"] = {"trajectories": n, "turns": turns, "concurrency": conc, "gen_s": args.gen_s,
                          "repeats": repeats}
    res.data["results"] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        why = available(backend)
        if why:
            res.skip(backend, why)
            continue
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        with C.skip_on_error(res, backend) as guard:
            for r in range(repeats):
                order = list(MODES[r % 3:] + MODES[: r % 3])
                for mode in order:
                    out = asyncio.run(run_mode(backend, mode, n, turns, conc, args.gen_s))
                    out["repeat"] = r
                    runs[mode].append(out)
                    print(f"  {backend:9s} {mode:11s} rep {r}: wall {out['wall_s']:.2f} s, lifecycle/traj "
                          f"{out['lifecycle_s_per_trajectory_median']:.3f} s ({100 * out['lifecycle_share_median']:.1f}%),"
                          f" first acquire {out['first_acquire_s_median'] * 1e3:.1f} ms, later acquire "
                          f"{(out['later_acquire_s_median'] or 0) * 1e6:.0f} us", flush=True)
        if guard.failed:
            continue
        keys = ("wall_s", "lifecycle_s_per_trajectory_median", "lifecycle_share_median", "first_acquire_s_median",
                "first_acquire_s_max", "later_acquire_s_median", "release_s_median", "work_s_median",
                "start_time_mean_s", "reset_time_mean_s")
        res.data["results"][backend] = {
            "median": {m: {k: C.median(x[k] for x in v) for k in keys} for m, v in runs.items()},
            "runs": runs}
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    data = res.data["results"]
    if not data:
        return
    backends = list(data)
    fig, axes = C.subplots(1, 2, figsize=(11, 4.2))
    colors = {"per_turn": "#d95f02", "per_rollout": "#7570b3", "warm_pool": "#1b9e77"}
    w = 0.26
    for j, m in enumerate(MODES):
        xs = [i + (j - 1) * w for i in range(len(backends))]
        life = [(data[b]["median"][m]["lifecycle_s_per_trajectory_median"] or 0) for b in backends]
        share = [100 * (data[b]["median"][m]["lifecycle_share_median"] or 0) for b in backends]
        axes[0].bar(xs, life, w, color=colors[m], label=m)
        axes[1].bar(xs, share, w, color=colors[m], label=m)
        for x, v in zip(xs, share):
            axes[1].text(x, v + 0.5, f"{v:.1f}", ha="center", fontsize=7)
    axes[0].set_ylabel("acquire+release seconds per trajectory (median)")
    axes[0].set_yscale("symlog", linthresh=1e-3)
    axes[1].set_ylabel("share of trajectory wall time (%)")
    C.label_bars(axes, backends)
    cfg = res.data["config"]
    fig.suptitle(f"Resource lifecycle: {cfg['trajectories']} trajectories x {cfg['turns']} turns, "
                 f"{cfg['concurrency']} concurrent, {cfg['gen_s']} s generation per turn", fontsize=10)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
