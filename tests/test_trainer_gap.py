"""Tokens against the trainer, the fast slice of ``benchmarks/bench_trainer_gap.py``: the log-probs stored with
rollouts (chain and step mode) equal a plain transformers forward pass of the same weights, and the comparison
has teeth (a log-prob read one position off, or a shifted mask, is caught).

Real components: Chess puzzles, the real tiny Qwen2 on the Qwen3 tokenizer and the bundled SmolLM2-135M,
sampled at temperature 1 through ``TransformersPolicy.from_model`` and scored by the same model object.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import agentfly_gym  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_trainer_gap as G

#: The largest gap a correct record may show: CPU float32 kernel noise between a batched, left-padded
#: generation step and one unpadded forward pass (measured ~1e-6 nats).
TOL = 1e-4


@pytest.mark.parametrize("mode", ["chain", "step"])
def test_stored_logprobs_equal_a_forward_pass(mode, tiny_qwen):
    """Every sampled token's stored log-prob equals the forward pass's; the same record read one position
    off, with its log-probs rolled by one token, or with its mask shifted by one, does not."""
    model, tok, chat = G.load_model("tiny-qwen3")
    r = asyncio.run(G.measure(model, tok, chat, "agentfly/Chess-v0", mode, episodes=1, turns=2, max_tokens=8, seed=0))
    assert r["trajectories"] == 1
    assert not r["errors"]
    assert r["tokens"] >= 8
    assert r["nonfinite"] == 0
    assert r["mask_len_mismatch"] == 0
    assert r["max_gap"] < TOL
    assert r["shift_gap_median"] > 10 * TOL
    ((prompt, resp, mask, lps), *_) = r["records"]
    assert G.score(model, [(prompt, resp, mask, lps)])["max_gap"] < TOL
    assert G.score(model, [(prompt, resp, mask, lps[1:] + lps[:1])])["max_gap"] > 10 * TOL
    assert G.score(model, [(prompt, resp, [0] + mask[:-1], [float("nan")] + lps[:-1])])["max_gap"] > 10 * TOL
    assert G.score(model, [(prompt, resp, mask[:-1], lps)])["mask_len_mismatch"] == 1


@pytest.mark.slow
def test_the_check_has_teeth_on_a_real_model():
    """With SmolLM2 (~1 min on 2 loaded cores), the true record shows no gap and one read a position off shows
    a nat or more (a random tiny model's flat distributions give only ~0.2 nats)."""
    model, tok, chat = G.load_model("smollm2")
    r = asyncio.run(G.measure(model, tok, chat, "agentfly/Chess-v0", "chain", episodes=1, turns=1, max_tokens=12,
                              seed=3))
    assert r["tokens"] >= 4
    assert r["max_gap"] < TOL
    assert r["shift_gap_median"] > 0.5
    ((prompt, resp, mask, lps),) = r["records"]
    assert G.score(model, [(prompt, resp, mask, lps[1:] + lps[:1])])["max_gap"] > 0.5
