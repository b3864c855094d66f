"""Smoke test of the side-by-side benchmark (benchmarks/bench_peers.py): agentfly-gym and one peer (GEM, in its
own uv virtual environment, created from the package index on first use and cached) play the light workload at
n = 4 against the replay server; the JSON has the summary the docs read, the peer's pinned version, and every
trajectory of both systems ended with the model's final answer, with the sampled ids checked."""

from __future__ import annotations

import asyncio

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "peers"))


def test_bench_peers_refuses_what_cannot_make_a_run(tmp_path):
    """Arguments that cannot make a run end at once with argparse's usage and exit status 2, no traceback and no
    result written (an unknown system used to exit 0 with an empty JSON; --ns 0 started a run, then raised)."""
    (tmp_path / "empty.json").write_text("{}")
    for bad in (["--systems", "nosuch"], ["--ns", "0"], ["--max-n", "verifiers=abc"],
                ["--merge", str(tmp_path / "empty.json")]):
        p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_peers.py"), *bad, "--out",
                            str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 2 and "error: " + bad[0] in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_peers_smoke_one_peer(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_peers.py"), "--scale", "0", "--systems",
                        "ours,gem", "--workloads", "light", "--kill-n", "0", "--out", str(tmp_path)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads((tmp_path / "bench_peers.json").read_text())
    assert data["skipped"] == {}, data["skipped"]
    assert data["systems"]["gem"]["version"] == "0.1.0"
    (row,) = data["summary"]["light"].values()
    assert set(row["trajectories_per_s"]) == {"ours", "gem"}
    assert row["ours_over_best_peer"] > 0
    run = data["runs"]["light"]["4"]
    for system in ("ours", "gem"):
        assert run[system]["trajectories_done"] == run[system]["trajectories_total"] == 8, run[system]
        assert run[system]["ids_equal_sampled"]["turns"] > 0
    # ours keeps the sampled ids: every turn's ids equal what the server sampled
    assert run["ours"]["ids_equal_sampled"]["share"] == 1.0
    assert (tmp_path / "bench_peers.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # the tokenizer and the profile's turn fit: ~5-25 s on the shared machine
def test_replay_is_deterministic_and_logs_the_sampled_ids():
    """Same seed, same replies (ids, tool calls, delays); another seed, other replies; the final turn answers."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_trace_rollout as T
    from replay_server import Replay
    from transformers import AutoTokenizer

    from agentfly_gym.rollout.models import smollm2_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    prof = T.make_profiles()["r2e"]

    def make(seed):
        return Replay(profile=prof, workload="container", seed=seed, time_scale=0.01, turn_div=8, tokenizer=tok)

    def reply(r, k, t, prompt=None):
        return asyncio.run(r.reply(k, t, prompt))

    a, b, c = make(0), make(0), make(1)
    for k in range(4):
        n = a.turns(k)
        assert n >= 2
        for t in range(n):
            ra, rb = reply(a, k, t), reply(b, k, t)
            assert ra == rb
            assert a.log[f"{k}/{t}"] == ra["ids"]
            assert (ra["call"] is None) == (t == n - 1)
            if ra["call"]:
                assert ra["call"]["name"] == "run"
                assert ra["call"]["arguments"]["cmd"].startswith("sleep ")
    assert [reply(c, k, 0)["ids"] for k in range(4)] != [reply(a, k, 0)["ids"] for k in range(4)]


@pytest.mark.slow  # loads SmolLM2 and samples a few dozen tokens on the CPU
def test_replay_with_the_bundled_model_samples_the_filler_and_keeps_the_script():
    """With a model, a reply's filler is what the model sampled for the prompt (seeded: the same twice), then the
    scripted tool call; the ids are logged; no replayed delay."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_trace_rollout as T
    from replay_server import Replay

    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir(), seed=0)
    try:
        replay = Replay(profile=T.make_profiles()["r2e"], workload="container", seed=0, time_scale=0.01, turn_div=8,
                        tokenizer=policy.tokenizer, model=policy)
        plain = Replay(profile=T.make_profiles()["r2e"], workload="container", seed=0, time_scale=0.01, turn_div=8,
                       tokenizer=policy.tokenizer)
        prompt = policy.tokenizer.encode("<|im_start|>user\nTASK-0: list the files.<|im_end|>\n<|im_start|>assistant\n")

        async def go():
            return await replay.reply(0, 0, prompt), await replay.reply(0, 0, prompt), await plain.reply(0, 0, prompt)

        r1, r2, r0 = asyncio.run(go())
    finally:
        policy.close()
    assert r1 == r2  # seeded by (seed, k, t)
    assert r1["delay_s"] == 0.0
    assert r1["call"] == r0["call"]  # the script is the replay's
    assert r1["ids"] != r0["ids"]  # the filler is the model's, not the word pool's
    assert r1["text"].endswith("</tool_call>")
    assert replay.log["0/0"] == r1["ids"]
