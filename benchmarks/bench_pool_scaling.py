"""Pool scaling: time per batch of N ScienceWorld trajectories as the pool capacity grows.

The analogue of AgentFly's ScienceWorld curve (66.95 min per training step with 1 container
down to 1.86 min with 64): N trajectories are launched at once (runner-style, one asyncio task
each, one shared ResourceManager) and the pool's ``max_instances`` (ScienceWorld JVMs) caps how
many run their environment at a time.  Each turn = the env's expert action (gold path, planned at
load) + a fixed generation time (``--gen-s``) + one env step.  Instances are started before the
clock starts (``manager.prewarm``); the start cost is reported separately.

Ray is not available here (no cluster, not installed), so only the in-process pool of one
machine is measured.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import _common as C


def java_rss_bytes() -> int:
    """Total resident memory (bytes) of the java processes that are children of this process
    (the pool's ScienceWorld JVMs), from /proc."""
    total = 0
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() != "java":
                    continue
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != me:
                    continue
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class ExpertWithLatency:
    """The env's expert, each call lasting ``gen_s`` seconds (a stand-in for generation)."""

    def __init__(self, gen_s: float) -> None:
        self.gen_s = gen_s

    async def act(self, observation: str, info: dict[str, Any], env: Any) -> str:
        t0 = time.monotonic()
        action = await env.expert_action()
        await asyncio.sleep(max(0.0, self.gen_s - (time.monotonic() - t0)))
        return action


async def run_batch(cap: int, n: int, turns: int, gen_s: float, seed: int, chat: Any) -> dict[str, Any]:
    import gymnasium

    from agentfly_gym.envs.scienceworld import ScienceWorldEnv
    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.rollout import run_chain_episode

    async with ResourceManager() as m:
        spec = ScienceWorldEnv.simulator_spec(max_instances=cap)
        t0 = time.monotonic()
        await m.prewarm(spec, cap)
        start_s = time.monotonic() - t0
        policy = ExpertWithLatency(gen_s)

        async def one(k: int):
            env = gymnasium.make("agentfly/ScienceWorld-v0", manager=m, max_instances=cap).unwrapped
            try:
                return await run_chain_episode(env, policy, chat, seed=seed + k, options={"expert": True},
                                               max_turns=turns, trajectory_id=f"t{k}")
            finally:
                await env.aclose()

        t0 = time.monotonic()
        trajs = await asyncio.gather(*(one(k) for k in range(n)))
        wall = time.monotonic() - t0
        rss = java_rss_bytes()
        pool = m.metrics()[spec.key]
    return {"capacity": cap, "wall_s": wall, "prewarm_s": start_s, "java_rss_bytes": rss,
            "steps": sum(t.num_turns for t in trajs), "errors": sum(1 for t in trajs if t.error),
            "env_s": sum(t.timings.get("env", 0) for t in trajs),
            "reset_s": sum(t.timings.get("reset", 0) for t in trajs),
            "acquire_wait_mean_s": pool["acquire_wait_mean"], "started": pool["started"],
            "loadavg": list(os.getloadavg())}


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--capacities", default="1,2,4,8")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--gen-s", type=float, default=0.1)
    args = p.parse_args()
    C.setup_env_vars()
    res = C.Result("bench_pool_scaling", args)
    tiny = args.scale == 0
    caps = [int(c) for c in args.capacities.split(",")] if not tiny else [1, 2]
    n = C.scaled(8, args.scale) if not tiny else 2
    turns = args.turns if not tiny else 2
    repeats = args.repeats or (1 if tiny else 2)
    res.data["config"] = {"trajectories": n, "turns": turns, "gen_s": args.gen_s, "capacities": caps,
                          "repeats": repeats, "ray": "not available on this machine (not installed, no cluster)"}
    with C.skip_on_error(res, "ScienceWorld", trace=False, prefix="") as guard:
        import gymnasium

        import agentfly_gym  # noqa: F401

        gymnasium.make("agentfly/ScienceWorld-v0").close()
    if guard.failed:
        res.save()
        return 0
    from transformers import AutoTokenizer

    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(str(smollm2_dir())))
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in caps}
    for r in range(repeats):
        for cap in (caps if r % 2 == 0 else caps[::-1]):
            out = asyncio.run(run_batch(cap, n, turns, args.gen_s, args.seed, chat))
            out["repeat"] = r
            runs[cap].append(out)
            print(f"  capacity {cap}: {out['wall_s']:.2f} s per batch of {n} (prewarm {out['prewarm_s']:.1f} s, "
                  f"JVM RSS {out['java_rss_bytes'] / 2**20:.0f} MiB, errors {out['errors']})", flush=True)
    med = {c: C.median(x["wall_s"] for x in v) for c, v in runs.items()}
    base = med[caps[0]]
    res.data["median_wall_s"] = med
    res.data["speedup_vs_first"] = {c: base / v if v else None for c, v in med.items()}
    res.data["runs"] = runs
    # where the curve flattens: the first capacity whose doubling gains < 15%
    flat = None
    for a, b in zip(caps, caps[1:]):
        if med[b] > 0.85 * med[a]:
            flat = a
            break
    res.data["flattens_at"] = flat
    res.data = C.clean(res.data)
    res.save()
    plot(res, caps, med, runs, n)
    return 0


def plot(res: C.Result, caps, med, runs, n) -> None:
    fig, ax = C.subplots(figsize=(6.5, 4.2))
    ax.plot(caps, [med[c] for c in caps], "o-", color="#1b9e77", label="measured (median)")
    for c in caps:
        ax.scatter([c] * len(runs[c]), [x["wall_s"] for x in runs[c]], color="#1b9e77", alpha=0.35, s=12)
    ax.plot(caps, [med[caps[0]] * caps[0] / c for c in caps], "--", color="grey", label="linear scaling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(caps)
    ax.set_xticklabels([str(c) for c in caps])
    ax.set_xlabel("pool capacity (ScienceWorld JVMs, max_instances)")
    ax.set_ylabel(f"seconds per batch of {n} trajectories")
    m = res.data["machine"]
    ax.set_title(f"ScienceWorld pool scaling on {m['cores']} cores", fontsize=10)
    ax.legend(fontsize=8)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
