"""Per-step overhead of our env over the raw simulator call, measured interleaved in one run.

  ScienceWorld  ours: ``await env.astep("look around")`` (base env + resource thread hop + the
                simulator's step, score, completion and move-count calls); raw: the py4j
                ``server.step("look around")`` alone, and raw+reward: the same four py4j calls
                our step needs for its reward and flags, called directly.  Same JVM.
  ALFWorld      ours: ``await env.astep("look")``; raw: the PddlEnv (with ALFWorld's demangler)
                ``step("look")`` on the same simulator object.
  Chess         ours: a play-mode step (agent move + Stockfish reply at depth ``--depth``);
                raw: ``board.push(move)`` + python-chess ``SimpleEngine.play`` at the same depth,
                Threads 1, Hash 16 MiB, on its own Stockfish.

Overhead = median(ours) / median(raw) - 1.  Goal: < 5%.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import _common as C


async def bench_scienceworld(n: int) -> dict[str, Any]:
    import gymnasium

    from agentfly_gym.resources import ResourceManager

    ours, raw, raw_reward = [], [], []
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/ScienceWorld-v0", manager=m, max_instances=1,
                             max_episode_steps=None).unwrapped
        await env.areset(seed=0, options={"task_name": "boil", "variation": 0})
        sim = env._sim.resource.obj  # the ScienceWorldSimulator (the env holds it for the episode)
        server = sim._server
        for i in range(n):
            t0 = time.perf_counter()
            await env.astep("look around")
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            server.step("look around")
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            server.step("look around")
            server.getScore()
            server.getCompleted()
            server.getNumMoves()
            raw_reward.append(time.perf_counter() - t0)
        await env.aclose()
    return {"ours_s": ours, "raw_s": raw, "raw_with_reward_calls_s": raw_reward}


async def bench_alfworld(n: int) -> dict[str, Any]:
    import gymnasium

    from agentfly_gym.resources import ResourceManager

    ours, raw = [], []
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/ALFWorld-v0", manager=m, max_instances=1, max_episode_steps=None).unwrapped
        await env.areset(seed=0)
        pddl = env._sim.resource.obj._env  # the simulator's PddlEnv (with ALFWorld's demangler)
        for i in range(n):
            t0 = time.perf_counter()
            _o, _r, te, tr, _i = await env.astep("look")
            ours.append(time.perf_counter() - t0)
            if te or tr:
                await env.areset(seed=0)
                pddl = env._sim.resource.obj._env
            t0 = time.perf_counter()
            pddl.step("look")
            raw.append(time.perf_counter() - t0)
        await env.aclose()
    return {"ours_s": ours, "raw_s": raw}


async def bench_chess(n: int, depth: int) -> dict[str, Any]:
    import chess
    import chess.engine
    import gymnasium

    from agentfly_gym.envs.chess.engine import find_stockfish
    from agentfly_gym.resources import ResourceManager

    path = find_stockfish()
    ours, raw = [], []
    eng = await asyncio.to_thread(chess.engine.SimpleEngine.popen_uci, path)
    try:
        await asyncio.to_thread(eng.configure, {"Threads": 1, "Hash": 16})
        async with ResourceManager() as m:
            env = gymnasium.make("agentfly/Chess-v0", manager=m, mode="play", skill_level=None, engine_depth=depth,
                                 max_instances=1).unwrapped
            await env.areset(seed=0, options={"agent_color": "white"})
            board = chess.Board()
            while len(ours) < n:
                move = sorted(m_.uci() for m_ in env.board.legal_moves)[0]
                t0 = time.perf_counter()
                _o, _r, te, tr, _i = await env.astep(move)
                ours.append(time.perf_counter() - t0)
                if te or tr:
                    await env.areset(seed=0, options={"agent_color": "white"})
                rmove = sorted(m_.uci() for m_ in board.legal_moves)[0]
                t0 = time.perf_counter()
                board.push(chess.Move.from_uci(rmove))
                if not board.is_game_over(claim_draw=True):
                    reply = eng.play(board, chess.engine.Limit(depth=depth)).move
                    board.push(reply)
                raw.append(time.perf_counter() - t0)
                if board.is_game_over(claim_draw=True):
                    board = chess.Board()
            await env.aclose()
    finally:
        await asyncio.to_thread(eng.quit)
    return {"ours_s": ours, "raw_s": raw}


def summarize(d: dict[str, Any], warmup: int) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        v = v[warmup:]
        out[k.replace("_s", "_median_s")] = C.median(v)
        out[k.replace("_s", "_p90_s")] = C.pct(v, 0.9)
    base = out["raw_median_s"]
    out["overhead_vs_raw"] = out["ours_median_s"] / base - 1 if base else None
    if "raw_with_reward_calls_median_s" in out:
        out["overhead_vs_raw_with_reward_calls"] = out["ours_median_s"] / out["raw_with_reward_calls_median_s"] - 1
    out["ours_minus_raw_median_ms"] = 1e3 * (out["ours_median_s"] - base)
    return out


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="ScienceWorld,ALFWorld,Chess")
    p.add_argument("--depth", type=int, default=8, help="Stockfish depth in the chess comparison")
    args = p.parse_args()
    C.setup_env_vars()
    import agentfly_gym  # noqa: F401

    res = C.Result("bench_overhead", args)
    tiny = args.scale == 0
    n = C.scaled(100, args.scale) if not tiny else 6
    warm = 2 if tiny else 5
    res.data["config"] = {"steps": n, "warmup_dropped": warm, "chess_depth": args.depth}
    res.data["results"] = {}
    for name in [e.strip() for e in args.envs.split(",") if e.strip()]:
        with C.skip_on_error(res, name, trace=False, prefix="") as guard:
            if name == "ScienceWorld":
                raw = asyncio.run(bench_scienceworld(n))
            elif name == "ALFWorld":
                raw = asyncio.run(bench_alfworld(n))
            elif name == "Chess":
                raw = asyncio.run(bench_chess(n, args.depth))
            else:
                res.skip(name, "no raw-simulator comparison defined")
                continue
        if guard.failed:
            continue
        s = summarize(raw, warm)
        res.data["results"][name] = {"summary": s, "raw": raw}
        print(f"  {name}: ours {s['ours_median_s'] * 1e3:.2f} ms, raw {s['raw_median_s'] * 1e3:.2f} ms, "
              f"overhead {100 * s['overhead_vs_raw']:+.1f}%", flush=True)
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    data = res.data["results"]
    if not data:
        return
    names = list(data)
    fig, ax = C.subplots(figsize=(7.5, 4.2))
    w = 0.27
    series = [("raw_median_s", "raw simulator call", "#7570b3"),
              ("raw_with_reward_calls_median_s", "raw + reward/flag calls", "#e7298a"),
              ("ours_median_s", "ours (env.astep)", "#1b9e77")]
    for j, (key, label, color) in enumerate(series):
        xs = [i + (j - 1) * w for i in range(len(names))]
        vals = [1e3 * (data[n]["summary"].get(key) or 0) for n in names]
        ax.bar(xs, vals, w, label=label, color=color)
    for i, n in enumerate(names):
        s = data[n]["summary"]
        top = 1e3 * max(s.get(k) or 0 for k, _, _ in series)
        ax.text(i, top * 1.04, f"{100 * s['overhead_vs_raw']:+.1f}% vs raw", ha="center", fontsize=8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("median ms per step")
    ax.set_title("Env step overhead over the raw simulator (goal < 5%)", fontsize=10)
    ax.legend(fontsize=8)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
