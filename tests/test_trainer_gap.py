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
import bench_trainer_gap as G  # noqa: E402

#: The largest gap a correct record may show: CPU float32 kernel noise between a batched, left-padded
#: generation step and one unpadded forward pass (measured ~1e-6 nats).
TOL = 1e-4


@pytest.mark.parametrize("mode", ["chain", "step"])
def test_stored_logprobs_equal_a_forward_pass(mode, tiny_qwen):
    model, tok, chat = G.load_model("tiny-qwen3")
    r = asyncio.run(G.measure(model, tok, chat, "agentfly/Chess-v0", mode, episodes=2, turns=2, max_tokens=8, seed=0))
    assert r["trajectories"] == 2 and not r["errors"]
    assert r["tokens"] >= 16 and r["nonfinite"] == 0 and r["mask_len_mismatch"] == 0
    assert r["max_gap"] < TOL
    assert r["shift_gap_median"] > 100 * TOL  # read one position off, the same records disagree


def test_the_check_has_teeth_on_a_real_model():
    """With SmolLM2, a record whose log-probs are shifted by one token, or whose mask is shifted, shows a gap of
    nats; the true record shows none."""
    model, tok, chat = G.load_model("smollm2")
    from agentfly_gym.rollout import SamplingParams, TaskRunner
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    async def roll():
        policy = TransformersPolicy.from_model(model, tok, seed=0)
        try:
            async with TaskRunner(policy, chat, max_turns=1,
                                  sampling=SamplingParams(max_tokens=12, temperature=1.0)) as runner:
                return await runner.aplay([("agentfly/Chess-v0", None, 3)])
        finally:
            await policy.aclose()

    (traj,) = asyncio.run(roll())
    ((prompt, resp, mask, lps),) = G.sequences(traj)
    good = G.score(model, [(prompt, resp, mask, lps)])
    assert good["tokens"] >= 4 and good["max_gap"] < TOL
    assert good["shift_gap_median"] > 0.5
    shifted_lps = lps[1:] + lps[:1]
    assert G.score(model, [(prompt, resp, mask, shifted_lps)])["max_gap"] > 0.5
    shifted_mask = [0] + mask[:-1]
    bad = G.score(model, [(prompt, resp, shifted_mask, [float("nan")] + lps[:-1])])
    assert bad["max_gap"] > 0.5
    assert G.score(model, [(prompt, resp, mask[:-1], lps)])["mask_len_mismatch"] == 1
