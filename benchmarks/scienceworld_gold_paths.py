"""The length of ScienceWorld's gold paths, per task and split: does the default step limit let them finish?

For every task and every variation of its train / dev / test split (the simulator's own
``getVariationsTrain/Dev/Test``), the simulator plans the gold path (``load(..., generateGoldPath=True)``,
``getGoldActionSequence``) and the script records its length: the number of env steps the expert needs,
since ``ScienceWorldEnv`` runs the first ``look around`` at reset and then takes ``gold[t]`` at step ``t``.
Per task and split it writes the number of variations checked, the mean and the maximum length with the
variation that reaches it, and compares the overall maximum with ``ScienceWorldEnv``'s default
``max_episode_steps``.

Options: ``--simplification`` (default ``easy``, the env's default); ``--check-raw`` also plans, for the
longest variation of every task and split, the gold path under the raw package's default ``""`` (no
simplification) and records both lengths; ``--replay`` plays the longest gold path of every task (or
of the ``--replay-top`` tasks with the longest paths) through ``ScienceWorldEnv`` and records the steps
the expert really took (planning and replay can differ by a few steps) and whether it reached score 100
within the default step limit.
``--scale`` samples variations evenly (1 = all of them; 0 = the first and the last of each split, a
smoke run) and ``--max-per-split`` caps them; ``--tasks`` restricts and orders the tasks; ``--workers``
plans on several JVMs at once.  The JSON is rewritten after every task and replay, with ``"complete":
false`` until the run ends, and ``--resume`` continues from an earlier run's JSON (keeping its tasks
whose coverage suffices and its replays), so a long census can be done in passes.

    python benchmarks/scienceworld_gold_paths.py --check-raw --replay --workers 2     # every variation: hours
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common

NAME = "scienceworld_gold_paths"


def _sample(variations: tuple[int, ...], scale: float, cap: int | None = None) -> list[int]:
    """All variations for ``scale >= 1`` and no ``cap``; else about ``scale * n`` (at most ``cap``) evenly
    spaced ones, always with the first and last."""
    vs = list(variations)
    k = len(vs) if scale >= 1 else max(2, int(round(len(vs) * scale)))
    if cap is not None:
        k = min(k, max(2, cap))
    if k >= len(vs) or len(vs) <= 2:
        return vs
    picks = {round(i * (len(vs) - 1) / (k - 1)) for i in range(k)}
    return [vs[i] for i in sorted(picks)]


def _gold_length(sim, task: str, variation: int, simplification: str) -> int:
    err = sim._call("load", task, variation, simplification, True)
    if err:
        raise RuntimeError(f"load {task}:{variation} ({simplification!r}) failed: {err}")
    return len(list(sim._call("getGoldActionSequence")))


async def _replay(task: str, variation: int, split: str, simplification: str, manager, limit: int) -> dict:
    from agentfly_gym.envs.scienceworld import ScienceWorldEnv

    # a generous limit, to measure the steps the expert really needs (planning and replay can differ)
    env = ScienceWorldEnv(manager=manager, max_instances=1, split=split, simplification=simplification,
                          max_episode_steps=10 * limit)
    t0 = time.monotonic()
    _, info = await env.areset(options={"task_name": task, "variation": variation, "expert": True})
    gold_length = len(env._gold or ())  # planned at reset; the episode's end forgets it
    steps, ret, terminated, truncated = 0, 0.0, False, False
    while not (terminated or truncated):
        _, reward, terminated, truncated, info = await env.astep(await env.expert_action())
        ret += reward
        steps += 1
    won = bool(info["won"])
    await env.aclose()
    return {"task": task, "variation": variation, "split": split, "steps": steps, "score": info["score"],
            "won": bool(info["won"]), "terminated": terminated, "truncated": truncated, "return": ret,
            "gold_length": gold_length, "within_default_limit": won and steps <= limit,
            "seconds": time.monotonic() - t0}


def main() -> int:
    p = _common.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all 30)")
    p.add_argument("--simplification", default="easy")
    p.add_argument("--check-raw", action="store_true",
                   help="also plan the longest variation of each task/split with simplification ''")
    p.add_argument("--replay", action="store_true",
                   help="replay the longest gold path of each task through ScienceWorldEnv's default limit")
    p.add_argument("--replay-top", type=int, default=None,
                   help="with --replay: replay only the tasks with the N longest gold paths (default: all)")
    p.add_argument("--java-heap", default="1g")
    p.add_argument("--workers", type=int, default=1, help="JVMs planning in parallel (one thread each)")
    p.add_argument("--max-per-split", type=int, default=None,
                   help="check at most this many variations per split (evenly spaced, first and last included)")
    p.add_argument("--resume", default=None,
                   help="a JSON of an earlier run: keep its tasks whose coverage is at least this run's, "
                        "measure the others (the run's command lines are kept under 'commands')")
    args = p.parse_args()
    _common.setup_env_vars()
    from agentfly_gym.envs.scienceworld import ScienceWorldEnv, ScienceWorldSimulator, resolve_task_name, task_names
    from agentfly_gym.resources import ResourceManager

    tasks = [resolve_task_name(t.strip()) for t in args.tasks.split(",")] if args.tasks else list(task_names())
    default_limit = ScienceWorldEnv.__init__.__kwdefaults__["max_episode_steps"]
    res = _common.Result(NAME, args)
    res.data.update(simplification=args.simplification, default_max_episode_steps=default_limit,
                    complete=False, tasks={}, replays=[], commands=[res.data["command"]])
    old_replays: dict = {}
    if args.resume:
        import json

        old = json.loads(Path(args.resume).read_text())
        if old.get("simplification") != args.simplification:
            raise SystemExit(f"--resume {args.resume}: simplification {old.get('simplification')!r} differs")
        res.data["commands"] = old.get("commands", [old["command"]]) + res.data["commands"]
        for task, entry in old["tasks"].items():
            wanted = [len(_sample(tuple(range(entry[s]["variations"])), args.scale, args.max_per_split))
                      for s in ("train", "dev", "test")]
            if task in tasks and all(entry[s]["checked"] >= w for s, w in zip(("train", "dev", "test"), wanted)) \
                    and (not args.check_raw or "max_variation_raw_simplification_length" in entry["train"]):
                res.data["tasks"][task] = entry
        old_replays = {(r["task"], r["variation"], r["split"]): r for r in old.get("replays", [])}
        print(f"[{NAME}] resumed {len(res.data['tasks'])} tasks from {args.resume}", flush=True)
    lock = threading.Lock()

    def measure(task: str, sim) -> None:
        t0 = time.monotonic()
        entry: dict = {}
        for split, variations in sim.split_variations(task).items():
            lengths = {v: _gold_length(sim, task, v, args.simplification)
                       for v in _sample(variations, args.scale, args.max_per_split)}
            worst = max(lengths, key=lambda v: (lengths[v], -v))
            entry[split] = {"variations": len(variations), "checked": len(lengths),
                            "max": lengths[worst], "argmax_variation": worst,
                            "mean": sum(lengths.values()) / len(lengths), "min": min(lengths.values())}
            if args.check_raw:
                entry[split]["max_variation_raw_simplification_length"] = _gold_length(sim, task, worst, "")
        entry["seconds"] = time.monotonic() - t0
        overall = max(entry[s]["max"] for s in ("train", "dev", "test"))
        print(f"[{NAME}] {task}: max {overall} "
              + " ".join(f"{s}={entry[s]['max']}@{entry[s]['argmax_variation']}/{entry[s]['checked']}"
                         for s in ("train", "dev", "test")) + f" ({entry['seconds']:.0f} s)", flush=True)
        with lock:
            res.data["tasks"][task] = entry
            res.data["tasks"] = {t: res.data["tasks"][t] for t in tasks if t in res.data["tasks"]}
            res.data["max_gold_path"] = max(max(e[s]["max"] for s in ("train", "dev", "test"))
                                            for e in res.data["tasks"].values())
            res.save()

    todo: queue.SimpleQueue = queue.SimpleQueue()
    for task in tasks:
        if task not in res.data["tasks"]:
            todo.put(task)

    def worker() -> None:
        sim = ScienceWorldSimulator(java_heap=args.java_heap)
        try:
            while True:
                try:
                    task = todo.get_nowait()
                except queue.Empty:
                    return
                measure(task, sim)
        finally:
            sim.close()

    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        for f in [pool.submit(worker) for _ in range(args.workers)]:
            f.result()
    res.data["tasks"] = {t: res.data["tasks"][t] for t in tasks if t in res.data["tasks"]}
    res.data["max_gold_path"] = max(max(e[s]["max"] for s in ("train", "dev", "test"))
                                    for e in res.data["tasks"].values())

    if args.replay:
        async def replay_all() -> None:
            async with ResourceManager() as manager:
                by_length = sorted(res.data["tasks"].items(), reverse=True,
                                   key=lambda kv: max(kv[1][s]["max"] for s in ("train", "dev", "test")))
                for task, entry in by_length[:args.replay_top]:
                    split = max(("train", "dev", "test"), key=lambda s: entry[s]["max"])
                    r = old_replays.get((task, entry[split]["argmax_variation"], split))
                    if r is not None:  # measured by the resumed run
                        r = dict(r, within_default_limit=r["won"] and r["steps"] <= default_limit)
                        res.data["replays"].append(r)
                        continue
                    r = await _replay(task, entry[split]["argmax_variation"], split, args.simplification, manager,
                                      default_limit)
                    print(f"[{NAME}] replay {task}:{r['variation']} ({split}): {r['steps']} steps, "
                          f"score {r['score']}, truncated {r['truncated']}", flush=True)
                    res.data["replays"].append(r)
                    res.save()
        asyncio.run(replay_all())
    res.data["complete"] = True
    res.data["max_replay_steps"] = max((r["steps"] for r in res.data["replays"]), default=None)
    res.data["default_limit_lets_every_gold_path_finish"] = (
        res.data["max_gold_path"] <= default_limit and all(r["within_default_limit"] for r in res.data["replays"]))
    return _common.finish(res, _plot)


def _plot(res: _common.Result) -> None:
    tasks = list(res.data["tasks"])
    fig, ax = _common.subplots(figsize=(12, 5))
    width = 0.27
    for i, split in enumerate(("train", "dev", "test")):
        ax.bar([k + (i - 1) * width for k in range(len(tasks))], [res.data["tasks"][t][split]["max"] for t in tasks],
               width, label=f"{split} max")
    ax.axhline(res.data["default_max_episode_steps"], color="red", linestyle="--",
               label=f"default max_episode_steps = {res.data['default_max_episode_steps']}")
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels(tasks, rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("gold path length (env steps)")
    ax.set_title(f"ScienceWorld gold path length per task and split (simplification {res.data['simplification']!r})")
    ax.legend(fontsize=8)
    _common.save_figure(res, fig)


if __name__ == "__main__":
    raise SystemExit(main())
