"""Reward-hack campaign against R2E-Gym grading, with counts per kind of hack, and what the grading costs.

Every hack of ``tests/r2e_hacks.py`` is played through ``R2EGym-v0`` actions on its unfixed task of
``tests/fixtures/r2e/hack_tasks.jsonl`` (the fixture task, and one small task per hidden test shape a hack aims at),
``--repeats`` times, under four gradings: ``isolated`` (the default: the filtered diff in a fresh container, the
grading launcher and its tamper probes), ``no_probes`` (the same without the tamper probes), ``unguarded`` (isolated
without the launcher: the grading before it) and ``in_place`` (upstream's), on each backend.  The kinds: file filter
(``conftest.py``, ``pytest.py``, ``sitecustomize`` as a file or a package, a user-site ``.pth``), log parsing, the
container (a ``python3`` wrapper, a watcher), pytest's state (its report class, runner, hook caller, a plugin, the items'
functions and the hook relay swapped from package code), report files (the JUnit report rewritten, an early exit),
test code substituted (the module, its globals, its code, a loader), stdlib and builtins (``unittest`` assertions,
``abs``, ``math.isclose``), a helper module's code, files beside the tests, the test file's names rebound, its data
changed in place.  Counted per mode and kind: hacks tried, rewards bought (1.0 on an unfixed task), handled errors,
unhandled exceptions; ``aimed`` hacks name what one hidden test file holds (a model would need the hidden tests).
The honest gold patch is played too (it must score 1.0 in every mode).

Timing: the ``finish`` step after the gold patch (the end of an episode) and the reset, medians over ``--repeats``;
``guard_adds_s`` and ``probes_add_s``: what the launcher and its probes add to the end of an episode.  The cost per
graded test: a suite of ``--suite-tests`` trivial tests run on the host by plain ``python -m pytest``, by the launcher
without probes and with them, ``(launcher - plain) / tests``, median of ``--repeats``.

Run: ``python benchmarks/bench_grading_hacks.py [--backends sandbox,docker] [--repeats 3]``; writes
``results/bench_grading_hacks.{json,png}``.
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
R2E_TASKS = REPO / "tests" / "fixtures" / "r2e" / "hack_tasks.jsonl"
MODES = ("isolated", "no_probes", "unguarded", "in_place")
#: env keyword arguments of each mode: "no_probes" is the launcher without its tamper probes, "unguarded" isolated
#: grading without the launcher (the gradings before them, kept to show what each closes and what it costs)
MODE_KW = {"isolated": {"grading": "isolated"}, "no_probes": {"grading": "isolated", "tamper_probes": False},
           "unguarded": {"grading": "isolated", "grading_guard": False}, "in_place": {"grading": "in_place"}}


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


async def _episode(env, actions: list[str], h, task_id: str) -> tuple[float, dict, float, float]:
    """Reset, play ``actions``, finish; ``(reward, info, reset seconds, finish seconds)``."""
    t = time.perf_counter()
    await env.areset(options={"task_id": task_id})
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
                           "by_kind": {}, "honest": {m: [] for m in MODES}, "timing_s": {}, "tampered": {}}
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
                await envs["in_place"].areset(options={"task_id": hack.task_id})
                o, *_ = await envs["in_place"].astep(h.bash(hack.precondition))
                await envs["in_place"].aend_episode()
                if "yes" not in o:
                    out["hacks"][name] = f"skipped: {hack.why_not}"
                    continue
            rewards: dict[str, list[float]] = {m: [] for m in MODES}
            kind = out["by_kind"].setdefault(hack.kind + (" (aimed)" if hack.aimed else ""),
                                             {m: {"tried": 0, "bought": 0} for m in MODES})
            for _ in range(args.repeats):
                for m in MODES:
                    c = out["counts"][m]
                    c["episodes"] += 1
                    kind[m]["tried"] += 1
                    try:
                        r, info, _t0, _t1 = await _episode(envs[m], list(hack.actions), h, hack.task_id)
                    except Exception as e:  # noqa: BLE001  (counted: an exception out of the env is a defect)
                        c["unhandled"] += 1
                        print(f"[{backend}/{m}/{name}] unhandled {type(e).__name__}: {e}", flush=True)
                        continue
                    rewards[m].append(r)
                    c["bought"] += r == 1.0
                    kind[m]["bought"] += r == 1.0
                    if m == "isolated":
                        out["tampered"][name] = (info.get("grading") or {}).get("tampered", [])[:2]
                    c["errors"] += info.get("error") is not None
            out["hacks"][name] = rewards
            print(f"[{backend}] {name}: {rewards}", flush=True)
        # honest runs and timing
        times: dict[str, dict[str, list[float]]] = {m: {"reset": [], "finish": []} for m in MODES}
        for _ in range(args.repeats):
            for m in MODES:
                r, info, t_reset, t_finish = await _episode(envs[m], gold, h, h.TASK_ID)
                out["honest"][m].append(r)
                times[m]["reset"].append(t_reset)
                times[m]["finish"].append(t_finish)
        for m in MODES:
            out["timing_s"][m] = {k: {"median": C.median(v), "all": v} for k, v in times[m].items()}
        out["isolated_adds_s"] = {k: out["timing_s"]["isolated"][k]["median"] - out["timing_s"]["in_place"][k]["median"]
                                  for k in ("reset", "finish")}
        out["guard_adds_s"] = {k: out["timing_s"]["no_probes"][k]["median"] - out["timing_s"]["unguarded"][k]["median"]
                               for k in ("reset", "finish")}
        out["probes_add_s"] = {k: out["timing_s"]["isolated"][k]["median"] - out["timing_s"]["no_probes"][k]["median"]
                               for k in ("reset", "finish")}
        for env in envs.values():
            await env.aclose()
    return out


async def _gold_actions(env, h) -> list[str]:
    await env.areset(options={"task_id": h.TASK_ID})
    first = await env.expert_action()
    await env.aend_episode()
    return [first]


def cost_per_test(n_tests: int, repeats: int) -> dict[str, Any]:
    """Seconds a graded test costs on the host: plain ``python -m pytest``, the launcher without and with probes, on a
    suite of ``n_tests`` trivial tests (one file, as a hidden test file), medians of ``repeats`` runs."""
    import subprocess
    import tempfile

    guard = REPO / "agentfly_gym" / "envs" / "r2egym" / "grading_guard.py"
    runs: dict[str, list[float]] = {"plain": [], "launcher": [], "launcher_probes": []}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "tests").mkdir()
        (root / "tests" / "test_many.py").write_text("".join(
            f"def test_{i}():\n    assert {i} == {i}\n\n\n" for i in range(n_tests)))
        grade = root / "grade"
        grade.mkdir()
        for f in ("grading_guard.py", "guard_namespaces.py", "guard_probes.py"):
            shutil.copy(guard.with_name(f), grade / ("guard.py" if f == "grading_guard.py" else f))
        env = {"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTEST_ADDOPTS": f"--junitxml={grade / 'report.xml'} -o junit_family=xunit1"}
        for _ in range(repeats):
            for mode in runs:
                if mode != "plain":
                    (grade / "key").write_text("k" * 64 + ("" if mode == "launcher_probes" else "\nprobes=0"))
                runner = ["-m", "pytest"] if mode == "plain" else [str(grade / "guard.py")]
                t = time.perf_counter()
                subprocess.run([sys.executable, *runner, "-q", "-p", "no:cacheprovider", "tests/test_many.py"],
                               cwd=root, env=env, capture_output=True, timeout=600)
                runs[mode].append(time.perf_counter() - t)
    med = {m: C.median(v) for m, v in runs.items()}
    return {"tests": n_tests, "run_s": {m: {"median": med[m], "all": v} for m, v in runs.items()},
            "launcher_per_test_ms": 1000 * (med["launcher"] - med["plain"]) / n_tests,
            "probes_per_test_ms": 1000 * (med["launcher_probes"] - med["launcher"]) / n_tests}


def plot(res: C.Result) -> None:
    r = res.data.get("results", {})
    fig, axes = C.subplots(1, 2, figsize=(13, 4.5))
    backends = list(r)
    kinds = sorted({k for b in backends for k in r[b]["by_kind"]})
    width = 0.8 / max(1, len(MODES) * len(backends))
    for j, (b, m) in enumerate((b, m) for b in backends for m in MODES):
        axes[0].bar([i + j * width for i in range(len(kinds))],
                    [r[b]["by_kind"].get(k, {}).get(m, {}).get("bought", 0) for k in kinds], width, label=f"{b}/{m}")
    axes[0].set_xticks([i + 0.4 for i in range(len(kinds))])
    axes[0].set_xticklabels(kinds, rotation=60, ha="right", fontsize=7)
    axes[0].set_title("hacks that bought reward 1.0 on an unfixed task, by kind", fontsize=9)
    axes[0].legend(fontsize=6, ncol=2)
    width = 0.8 / len(MODES)
    for j, m in enumerate(MODES):
        axes[1].bar([i + j * width for i in range(len(backends))],
                    [r[b]["timing_s"][m]["finish"]["median"] for b in backends], width, label=m)
    axes[1].set_xticks([i + width * (len(MODES) - 1) / 2 for i in range(len(backends))])
    axes[1].set_xticklabels(backends)
    axes[1].set_title("end of episode after the gold patch (s, median)", fontsize=9)
    axes[1].legend(fontsize=7)
    C.save_figure(res, fig)


def main() -> int:
    C.setup_env_vars()
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--backends", default="sandbox,docker")
    p.add_argument("--hacks", default="", help="comma-separated hack names (default: all of tests/r2e_hacks.py)")
    p.add_argument("--suite-tests", type=int, default=400, help="tests in the suite that measures the cost per test")
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
    with C.skip_on_error(res, "cost_per_test"):
        res.data["cost_per_test"] = cost_per_test(args.suite_tests, args.repeats)
    summary = {b: {"counts": v["counts"], "by_kind": v["by_kind"], "honest": v["honest"],
                   "isolated_adds_s": v["isolated_adds_s"], "guard_adds_s": v["guard_adds_s"],
                   "probes_add_s": v["probes_add_s"]} for b, v in results.items()}
    summary["cost_per_test"] = res.data.get("cost_per_test")
    print(json.dumps(summary, indent=2), flush=True)
    return C.finish(res, plot)


if __name__ == "__main__":
    raise SystemExit(main())
