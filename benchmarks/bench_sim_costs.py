"""Simulator costs: ScienceWorld's step overhead and ALFWorld's resets, ours against the raw packages.

ScienceWorld  One JVM, task ``boil`` variation 0, ``look around`` repeated (a cheap step, so a
              fixed cost shows), interleaved per round: the raw py4j ``server.step`` alone; our
              ``ScienceWorldSimulator.step`` with its four calls (step, score, completion, moves)
              made in the JVM by our Java class (one py4j call, the default); the same calls
              pipelined in one round trip (``java_fold`` off, the previous default); the same with
              ``fold_calls=False`` (four round trips); and the full env, ``await env.astep`` (adds
              the resource thread hop and the base env).  Overhead = median / median(raw) - 1 (goal
              < 5%).  Typical steps: the gold paths of two tasks (with unknown, free, help and
              waiting commands first), replayed after a load per round, raw ``server.step`` vs our
              three step paths in rotated order; overhead = median per-path total / raw's - 1.
ALFWorld      Resets of the same games (valid_unseen, spread over the task types):
              upstream: alfworld 0.4.2's ``AlfredTWEnv(...).init_env(1)`` on a copy of the game
              (as ``fidelity_alfworld.py`` builds it; its ``reset()`` loads the game file), first
              and second reset of each game; ours: ``ALFWorldSimulator.load`` cold (empty cache) in a
              fresh process and in this one after 6 other games (with and without the translation
              worker), revisited by the same simulator, by another simulator (the process's memory)
              and from disk (memory cleared), from a cache pre-computed by ``precompute_engine_cache``
              (``agentfly-gym data precompute alfworld``) in a fresh process, and uncached
              (``engine_cache=False``).  Every path's first observation and admissible commands must
              equal the uncached engine's, whose observation must equal upstream's.
              Goals: revisit < 0.3 s, cold < 1 s.
Rollout       The issue's "8 random-policy trajectories of 5 turns" on ALFWorld-v0 (8 at once,
              random admissible commands, seeds 0-7 of valid_unseen): uncached, cold cache, and the
              same 8 games again (a second epoch), plus a GRPO group (8 trajectories of one game).

Writes ``results/bench_sim_costs.json`` and ``.png``.

    python benchmarks/bench_sim_costs.py              # 1000 steps, 6 games
    python benchmarks/bench_sim_costs.py --scale 0    # smoke run
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# --------------------------------------------------------------------------------------- ScienceWorld
async def bench_scienceworld(n: int) -> dict[str, Any]:
    import gymnasium

    from agentfly_gym.resources import ResourceManager

    series: dict[str, list[float]] = {"raw_server_step": [], "sim_step_java": [], "sim_step_pipelined": [],
                                      "sim_step_unfolded": [], "env_astep_java": []}
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/ScienceWorld-v0", manager=m, max_instances=1,
                             max_episode_steps=None).unwrapped
        await env.areset(seed=0, options={"task_name": "boil", "variation": 0})
        sim = env._sim.resource.obj  # the ScienceWorldSimulator the env holds for this episode
        server = sim._server
        assert sim.fold_calls
        assert sim.java_fold
        order = list(series)
        warmup = max(5, n // 20)  # the first rounds warm the JVM's JIT
        for i in range(n + warmup):
            random.Random(i).shuffle(order)  # rotate the order inside each round
            for name in order:
                t0 = time.perf_counter()
                if name == "raw_server_step":
                    server.step("look around")
                elif name == "sim_step_java":
                    sim.step("look around")
                elif name in ("sim_step_pipelined", "sim_step_unfolded"):
                    sim.java_fold, sim.fold_calls = False, name == "sim_step_pipelined"
                    try:
                        t0 = time.perf_counter()
                        sim.step("look around")
                    finally:
                        sim.java_fold = sim.fold_calls = True
                else:
                    _obs, _r, term, trunc, _info = await env.astep("look around")
                dt = time.perf_counter() - t0
                if i >= warmup:
                    series[name].append(dt)
                if name == "env_astep_java" and (term or trunc):  # the env's episode limit
                    await env.areset(seed=0, options={"task_name": "boil", "variation": 0})
                    sim = env._sim.resource.obj
                    server = sim._server
        await env.aclose()
    raw = _median(series["raw_server_step"])
    summary = {f"{k}_median_ms": 1e3 * _median(v) for k, v in series.items()}
    summary.update({f"{k}_overhead_vs_raw": _median(v) / raw - 1 for k, v in series.items() if k != "raw_server_step"})
    summary["loadavg_after_look_around"] = list(os.getloadavg())
    return {"summary": summary, "raw_s": series}


TYPICAL = [("find-non-living-thing", 0, "easy"), ("chemistry-mix-paint-secondary-color", 27, "")]
TYPICAL_EXTRA = ["fly to the moon", "inventory", "look at the ceiling", "help", "wait1"]


def bench_scienceworld_typical(rounds: int) -> dict[str, Any]:
    """Gold-path steps (16-100 ms each upstream): raw ``server.step`` vs our three step paths."""
    from agentfly_gym.envs.scienceworld import ScienceWorldSimulator

    paths = {"raw_server_step": None, "sim_step_java": (True, True), "sim_step_pipelined": (False, True),
             "sim_step_unfolded": (False, False)}
    sim = ScienceWorldSimulator()
    assert sim.java_fold
    out: dict[str, Any] = {}
    try:
        for task, variation, simplification in TYPICAL:
            sim.load(task, variation, simplification, gold=True)
            actions = TYPICAL_EXTRA + sim.gold_actions()
            totals: dict[str, list[float]] = {k: [] for k in paths}
            per_step: dict[str, list[list[float]]] = {k: [] for k in paths}
            order = list(paths)
            for r in range(rounds + 1):  # round 0 warms the JIT for these actions
                random.Random(r).shuffle(order)
                for name in order:
                    sim.load(task, variation, simplification)
                    times = []
                    for a in actions:
                        if paths[name] is None:
                            t0 = time.perf_counter()
                            sim._server.step(a)
                        else:
                            sim.java_fold, sim.fold_calls = paths[name]
                            try:
                                t0 = time.perf_counter()
                                sim.step(a)
                            finally:
                                sim.java_fold = sim.fold_calls = True
                        times.append(time.perf_counter() - t0)
                    if r:
                        totals[name].append(sum(times))
                        per_step[name].append(times)
            raw = _median(totals["raw_server_step"])
            summary = {"steps": len(actions)}
            summary.update({f"{k}_median_total_ms": 1e3 * _median(v) for k, v in totals.items()})
            summary.update({f"{k}_overhead_vs_raw": _median(v) / raw - 1 for k, v in totals.items()
                            if k != "raw_server_step"})
            summary["raw_step_median_ms"] = 1e3 * _median([t for ts in per_step["raw_server_step"] for t in ts])
            out[f"{task}:{variation}"] = {"summary": summary, "totals_s": totals}
            print(f"  {task}:{variation}: {len(actions)} steps, "
                  + ", ".join(f"{k} {v:.4g}" for k, v in summary.items() if k != "steps"), flush=True)
    finally:
        sim.close()
    out["loadavg_after"] = list(os.getloadavg())
    return out


# --------------------------------------------------------------------------------------- ALFWorld resets
def _games(n: int, seed: int) -> list[Any]:
    from agentfly_gym.envs.alfworld.games import load_index, resolve_alfworld_root

    idx = load_index(resolve_alfworld_root(), "valid_unseen")
    by_type: dict[str, list] = {}
    for g in idx.games:
        by_type.setdefault(g.task_type, []).append(g)
    rng = random.Random(seed)
    picks = []
    while len(picks) < n:
        for t in sorted(by_type):
            if len(picks) < n and by_type[t]:
                picks.append(by_type[t].pop(rng.randrange(len(by_type[t]))))
    return picks


#: Run in a fresh Python process: build a simulator on the given cache folder, time the first load of
#: a game; prints JSON.  The same script serves "cold in a fresh process" (empty folder) and "from a
#: pre-computed disk cache" (a folder that ``precompute_engine_cache`` filled).
_FRESH = """
import json, sys, time
from agentfly_gym.envs.alfworld import ALFWorldSimulator
game, cache, worker = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
sim = ALFWorldSimulator(engine_cache=cache, translation_worker=worker)
t0 = time.perf_counter()
obs, info = sim.load(game)
dt = time.perf_counter() - t0
print(json.dumps({"s": dt, "obs": obs, "admissible": info["admissible_actions"], "stats": sim.cache_stats}))
"""


def _fresh_process_load(game: Any, cache: Path, *, worker: bool = True) -> dict[str, Any]:
    import json
    import subprocess

    r = subprocess.run([sys.executable, "-c", _FRESH, str(game), str(cache), "1" if worker else "0"],
                       capture_output=True, text=True, timeout=600, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_alfworld_resets(games: list[Any], work: Path, others: list[Any] | None = None) -> dict[str, Any]:
    """Per game: upstream first/second reset; ours cold in a fresh process, cold after ``others`` were
    loaded in this process (with and without the translation worker), revisited (same simulator,
    another simulator, from disk), from a pre-computed disk cache in a fresh process, and uncached.
    Every path's first observation and admissible commands are compared with the uncached engine's and
    the observation with upstream's."""
    from fidelity_alfworld import Reference, make_reference_copy

    from agentfly_gym.envs.alfworld import ALFWorldSimulator
    from agentfly_gym.envs.alfworld.engine_cache import EngineCache
    from agentfly_gym.envs.alfworld.precompute import precompute_engine_cache

    def timed(f: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        r = f()
        return r, time.perf_counter() - t0

    uncached = ALFWorldSimulator(engine_cache=False)
    cache, cache_nw = work / "engine-cache", work / "engine-cache-no-worker"
    warm = ALFWorldSimulator(engine_cache=work / "warm-cache")
    for g in others or []:  # "a process that has loaded other games before"
        warm.load(g.game_file)
    # the pre-computed cache, as `agentfly-gym data precompute alfworld` fills it (in its own folder)
    pre = work / "precomputed-cache"
    t0 = time.perf_counter()
    filled = precompute_engine_cache(game_files=[g.game_file for g in games], cache_dir=pre, progress=False)
    assert filled["computed"] == len(games), filled
    precompute_s = time.perf_counter() - t0
    EngineCache.clear_memory()
    rows = []
    for k, g in enumerate(games):
        row: dict[str, Any] = {"task_id": g.task_id, "task_type": g.task_type}
        ref = Reference(make_reference_copy(g.game_file, work / f"ref{k}" / "trial", patch=True).parent)
        (obs_up, _), row["upstream_first_s"] = timed(ref.reset)
        (_, _), row["upstream_again_s"] = timed(ref.reset)
        ref.close()
        (obs_unc, info_unc), row["ours_uncached_s"] = timed(lambda: uncached.load(g.game_file))
        want = (obs_unc, info_unc["admissible_actions"])
        got = {}
        fresh = _fresh_process_load(g.game_file, work / f"fresh{k}")
        row["ours_cold_fresh_process_s"] = fresh["s"]
        got["cold_fresh_process"] = (fresh["obs"], fresh["admissible"])
        a, b = ALFWorldSimulator(engine_cache=cache), ALFWorldSimulator(engine_cache=cache)
        nw = ALFWorldSimulator(engine_cache=cache_nw, translation_worker=False)
        # both cold (memory cleared); the one run second finds this game's grammar snippets parsed, so the
        # order alternates per game
        for name in (("cold", "cold_no_worker") if k % 2 == 0 else ("cold_no_worker", "cold")):
            EngineCache.clear_memory()
            sim = a if name == "cold" else nw
            (o, i), row[f"ours_{name}_s"] = timed(lambda: sim.load(g.game_file))  # noqa: B023 - called at once
            got[name] = (o, i["admissible_actions"])
        (o, i), row["ours_same_simulator_s"] = timed(lambda: a.load(g.game_file))
        got["same_simulator"] = (o, i["admissible_actions"])
        (o, i), row["ours_other_simulator_s"] = timed(lambda: b.load(g.game_file))
        got["other_simulator"] = (o, i["admissible_actions"])
        EngineCache.clear_memory()
        c = ALFWorldSimulator(engine_cache=cache)
        (o, i), row["ours_from_disk_s"] = timed(lambda: c.load(g.game_file))
        got["from_disk"] = (o, i["admissible_actions"])
        pre_run = _fresh_process_load(g.game_file, pre)
        row["ours_precomputed_fresh_process_s"] = pre_run["s"]
        got["precomputed_fresh_process"] = (pre_run["obs"], pre_run["admissible"])
        row["precomputed_was_disk_hit"] = pre_run["stats"]["disk_hits"] == 1
        row["same_observation_as_upstream"] = obs_unc == obs_up
        row["paths_differing_from_uncached"] = sorted(name for name, v in got.items() if v != want)
        rows.append(row)
        print(f"  {g.task_id[:60]}: upstream {row['upstream_first_s']:.2f}/{row['upstream_again_s']:.2f} s, ours cold "
              f"fresh {row['ours_cold_fresh_process_s']:.2f} / after others {row['ours_cold_s']:.2f} (no worker "
              f"{row['ours_cold_no_worker_s']:.2f}), revisit {row['ours_same_simulator_s']:.3f}/"
              f"{row['ours_other_simulator_s']:.3f}/{row['ours_from_disk_s']:.3f}, precomputed "
              f"{row['ours_precomputed_fresh_process_s']:.3f} s, uncached {row['ours_uncached_s']:.2f} s", flush=True)
    cols = [k for k in rows[0] if k.endswith("_s")]
    summary: dict[str, Any] = {f"{k[:-2]}_median_s": _median([r[k] for r in rows]) for k in cols}
    summary.update({f"{k[:-2]}_max_s": max(r[k] for r in rows) for k in cols})
    summary["cold_vs_upstream_first"] = summary["ours_cold_median_s"] / summary["upstream_first_median_s"]
    summary["cold_fresh_vs_upstream_first"] = (summary["ours_cold_fresh_process_median_s"]
                                               / summary["upstream_first_median_s"])
    summary["revisit_vs_upstream_again"] = summary["ours_other_simulator_median_s"] / summary["upstream_again_median_s"]
    summary["cold_games_under_1s"] = sum(r["ours_cold_s"] < 1.0 for r in rows)
    summary["cold_fresh_games_under_1s"] = sum(r["ours_cold_fresh_process_s"] < 1.0 for r in rows)
    summary["precompute_s_per_game"] = precompute_s / len(games)
    summary["all_observations_equal"] = all(r["same_observation_as_upstream"] and not r["paths_differing_from_uncached"]
                                            for r in rows)
    summary["all_precomputed_were_disk_hits"] = all(r["precomputed_was_disk_hit"] for r in rows)
    return {"summary": summary, "games": rows}


# --------------------------------------------------------------------------------------- ALFWorld rollout
async def _rollout(games: list[Any], engine_cache: Any, seed: int, turns: int = 5) -> dict[str, Any]:
    from agentfly_gym.envs.alfworld import ALFWorldEnv
    from agentfly_gym.resources import ResourceManager

    async def one(m: Any, k: int, game: Any) -> dict[str, float]:
        env = ALFWorldEnv(manager=m, split="valid_unseen")
        spec = env.simulator_spec
        env.simulator_spec = dataclasses.replace(spec, kwargs={**spec.factory_kwargs, "engine_cache": engine_cache})
        rng = random.Random(seed * 100 + k)
        t0 = time.perf_counter()
        _obs, info = await env.areset(options={"task_id": game.task_id})
        reset_s = time.perf_counter() - t0
        for _ in range(turns):
            _obs, _r, term, trunc, info = await env.astep(rng.choice(info["admissible_actions"]))
            if term or trunc:
                break
        await env.aclose()
        return {"reset_s": reset_s, "trajectory_s": time.perf_counter() - t0}

    async with ResourceManager() as m:
        t0 = time.perf_counter()
        per = await asyncio.gather(*(one(m, k, g) for k, g in enumerate(games)))
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "reset_median_s": _median([p["reset_s"] for p in per]),
            "reset_max_s": max(p["reset_s"] for p in per), "trajectories": per}


async def bench_alfworld_rollout(games: list[Any], work: Path, seed: int, *, full: bool = True) -> dict[str, Any]:
    from agentfly_gym.envs.alfworld.engine_cache import EngineCache

    out = {}
    cache = str(work / "rollout-cache")
    # the uncached runs are not first: the resets part has already warmed the process
    EngineCache.clear_memory()
    out["cold_cache"] = await _rollout(games, cache, seed)
    out["second_epoch"] = await _rollout(games, cache, seed)
    EngineCache.clear_memory()
    out["uncached"] = await _rollout(games, False, seed)
    if full:  # (the smoke size stops here)
        EngineCache.clear_memory()
        out["second_epoch_from_disk"] = await _rollout(games, cache, seed)
        group = [games[0]] * len(games)
        EngineCache.clear_memory()
        out["grpo_group_cold_cache"] = await _rollout(group, str(work / "group-cache"), seed)
        EngineCache.clear_memory()
        out["grpo_group_uncached"] = await _rollout(group, False, seed)
    for k, v in out.items():
        print(f"  rollout {k}: wall {v['wall_s']:.1f} s, reset median {v['reset_median_s']:.2f} s", flush=True)
    return {"summary": {f"{k}_wall_s": v["wall_s"] for k, v in out.items()}, "runs": out}


# --------------------------------------------------------------------------------------- main
def main() -> int:
    p = C.base_parser(__doc__.split("\n")[0])
    p.add_argument("--parts", default="scienceworld,resets,rollout")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    C.setup_env_vars()
    res = C.Result("bench_sim_costs", args)
    res.data["config"] = {"parts": sorted(parts)}
    res.data["results"] = {}
    n_steps = C.scaled(1000, args.scale, 20)
    n_rounds = C.scaled(30, args.scale, 1)
    n_games = C.scaled(6, args.scale, 1)
    n_traj = C.scaled(8, args.scale, 2) if args.scale < 1 else 8
    res.data["config"].update({"steps": n_steps, "typical_rounds": n_rounds, "games": n_games,
                               "trajectories": n_traj, "turns": 5})
    with tempfile.TemporaryDirectory(prefix="bench-sim-costs-") as tmp:
        work = Path(tmp)
        if "scienceworld" in parts:
            print("ScienceWorld step overhead ...", flush=True)
            res.data["results"]["ScienceWorld"] = asyncio.run(bench_scienceworld(n_steps))
            print("  ", {k: v if isinstance(v, list) else round(v, 4)
                         for k, v in res.data["results"]["ScienceWorld"]["summary"].items()}, flush=True)
            print("ScienceWorld typical steps ...", flush=True)
            res.data["results"]["ScienceWorld_typical"] = bench_scienceworld_typical(n_rounds)
        if "resets" in parts:
            print("ALFWorld resets ...", flush=True)
            picks = _games(2 * n_games, args.seed)  # the second half: "other games" loaded first
            res.data["results"]["ALFWorld_resets"] = bench_alfworld_resets(picks[:n_games], work, picks[n_games:])
        if "rollout" in parts:
            print("ALFWorld rollout ...", flush=True)
            res.data["results"]["ALFWorld_rollout"] = asyncio.run(
                bench_alfworld_rollout(_games(n_traj, args.seed + 1), work, args.seed, full=args.scale > 0))

    def plot(r: C.Result) -> None:
        data = r.data["results"]
        fig, axes = C.subplots(1, 3, figsize=(16, 4.8))
        if "ScienceWorld" in data:
            s = data["ScienceWorld"]["summary"]
            names = ["raw_server_step", "sim_step_java", "sim_step_pipelined", "sim_step_unfolded", "env_astep_java"]
            axes[0].bar(range(5), [s[f"{n}_median_ms"] for n in names], color=["grey", "C0", "C1", "C3", "C2"])
            axes[0].set_xticks(range(5), ["raw\nserver.step", "sim.step\nJava fold", "sim.step\npipelined",
                                          "sim.step\n4 round trips", "env.astep\nJava fold"], fontsize=8)
            axes[0].set_ylabel("median ms per step")
            axes[0].set_title("ScienceWorld 'look around'")
        if "ALFWorld_resets" in data:
            s = data["ALFWorld_resets"]["summary"]
            keys = ["upstream_first", "upstream_again", "ours_uncached", "ours_cold_no_worker",
                    "ours_cold_fresh_process", "ours_cold", "ours_same_simulator", "ours_other_simulator", "ours_from_disk",
                    "ours_precomputed_fresh_process"]
            axes[1].bar(range(len(keys)), [s[f"{k}_median_s"] for k in keys],
                        color=["grey", "grey", "C1", "C1", "C0", "C0", "C2", "C2", "C2", "C2"])
            axes[1].errorbar(range(len(keys)), [s[f"{k}_median_s"] for k in keys],
                             yerr=[[0] * len(keys), [s[f"{k}_max_s"] - s[f"{k}_median_s"] for k in keys]],
                             fmt="none", ecolor="k", capsize=3)
            axes[1].axhline(1.0, ls="--", c="C3", lw=1)
            axes[1].axhline(0.3, ls=":", c="C3", lw=1)
            axes[1].set_xticks(range(len(keys)), [k.replace("_", "\n") for k in keys], fontsize=8)
            axes[1].set_ylabel("reset s (median, bar to max)")
            axes[1].set_title("ALFWorld reset (goals: cold < 1 s, revisit < 0.3 s)")
        if "ALFWorld_rollout" in data:
            s = {k: v for k, v in data["ALFWorld_rollout"]["summary"].items() if v is not None}
            axes[2].bar(range(len(s)), list(s.values()), color="C0")
            axes[2].set_xticks(range(len(s)), [k[:-7].replace("_", "\n") for k in s], fontsize=8)
            axes[2].set_ylabel("wall s")
            axes[2].set_title("ALFWorld: 8 random trajectories x 5 turns")
        C.save_figure(r, fig)

    return C.finish(res, plot)


if __name__ == "__main__":
    sys.exit(main())
