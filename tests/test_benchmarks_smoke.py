"""Smoke test of the benchmark scripts: each runs at its smallest size (``--scale 0``) on the real
environments and writes valid, strict JSON (machine info, package versions, seed, command) and a
PNG.  The scripts are started together (they are mostly waiting on simulators) and each test
checks one of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"

# script -> extra arguments that keep the smoke run small (the lightest envs / backends)
SCRIPTS = {
    "bench_async_rollout": ["--envs", "Chess"],
    "bench_resource_lifecycle": ["--backends", "docker,sandbox,inprocess"],
    "bench_pool_scaling": [],
    "bench_token_drift": ["--envs", "Chess"],
    "bench_overhead": ["--envs", "ScienceWorld,Chess"],
    "bench_faults": ["--envs", "Chess", "--drivers", "0"],
    "bench_webshop_scale": [],
    "bench_ray_manager": ["--parts", "overhead,acquire"],
    "bench_sim_costs": [],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = {}
    for name, extra in SCRIPTS.items():
        log = open(out / f"{name}.log", "w")
        procs[name] = (subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), "--scale", "0", "--out", str(out),
                                         *extra], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    t0 = time.monotonic()
    yield out, procs, t0
    for p, log in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_benchmark_script_writes_valid_json(runs, name):
    out, procs, t0 = runs
    proc, _log = procs[name]
    try:
        rc = proc.wait(timeout=max(1.0, 240 - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not finish in time; log:\n{(out / f'{name}.log').read_text()[-3000:]}")
    log = (out / f"{name}.log").read_text()
    assert rc == 0, f"{name} exited with {rc}:\n{log[-3000:]}"
    path = out / f"{name}.json"
    assert path.is_file(), log[-2000:]
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{name}: non-strict JSON constant {c}"))
    assert data["benchmark"] == name
    assert name in data["command"] and "--scale" in data["command"]
    assert data["seed"] == 0
    assert data["machine"]["cores"] >= 1 and data["machine"]["ram_bytes"] > 0
    assert data["packages"]["gymnasium"]
    # the script measured something (it did not skip everything)
    measured = {k: v for k, v in data.items() if k in ("envs", "results", "median_wall_s") and v}
    assert measured, f"{name} measured nothing; skipped: {data.get('skipped')}"
    png = out / f"{name}.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
