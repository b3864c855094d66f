"""Memory of a long-lived worker over a long run: ALFWorld over every game once, ScienceWorld JVMs over many episodes.

ALFWorld: one fresh interpreter (``--child``) holds one ``ALFWorldSimulator`` and plays every game of
a set once, in order (load, then ``--steps`` admissible commands), reading its resident memory (RSS, bytes) and
the size of TextWorld's process-wide intern cache (``mementos``' ``_memento_cache``, entries) every ``--every``
games.  Two modes:

  bounded    the default simulator (``max_intern_entries=INTERN_ENTRIES``: the intern cache is emptied once a
             load leaves more entries than that)
  unbounded  ``max_intern_entries=None``: TextWorld's own behaviour, the cache is never emptied

Sets: ``sample`` (the games shipped in ``agentfly_gym/samples/alfworld``: valid_seen, valid_unseen and train
splits) and ``full`` (the same splits of the ALFWorld data found by the env: ``$AGENTFLY_GYM_DATA/alfworld``).
Engine results are cached in memory only (``engine_cache="memory"``), so every game is computed as a game never
seen before is (the worst case for the intern cache; a disk cache makes loads faster, not memory smaller).
Reported per run: RSS after the first 50 games, at the end, the largest after the first 50, and the growth per
game after the first 50 (least squares), which extrapolates to sets larger than the run.

ScienceWorld: a fresh interpreter runs ``--jvms`` envs on one manager with ``max_instances=--jvms`` (one JVM
each, ``-Xmx400m``, the env's default) for ``--rounds`` rounds; a round plays ``--episodes`` episodes (spread
over the envs, seeds differing per episode so tasks vary) of up to ``--sw-steps`` gold-path steps each.  After
each round: RSS and PSS of every JVM (the ``java`` processes below the interpreter).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

REPO = Path(__file__).resolve().parents[1]
ALF_SPLITS = ("valid_seen", "valid_unseen", "train")
MODES = {"bounded": "default", "unbounded": None}


# ----------------------------------------------------------------------------- ALFWorld child
def alfworld_games(which: str) -> list[str]:
    """The game files of set ``which`` (``sample`` or ``full``), split by split, in the index's order."""
    from agentfly_gym.envs.alfworld.games import load_index, resolve_alfworld_root

    root = REPO / "agentfly_gym" / "samples" / "alfworld" if which == "sample" else resolve_alfworld_root(None)
    games: list[str] = []
    for split in ALF_SPLITS:
        games += [str(g.game_file) for g in load_index(root, split).games]
    return games


def alfworld_child(which: str, mode: str, n_games: int, steps: int, every: int, bound: int | None) -> dict[str, Any]:
    from agentfly_gym.envs.alfworld import _compat
    from agentfly_gym.envs.alfworld.simulator import INTERN_ENTRIES, ALFWorldSimulator, current_rss

    games = alfworld_games(which)
    total = len(games)
    games = games[:n_games] if n_games > 0 else games
    kwargs: dict[str, Any] = {"engine_cache": "memory"}
    if mode == "unbounded":
        kwargs["max_intern_entries"] = None
    elif bound is not None:
        kwargs["max_intern_entries"] = bound
    sim = ALFWorldSimulator(**kwargs)
    rows = [{"games": 0, "rss": current_rss(), "intern_entries": _compat.intern_cache_size(), "s": 0.0}]
    t0 = time.monotonic()
    for i, g in enumerate(games, 1):
        _obs, info = sim.load(g)
        adm = info["admissible_actions"]
        for k in range(steps):
            if not adm:
                break
            _obs, won, adm, _ = sim.step(adm[(7 * k + i) % len(adm)])
            if won:
                break
        if i % every == 0 or i == len(games):
            rows.append({"games": i, "rss": current_rss(), "intern_entries": _compat.intern_cache_size(),
                         "intern_clears": sim.intern_clears, "s": time.monotonic() - t0})
            print(f"PROGRESS {which} {mode} {i}/{len(games)} rss {rows[-1]['rss'] >> 20} MiB, "
                  f"{rows[-1]['intern_entries']} interned, {rows[-1]['s']:.0f} s", file=sys.stderr, flush=True)
    sim.close()
    return {"set": which, "mode": mode, "games_in_set": total, "games_played": len(games), "steps_per_game": steps,
            "max_intern_entries": kwargs.get("max_intern_entries", INTERN_ENTRIES), "rows": rows,
            "cache_stats": sim.cache_stats}


def summarise(r: dict[str, Any], first: int = 50) -> None:
    """Add the figures the issue asks for to an ALFWorld run ``r`` (in place)."""
    rows = r["rows"]
    at = [x for x in rows if x["games"] >= first]
    if not at:
        return
    base = at[0]
    r["rss_after_first"] = {"games": base["games"], "rss": base["rss"]}
    r["rss_final"] = rows[-1]["rss"]
    r["rss_max_after_first"] = max(x["rss"] for x in at)
    r["growth_after_first_bytes"] = rows[-1]["rss"] - base["rss"]
    r["max_growth_after_first_bytes"] = r["rss_max_after_first"] - base["rss"]
    if len(at) >= 2:  # least-squares slope of RSS over games after the first ones
        xs = [x["games"] for x in at]
        ys = [x["rss"] for x in at]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        den = sum((x - mx) ** 2 for x in xs)
        r["growth_per_game_bytes"] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


# ----------------------------------------------------------------------------- ScienceWorld child
def java_memory() -> list[dict[str, int]]:
    """RSS and PSS (bytes) of every ``java`` process below this interpreter."""
    import psutil

    out = []
    for q in psutil.Process().children(recursive=True):
        try:
            if q.name() != "java":
                continue
            full = q.memory_full_info()
            out.append({"pid": q.pid, "rss": full.rss, "pss": getattr(full, "pss", full.rss)})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


async def scienceworld_child(jvms: int, rounds: int, episodes: int, steps: int) -> dict[str, Any]:
    import gymnasium

    import agentfly_gym  # noqa: F401
    from agentfly_gym.resources import ResourceManager

    out: list[dict[str, Any]] = []
    t0 = time.monotonic()
    played = 0
    async with ResourceManager() as m:
        envs = [gymnasium.make("agentfly/ScienceWorld-v0", manager=m, max_instances=jvms).unwrapped
                for _ in range(jvms)]
        try:
            async def play(e: Any, seed: int) -> int:
                await e.areset(seed=seed)
                n = 0
                for _ in range(steps):
                    _o, _r, term, trunc, _i = await e.astep(await e.expert_action())
                    n += 1
                    if term or trunc:
                        break
                return n

            for rnd in range(1, rounds + 1):
                per_env = [list(range(j, episodes, jvms)) for j in range(jvms)]

                async def worker(e: Any, eps: list[int], rnd: int = rnd) -> int:
                    return sum([await play(e, 1000 * rnd + k) for k in eps])

                n_steps = sum(await asyncio.gather(*(worker(e, eps) for e, eps in zip(envs, per_env))))
                played += episodes
                jm = java_memory()
                out.append({"round": rnd, "episodes": played, "steps": n_steps, "s": time.monotonic() - t0,
                            "jvms": jm, "jvm_rss_total": sum(x["rss"] for x in jm),
                            "jvm_pss_total": sum(x["pss"] for x in jm)})
                print(f"PROGRESS ScienceWorld round {rnd}/{rounds}: {len(jm)} JVMs, RSS "
                      f"{[x['rss'] >> 20 for x in jm]} MiB, {out[-1]['s']:.0f} s", file=sys.stderr, flush=True)
        finally:
            await asyncio.gather(*(e.aclose() for e in envs), return_exceptions=True)
    return {"jvms": jvms, "rounds": rounds, "episodes_per_round": episodes, "max_steps_per_episode": steps,
            "rows": out}


# ----------------------------------------------------------------------------- driver
def run_child(args: list[str], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout, env=dict(os.environ))
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"child {' '.join(args)} exited {p.returncode}")
    return json.loads(lines[-1][7:])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        C.setup_env_vars()
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "alfworld":
            bound = None if rest[5] == "default" else int(rest[5])
            out = alfworld_child(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]), bound)
        else:
            out = asyncio.run(scienceworld_child(*(int(x) for x in rest)))
        print("RESULT " + json.dumps(out), flush=True)
        return 0
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="ALFWorld,ScienceWorld")
    p.add_argument("--sets", default="sample,full", help="ALFWorld game sets: sample, full")
    p.add_argument("--modes", default="bounded,unbounded", help="ALFWorld modes: bounded, unbounded")
    p.add_argument("--games", type=int, default=0, help="ALFWorld: play only the first N games of a set (0: all)")
    p.add_argument("--steps", type=int, default=5, help="ALFWorld: admissible commands played per game")
    p.add_argument("--every", type=int, default=10, help="ALFWorld: read memory every N games")
    p.add_argument("--max-intern-entries", type=int, default=None,
                   help="ALFWorld bounded mode: the bound (default: the simulator's INTERN_ENTRIES)")
    p.add_argument("--jvms", type=int, default=4, help="ScienceWorld: JVMs (envs, max_instances)")
    p.add_argument("--rounds", type=int, default=10, help="ScienceWorld: rounds")
    p.add_argument("--episodes", type=int, default=8, help="ScienceWorld: episodes per round")
    p.add_argument("--sw-steps", type=int, default=40, help="ScienceWorld: most gold-path steps per episode")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one child may take")
    p.add_argument("--name", default="bench_memory_growth", help="result file name (without .json)")
    args = p.parse_args()
    C.setup_env_vars()
    res = C.Result(args.name, args)
    tiny = args.scale == 0
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    if "ALFWorld" in envs:
        res.data.setdefault("envs", {})["ALFWorld"] = []
        for which in [s.strip() for s in args.sets.split(",") if s.strip()]:
            for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
                n = 3 if tiny else args.games
                bound = "default" if args.max_intern_entries is None else str(args.max_intern_entries)
                with C.skip_on_error(res, f"ALFWorld/{which}/{mode}", trace=False, prefix="") as guard:
                    r = run_child(["alfworld", which, mode, str(n), str(args.steps), str(1 if tiny else args.every),
                                   bound], args.timeout)
                if guard.failed:
                    continue
                summarise(r)
                res.data["envs"]["ALFWorld"].append(r)
                rows = r["rows"]
                line = (f"[ALFWorld] {which:6s} {mode:9s}: {r['games_played']} games, RSS {rows[0]['rss'] / 2**20:.0f} "
                        f"-> {rows[-1]['rss'] / 2**20:.0f} MiB, {rows[-1]['intern_entries']} interned")
                if "growth_after_first_bytes" in r:
                    line += (f"; after game {r['rss_after_first']['games']}: {r['growth_after_first_bytes'] / 2**20:+.0f}"
                             f" MiB to the end (max {r['max_growth_after_first_bytes'] / 2**20:+.0f}), "
                             f"{r.get('growth_per_game_bytes', 0) / 2**10:.0f} KiB per game")
                print(line, flush=True)
    if "ScienceWorld" in envs:
        a = ["scienceworld", str(min(2, args.jvms) if tiny else args.jvms), str(1 if tiny else args.rounds),
             str(min(2, args.episodes) if tiny else args.episodes), str(3 if tiny else args.sw_steps)]
        with C.skip_on_error(res, "ScienceWorld", trace=False, prefix="") as guard:
            r = run_child(a, args.timeout)
        if not guard.failed:
            last = r["rows"][-1]
            r["per_jvm_rss_final_bytes"] = last["jvm_rss_total"] / max(1, len(last["jvms"]))
            r["per_jvm_pss_final_bytes"] = last["jvm_pss_total"] / max(1, len(last["jvms"]))
            res.data.setdefault("envs", {})["ScienceWorld"] = r
            print(f"[ScienceWorld] {len(last['jvms'])} JVMs after {last['episodes']} episodes: RSS "
                  f"{last['jvm_rss_total'] / 2**20:.0f} MiB ({r['per_jvm_rss_final_bytes'] / 2**20:.0f} per JVM), PSS "
                  f"{last['jvm_pss_total'] / 2**20:.0f} MiB", flush=True)
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    runs = res.data.get("envs", {}).get("ALFWorld") or []
    sw = res.data.get("envs", {}).get("ScienceWorld")
    if not runs and not sw:
        return
    fig, axes = C.subplots(1, 2, figsize=(11, 4.2))
    for r in runs:
        xs = [x["games"] for x in r["rows"]]
        ys = [x["rss"] / 2**20 for x in r["rows"]]
        axes[0].plot(xs, ys, "o-" if r["mode"] == "bounded" else "s--", ms=3, label=f"{r['set']} {r['mode']}")
    axes[0].set_xlabel("games played (each once)")
    axes[0].set_ylabel("RSS (MiB)")
    axes[0].set_title("ALFWorld: one simulator over every game", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[0].grid(True, alpha=0.3)
    if sw:
        xs = [x["episodes"] for x in sw["rows"]]
        axes[1].plot(xs, [x["jvm_rss_total"] / 2**20 / max(1, len(x["jvms"])) for x in sw["rows"]], "o-",
                     label="RSS per JVM")
        axes[1].plot(xs, [x["jvm_pss_total"] / 2**20 / max(1, len(x["jvms"])) for x in sw["rows"]], "s--",
                     label="PSS per JVM")
        axes[1].legend(fontsize=8)
    axes[1].set_xlabel("episodes played")
    axes[1].set_ylabel("MiB per JVM (-Xmx400m)")
    axes[1].set_title("ScienceWorld JVMs over a run", fontsize=10)
    axes[1].grid(True, alpha=0.3)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
