"""Smoke run of ``benchmarks/bench_gpu.py --smoke`` on the CPU (a tiny Qwen3-family model with random weights and
the shipped Qwen3 tokenizer): every part but the reference engine runs and writes strict JSON whose summary has
the fields the GPU run commits, and the figures that do not depend on timing hold (KV reuse prefills fewer tokens
per turn; float32 logprobs equal a forward pass).  Timing ratios are only checked to be positive numbers: on a
loaded 2-core machine they measure nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_gpu_smoke_writes_the_summary(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--smoke", "--out", str(tmp_path)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "bench_gpu.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert set(data["skipped"]) == {"engine/transformers_continuous_batching"}, data["skipped"]
    s = data["summary"]
    assert s["gpu"] is None
    assert s["device"] == "cpu"
    assert s["ours_over_generate"] > 0
    assert s["async_over_lockstep"]["uniform"] > 0
    assert s["async_over_lockstep"]["heavy_tailed"] > 0
    assert 0 < s["prefill_tokens_per_turn"] < s["prefill_tokens_per_turn_without_reuse"]
    assert s["logprob_max_gap"] < 1e-3
    res = data["results"]
    assert res["logprobs"]["trainer_same_dtype"]["shift_gap_median"] > 100 * s["logprob_max_gap"]
    for sched in ("uniform", "heavy_tailed"):
        run = res[f"schedule/{sched}"]
        # both schedules played the same trajectories: one request per turn drawn
        assert run["async"]["requests"] == run["lockstep"]["requests"] == sum(run["turns_drawn"])
    assert (tmp_path / "bench_gpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
