"""The in-process vLLM policy.  It needs a GPU; without one the real-engine test is skipped with the reason,
and only the refusal path (a clear ResourceUnavailable) is checked."""

from __future__ import annotations

import importlib.util

import pytest

from agentfly_gym.errors import ResourceUnavailable


def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(_gpu() and HAVE_VLLM, reason="a GPU and vLLM are present: the refusal path does not apply")
def test_without_gpu_or_vllm_construction_says_why():
    from agentfly_gym.rollout.policies.vllm_policy import VLLMPolicy

    with pytest.raises(ResourceUnavailable, match="vLLM|GPU"):
        VLLMPolicy("Qwen/Qwen2.5-0.5B-Instruct")


@pytest.mark.gpu
@pytest.mark.skipif(not (_gpu() and HAVE_VLLM), reason="needs a CUDA GPU and vLLM (not available on this machine)")
async def test_vllm_policy_returns_sampled_ids_and_logprobs(tiny_qwen):
    from agentfly_gym.rollout.policies.base import SamplingParams
    from agentfly_gym.rollout.policies.vllm_policy import VLLMPolicy

    policy = VLLMPolicy(str(tiny_qwen), gpu_memory_utilization=0.2)
    try:
        prompt = policy.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        gen = await policy.generate(list(prompt), SamplingParams(max_tokens=8, temperature=1.0, seed=0))
        assert 1 <= len(gen.token_ids) <= 8
        assert len(gen.logprobs) == len(gen.token_ids)
        assert all(lp <= 0 for lp in gen.logprobs)
    finally:
        policy.close()
