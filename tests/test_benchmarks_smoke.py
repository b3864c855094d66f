"""Smoke test of the benchmark scripts: each runs at its smallest size (``--scale 0``) on the real
environments and writes valid, strict JSON (machine info, package versions, seed, command) and a
PNG.  The scripts run CONCURRENTLY at a time (they are mostly waiting on simulators; all fourteen at once
on a 2-core machine starved Ray's raylet past its 30 s start-up limit), the Ray one first, and each test
checks one of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"

CONCURRENTLY = 4
TIMEOUT_S = 300  # per script, from its start
# script -> extra arguments that keep the smoke run small (the lightest envs / backends), in start order
SCRIPTS = {
    "bench_ray_manager": ["--parts", "overhead,acquire"],
    "bench_async_rollout": ["--envs", "Chess"],
    "bench_resource_lifecycle": ["--backends", "docker,sandbox,inprocess"],
    "bench_pool_scaling": [],
    "bench_token_drift": ["--envs", "Chess"],
    "bench_overhead": ["--envs", "ScienceWorld,Chess"],
    "bench_faults": ["--envs", "Chess", "--drivers", "0"],
    "bench_hostile": ["--attacks", "pid1,loopback,symlink"],
    "bench_webshop_scale": [],
    "bench_sim_costs": [],
    "bench_trace_rollout": ["--profiles", "r2e"],
    "bench_memory": ["--envs", "Chess"],
    "bench_grading_hacks": ["--backends", "sandbox", "--hacks",
                            "conftest_pass_all,passed_in_exception,testreport_wrap,unittest_assert_patch",
                            "--suite-tests", "50"],
    "bench_memory_growth": ["--envs", "ALFWorld", "--sets", "sample"],
    "bench_trainer_gap": ["--envs", "Chess"],
}


class _Run:
    """One script's run, started by the launcher when a slot is free."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.started = threading.Event()
        self.t0 = 0.0

    def wait(self) -> int:
        """The exit status; raises subprocess.TimeoutExpired past TIMEOUT_S from the script's start."""
        self.started.wait()
        assert self.proc is not None
        return self.proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - self.t0)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               # the scripts start side by side on 2 cores: give a Ray node more than the default 10 s to register
               RAY_raylet_start_wait_time_s=os.environ.get("RAY_raylet_start_wait_time_s", "120"))
    procs = {name: _Run() for name in SCRIPTS}
    slots = threading.Semaphore(CONCURRENTLY)
    stop = threading.Event()
    logs = []

    def launch():
        for name, extra in SCRIPTS.items():
            slots.acquire()
            if stop.is_set():
                return
            log = open(out / f"{name}.log", "w")
            logs.append(log)
            run = procs[name]
            run.proc = subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), "--scale", "0", "--out", str(out),
                                         *extra], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            run.t0 = time.monotonic()
            run.started.set()
            threading.Thread(target=lambda p=run.proc: (p.wait(), slots.release()), daemon=True).start()

    launcher = threading.Thread(target=launch, daemon=True)
    launcher.start()
    yield out, procs, None
    stop.set()
    for _ in SCRIPTS:
        slots.release()
    launcher.join(30)
    for run in procs.values():
        if run.proc is not None and run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    for log in logs:
        log.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_benchmark_script_writes_valid_json(runs, name):
    out, procs, _ = runs
    try:
        rc = procs[name].wait()
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not finish in time; log:\n{(out / f'{name}.log').read_text()[-3000:]}")
    log = (out / f"{name}.log").read_text()
    assert rc == 0, f"{name} exited with {rc}:\n{log[-3000:]}"
    path = out / f"{name}.json"
    assert path.is_file(), log[-2000:]
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{name}: non-strict JSON constant {c}"))
    assert data["benchmark"] == name
    assert name in data["command"]
    assert "--scale" in data["command"]
    assert data["seed"] == 0
    assert data["machine"]["cores"] >= 1
    assert data["machine"]["ram_bytes"] > 0
    assert data["packages"]["gymnasium"]
    # the script measured something (it did not skip everything)
    measured = {k: v for k, v in data.items() if k in ("envs", "results", "median_wall_s", "profiles") and v}
    assert measured, f"{name} measured nothing; skipped: {data.get('skipped')}"
    png = out / f"{name}.png"
    assert png.is_file()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _finished(runs, name):
    out, procs, _ = runs
    try:
        rc = procs[name].wait()
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not finish in time")
    if rc != 0:
        pytest.fail(f"{name} failed:\n{(out / f'{name}.log').read_text()[-3000:]}")
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_trace_rollout_plays_the_traced_episodes_within_the_bound(runs):
    """Every schedule plays exactly the traced turn counts; no schedule beats the ideal bound; the breakdown of
    ours' slot time adds up to B x wall."""
    sys.path.insert(0, str(BENCH))
    import bench_trace_rollout as T

    data = _finished(runs, "bench_trace_rollout")
    prof = T.make_profiles()["r2e"]
    (n, d), = data["profiles"]["r2e"]["by_n"].items()
    traced = [prof.trace(data["seed"] + k)["turns"] for k in range(int(n))]
    for sched in ("lockstep", "gym_async", "ours"):
        (run,) = d["runs"][sched]
        assert sorted(run["turns"]) == sorted(traced), sched
        assert run["wall_s"] >= 0.99 * run["ideal_nominal_s"], sched
    br = d["runs"]["ours"][0]["breakdown_slot_s"]
    cap = br.pop("capacity (B x wall)")
    assert sum(br.values()) == pytest.approx(cap, rel=1e-6)
    assert "no GPU" in data["gpu"]


def test_trace_profiles_are_deterministic_and_fit_their_sources():
    """Same key, same trace; the R2E turn model reproduces the published mean (64.3, cap 100)."""
    sys.path.insert(0, str(BENCH))
    import bench_trace_rollout as T

    prof = T.make_profiles()["r2e"]
    assert prof.trace(7) == prof.trace(7)
    assert prof.trace(7) != prof.trace(8)
    turns = [prof.trace(k)["turns"] for k in range(1000)]
    assert max(turns) == 100
    assert min(turns) >= 3
    assert sum(turns) / len(turns) == pytest.approx(64.3, abs=2.5)
    sim = T.simulate([prof.trace(k) for k in range(64)], 4, 1.0)
    assert sim["ideal_s"] <= sim["ours_s"] <= sim["gym_async_s"]
    assert sim["ours_s"] <= sim["lockstep_s"]


def test_longest_first_and_the_lower_bound_bracket_the_optimal_schedule():
    """On small trace sets the exhaustive optimum of whole trajectories on b slots lies between the simulation's
    lower bound and its longest-first makespan, which keeps Graham's 4/3 - 1/(3b) guarantee."""
    import itertools

    sys.path.insert(0, str(BENCH))
    import bench_trace_rollout as T

    prof = T.make_profiles()["r2e"]
    b, n = 3, 7
    for j in range(4):
        traces = [prof.trace(1000 * j + k) for k in range(n)]
        sim = T.simulate(traces, b, 1.0)
        totals = [sum(t["gen_s"]) + sum(t["tool_s"]) for t in traces]
        opt = min(max(sum(x for x, s in zip(totals, a) if s == i) for i in range(b))
                  for a in itertools.product(range(b), repeat=n))
        assert sim["ideal_s"] <= sim["best_schedule_lower_bound_s"] <= opt * (1 + 1e-9)
        assert opt <= sim["lpt_s"] * (1 + 1e-9) <= (4 / 3 - 1 / (3 * b)) * opt * (1 + 1e-9)
        assert sim["lpt_efficiency"] <= sim["best_schedule_efficiency_at_most"] <= 1.0


@pytest.mark.slow
def test_memory_counts_one_engine_per_episode_and_one_process_per_gym_env(runs):
    """2 Chess games against Stockfish: ours = one interpreter + 2 engines; AsyncVectorEnv = the parent + 2
    workers + their 2 engines; every per-episode figure is positive."""
    data = _finished(runs, "bench_memory")
    ours, = data["envs"]["Chess"]["ours"]
    gym, = data["envs"]["Chess"]["gym_async"]
    assert ours["n"] == gym["n"] == 2
    assert ours["open"]["processes"] == 1 + 2
    assert gym["open"]["processes"] == 1 + 2 + 2
    assert ours["per_episode_pss_bytes"] > 0
    assert gym["per_episode_pss_bytes"] > 0
    # closing every episode ends every engine and worker the measurement started (its process group)
    assert ours["processes_left_after_close"] == gym["processes_left_after_close"] == 0
    assert ours["containers_left_after_close"] == gym["containers_left_after_close"] == 0


def test_memory_merge_keeps_rows_not_measured_again():
    """``--merge`` replaces only the (env, mode, count) rows a run measured and keeps the others, each
    named under ``from_earlier_run``; marginal costs are recomputed by the driver afterwards."""
    import argparse

    sys.path.insert(0, str(BENCH))
    import _common as C
    import bench_memory as bm

    res = C.Result("bench_memory", argparse.Namespace(out="unused", seed=0, scale=1.0))
    res.data["envs"] = {"ALFWorld": {"ours": [{"n": 128, "per_episode_total_bytes": 1.0}]}}
    prev = {"command": "old run", "skipped": {"ALFWorld/ours/128": "too slow", "Chess/ours/128": "memory"},
            "from_earlier_run": {"Chess": "older run"},
            "envs": {"ALFWorld": {"ours": [{"n": 8, "per_episode_total_bytes": 3.0},
                                           {"n": 128, "per_episode_total_bytes": 9.0}],
                                  "gym_async": [{"n": 8, "per_episode_total_bytes": 5.0}]},
                     "Chess": {"ours": [{"n": 32, "per_episode_total_bytes": 7.0}]}}}
    bm._merge(res, prev)
    envs = res.data["envs"]
    assert [(r["n"], r["per_episode_total_bytes"]) for r in envs["ALFWorld"]["ours"]] == [(8, 3.0), (128, 1.0)]
    assert envs["ALFWorld"]["gym_async"] == prev["envs"]["ALFWorld"]["gym_async"]
    assert envs["Chess"]["ours"] == prev["envs"]["Chess"]["ours"]
    assert res.data["from_earlier_run"] == {"ALFWorld/ours/8": "old run", "ALFWorld/gym_async/8": "old run",
                                            "Chess/ours/32": "older run"}
    assert res.data["skipped"] == {"Chess/ours/128": "memory"}  # the re-measured count's old skip is gone


@pytest.mark.slow
def test_grading_hack_campaign_counts(runs):
    """The hacks buy reward in place (upstream's grading) and nothing isolated; the in-process ones (the package
    wrapping ``TestReport.__init__``, patching ``unittest``'s assertions) only without the grading launcher, and the
    second also with the launcher but without its tamper probes; the gold patch scores 1.0 in every mode."""
    data = _finished(runs, "bench_grading_hacks")
    counts = data["results"]["sandbox"]["counts"]
    assert counts["in_place"]["bought"] == counts["in_place"]["episodes"] == 4, counts
    assert counts["isolated"]["bought"] == 0 and counts["isolated"]["unhandled"] == 0, counts
    assert counts["no_probes"]["bought"] == 1 and counts["unguarded"]["bought"] == 2, counts
    assert data["results"]["sandbox"]["by_kind"]["stdlib and builtins"]["no_probes"] == {"tried": 1, "bought": 1}
    assert all(set(v) == {1.0} for v in data["results"]["sandbox"]["honest"].values())
    assert data["cost_per_test"]["tests"] == 50
