"""Reward-hack campaign against R2E-Gym grading, with counts, and what isolated grading costs.

Every hack of ``tests/r2e_hacks.py`` (a pass-all ``conftest.py``, a ``pytest.py`` shadowing pytest, a
``sitecustomize.py`` setting ``PYTEST_PLUGINS``, a ``.pth`` in the user site folder, an exception message
containing ``PASSED``, on Docker a wrapper at ``/usr/local/bin/python3`` and a background process that
plants ``conftest.py`` when pytest starts, and the in-process family: the task package's ``__init__.py``
wrapping ``TestReport.__init__``, swapping ``_pytest.runner.call_and_report``, patching pluggy's
``HookCaller.__call__``, registering a pass-all plugin, rewriting the JUnit report at unconfigure, at exit, or
before an ``os._exit(0)``, and swapping the hidden test module's tests: a module of passing tests put in
``sys.modules``, the test functions rebound in its globals or given other code, the file's own helper, fixture
or constant rebound in its globals) is played through ``R2EGym-v0`` actions on the unfixed fixture task, ``--repeats``
times, under ``grading="isolated"`` (the default, with the grading launcher), ``"unguarded"`` (isolated without
the launcher: the grading before it) and ``grading="in_place"`` (upstream's), on each backend.  Counted per mode: episodes, rewards bought (1.0 on an unfixed task),
handled errors, unhandled exceptions.  The honest gold patch is played too (it must score 1.0 in every mode).

Timing: the ``finish`` step after the gold patch (the end of an episode: in place, the hidden tests in the
episode's container; isolated, the diff export, a grading container of the warm pool, the clean copy, the
tests through the launcher, the JUnit report and the seal) and the reset (isolated grading records the task's
base with git), medians over ``--repeats``; ``guard_adds_s``: what the launcher adds to isolated grading.

Run: ``python benchmarks/bench_grading_hacks.py [--backends sandbox,docker] [--repeats 3]`` (about a
minute per backend and repeat on 2 cores); writes ``results/bench_grading_hacks.{json,png}``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import _common as C

REPO = Path(__file__).resolve().parents[1]
R2E_TASKS = REPO / "tests" / "fixtures" / "r2e" / "tasks.jsonl"
MODES = ("isolated", "unguarded", "in_place")
#: env keyword arguments of each mode: "unguarded" is isolated grading without the grading launcher (the grading
#: before it, kept to show what the launcher closes and what it costs)
MODE_KW = {"isolated": {"grading": "isolated"}, "unguarded": {"grading": "isolated", "grading_guard": False},
           "in_place": {"grading": "in_place"}}


def _hacks():
    sys.path.insert(0, str(REPO / "tests"))
    import r2e_hacks

    return r2e_hacks


def available(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    if backend == "sandbox":
        return None if shutil.which("bwrap") else "bubblewrap (bwrap) is not installed"
    from agentfly_gym.resources.containers.docker.engine import DockerEngine

    engine = DockerEngine()
    try:
        engine.client().ping()
    except Exception as e:  # noqa: BLE001  (any failure means: no engine here)
        return f"no Docker engine answers ({type(e).__name__}: {e})"
    finally:
        engine.close()
    return None


async def _episode(env, actions: list[str], h) -> tuple[float, dict, float, float]:
    """Reset, play ``actions``, finish; ``(reward, info, reset seconds, finish seconds)``."""
    t = time.perf_counter()
    await env.areset(options={"task_id": h.TASK_ID})
    t_reset = time.perf_counter() - t
    for a in actions:
        _o, _r, term, trunc, info = await env.astep(a)
        if term or trunc:
            return 0.0, info, t_reset, 0.0
    t = time.perf_counter()
    _o, r, _term, _trunc, info = await env.astep(h.FINISH)
    return r, info, t_reset, time.perf_counter() - t


async def run_backend(backend: str, args, res: C.Result) -> dict[str, Any]:
    from agentfly_gym.envs.r2egym import R2EGymEnv
    from agentfly_gym.resources import ResourceManager

    h = _hacks()
    kw: dict[str, Any] = {"backend": backend}
    if backend == "docker":
        from agentfly_gym.images.build import build_image

        kw["image"] = build_image(REPO / "envs" / "r2egym")
    else:
        kw["image"] = "host"
    names = [n for n in (args.hacks.split(",") if args.hacks else h.HACKS) if n]
    out: dict[str, Any] = {"hacks": {}, "counts": {m: {"episodes": 0, "bought": 0, "errors": 0, "unhandled": 0}
                                                   for m in MODES},
                           "honest": {m: [] for m in MODES}, "timing_s": {}}
    async with ResourceManager() as manager:
        envs = {m: R2EGymEnv(tasks=R2E_TASKS, manager=manager, max_instances=1, bash_timeout=30.0,
                             test_timeout=60.0, **MODE_KW[m], **kw) for m in MODES}
        gold = (await _gold_actions(envs["in_place"], h))
        # hacks
        for name in names:
            hack = h.HACKS[name]
            if hack.docker_only and backend != "docker":
                out["hacks"][name] = "skipped: the sandbox stops it in place too"
                continue
            if hack.precondition is not None:
                await envs["in_place"].areset(options={"task_id": h.TASK_ID})
                o, *_ = await envs["in_place"].astep(h.bash(hack.precondition))
                await envs["in_place"].aend_episode()
                if "yes" not in o:
                    out["hacks"][name] = f"skipped: {hack.why_not}"
                    continue
            rewards: dict[str, list[float]] = {m: [] for m in MODES}
            for _ in range(args.repeats):
                for m in MODES:
                    c = out["counts"][m]
                    c["episodes"] += 1
                    try:
                        r, info, _t0, _t1 = await _episode(envs[m], list(hack.actions), h)
                    except Exception as e:  # noqa: BLE001  (counted: an exception out of the env is a defect)
                        c["unhandled"] += 1
                        print(f"[{backend}/{m}/{name}] unhandled {type(e).__name__}: {e}", flush=True)
                        continue
                    rewards[m].append(r)
                    c["bought"] += r == 1.0
                    c["errors"] += info.get("error") is not None
            out["hacks"][name] = rewards
            print(f"[{backend}] {name}: {rewards}", flush=True)
        # honest runs and timing
        times: dict[str, dict[str, list[float]]] = {m: {"reset": [], "finish": []} for m in MODES}
        for _ in range(args.repeats):
            for m in MODES:
                r, info, t_reset, t_finish = await _episode(envs[m], gold, h)
                out["honest"][m].append(r)
                times[m]["reset"].append(t_reset)
                times[m]["finish"].append(t_finish)
        for m in MODES:
            out["timing_s"][m] = {k: {"median": C.median(v), "all": v} for k, v in times[m].items()}
        out["isolated_adds_s"] = {k: out["timing_s"]["isolated"][k]["median"] - out["timing_s"]["in_place"][k]["median"]
                                  for k in ("reset", "finish")}
        out["guard_adds_s"] = {k: out["timing_s"]["isolated"][k]["median"] - out["timing_s"]["unguarded"][k]["median"]
                               for k in ("reset", "finish")}
        for env in envs.values():
            await env.aclose()
    return out


async def _gold_actions(env, h) -> list[str]:
    await env.areset(options={"task_id": h.TASK_ID})
    first = await env.expert_action()
    await env.aend_episode()
    return [first]


def plot(res: C.Result) -> None:
    r = res.data.get("results", {})
    fig, axes = C.subplots(1, 2, figsize=(11, 4))
    backends = list(r)
    width = 0.8 / len(MODES)
    for j, m in enumerate(MODES):
        axes[0].bar([i + j * width for i in range(len(backends))],
                    [r[b]["counts"][m]["bought"] for b in backends], width, label=f"{m}: rewards bought")
        axes[1].bar([i + j * width for i in range(len(backends))],
                    [r[b]["timing_s"][m]["finish"]["median"] for b in backends], width, label=f"{m}: finish step")
    for ax, title in zip(axes, ("hacks that bought reward 1.0 on an unfixed task", "end of episode (s, median)")):
        ax.set_xticks([i + width * (len(MODES) - 1) / 2 for i in range(len(backends))])
        ax.set_xticklabels(backends)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    C.save_figure(res, fig)


def main() -> int:
    C.setup_env_vars()
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--backends", default="sandbox,docker")
    p.add_argument("--hacks", default="", help="comma-separated hack names (default: all of tests/r2e_hacks.py)")
    args = p.parse_args()
    args.repeats = args.repeats or C.scaled(3, args.scale, 1)
    res = C.Result("bench_grading_hacks", args)
    res.data["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    results: dict[str, Any] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        why = available(backend)
        if why:
            res.skip(backend, why)
            continue
        with C.skip_on_error(res, backend):
            results[backend] = asyncio.run(run_backend(backend, args, res))
    res.data["results"] = results
    summary = {b: {"counts": v["counts"], "honest": v["honest"], "isolated_adds_s": v["isolated_adds_s"],
                   "guard_adds_s": v["guard_adds_s"]} for b, v in results.items()}
    print(json.dumps(summary, indent=2), flush=True)
    return C.finish(res, plot)


if __name__ == "__main__":
    raise SystemExit(main())
