"""TransformersPolicy's device path, proven on the CPU with a real tiny model (a random tiny Qwen2 on the Qwen3
tokenizer): batched per-row sampling (its distribution, per-row parameters, seeds independent of the batch),
logprobs equal to a plain forward pass, KV reuse of a finished request's cache (same tokens and logprobs as a
fresh prefill, only the new tokens prefilled), and the device/dtype/batch-size options of ``make_policy`` and
the rollout command.  No GPU is needed: the same code runs there with ``device="cuda"``."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import torch

from agentfly_gym.errors import ConfigError
from agentfly_gym.rollout.policies.base import SamplingParams
from agentfly_gym.rollout.policies.prefix_cache import PrefixCache
from agentfly_gym.rollout.policies.sampling import sample_rows
from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy, resolve_dtype

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def reuse(tiny_qwen):
    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=8, batch_wait_s=0.05)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def fresh(tiny_qwen):
    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=8, batch_wait_s=0.05, prefix_cache_bytes=0)
    yield policy
    policy.close()


def chat_ids(policy, text: str) -> list[int]:
    return policy.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)


def forward_logprobs(policy, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    with torch.inference_mode():
        logits = policy.model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    scale = temperature or 1.0
    return [torch.log_softmax(logits[len(prompt) - 1 + i] / scale, -1)[t].item() for i, t in enumerate(ids)]


def test_sample_rows_draws_from_each_rows_distribution():
    """The batched inverse-CDF draw picks token i with probability p_i: 4000 draws of p = (0.5, 0.3, 0.2) land within
    3 points of it; a row's top_k=2 never draws the third token; greedy rows take the argmax."""
    z = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    n = 4000  # rows per kind, all in one batch (one generator each)
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=2), GREEDY] * n
    gens = [torch.Generator().manual_seed(s) for s in range(3 * n)]
    toks, lps = sample_rows(z.expand(3 * n, 3), params, gens)
    counts = torch.zeros(3, 3)
    for r, t in enumerate(toks):
        counts[r % 3, t] += 1
    assert lps[0::3] == pytest.approx([float(z[t]) for t in toks[0::3]], abs=1e-6)  # at T=1, before truncation
    freq = counts / n
    assert torch.allclose(freq[0], torch.tensor([0.5, 0.3, 0.2]), atol=0.03), freq[0]
    assert freq[1, 2] == 0
    assert freq[1, 0] == pytest.approx(0.5 / 0.8, abs=0.03)
    assert freq[2, 0] == 1


def test_sample_rows_top_p_and_temperature_per_row():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    n = 300
    gens = [torch.Generator().manual_seed(s) for s in range(2 * n)]
    toks, lps = sample_rows(z.repeat(2 * n, 1), [SamplingParams(temperature=0.5, top_p=0.8),
                                             SamplingParams(temperature=2.0)] * n, gens)
    seen = [set(toks[0::2]), set(toks[1::2])]
    assert lps[1::2] == pytest.approx([float(torch.log_softmax(z[0] / 2.0, -1)[t]) for t in toks[1::2]], abs=1e-6)
    # at T=0.5 the top token holds 0.867 of the mass, past top_p: the nucleus is that token alone
    assert seen[0] == {0}
    assert seen[1] == {0, 1, 2, 3}


async def test_seeded_tokens_do_not_depend_on_the_batch(reuse):
    """One seeded request alone, then batched with five others of other lengths and parameters: same tokens,
    logprobs equal up to the padded batch's float rounding."""
    prompt = chat_ids(reuse, "Name a chess opening.")
    s = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=77)
    alone = await reuse.generate(prompt, s)
    b0 = reuse.num_batches
    others = [reuse.generate(chat_ids(reuse, "word " * (4 * i) + "?"),
                             SamplingParams(max_tokens=4 + i, temperature=0.3 * i, top_k=5 * i)) for i in range(5)]
    mixed = await asyncio.gather(*others[:2], reuse.generate(prompt, s), *others[2:])
    assert reuse.num_batches - b0 == 1
    assert mixed[2].token_ids == alone.token_ids
    assert mixed[2].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    other_seed = await reuse.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=78))
    assert other_seed.token_ids != alone.token_ids


async def test_a_turn_with_a_reused_cache_equals_a_fresh_prefill(reuse, fresh):
    """Chain mode's next turn (previous prompt + reply + observation) starts from the kept KV cache: only its
    new tokens are prefilled, and its tokens and logprobs equal a policy that prefills everything, whose
    logprobs equal a plain forward pass.  Two trajectories in one prefill, one with a cached prefix and one
    without, take the mixed layout (padding between the cached part and the new tokens)."""
    reuse.clear_prefix_cache()
    p1 = chat_ids(reuse, "You play white. Your move?")
    for sampling in (GREEDY, SamplingParams(max_tokens=6, temperature=0.8, seed=5)):
        first = await reuse.generate(p1, sampling)
        obs = reuse.tokenizer.encode("<|im_end|>\n<|im_start|>user\nBlack played e5. Your move?<|im_end|>\n"
                                     "<|im_start|>assistant\n")
        p2 = p1 + first.token_ids + obs
        other = chat_ids(reuse, "A different trajectory, never seen before, longer than the other one " * 2)
        hits, pre = reuse.prefix_cache.hits, reuse.num_prefill_tokens
        got = await asyncio.gather(reuse.generate(p2, sampling), reuse.generate(other, GREEDY))
        assert reuse.prefix_cache.hits - hits == 1
        # the cache held p1 + the reply but its last token (never fed back): those plus obs are new
        assert reuse.num_prefill_tokens - pre == 1 + len(obs) + len(other)
        want = await asyncio.gather(fresh.generate(p2, sampling), fresh.generate(other, GREEDY))
        for g, w in zip(got, want):
            assert g.token_ids == w.token_ids
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        assert got[0].logprobs == pytest.approx(forward_logprobs(reuse, p2, got[0].token_ids, sampling.temperature),
                                                abs=2e-4)
    assert fresh.prefix_cache.hits == 0
    assert len(fresh.prefix_cache) == 0
    # after new weights (clear_prefix_cache), nothing kept before is reused
    assert len(reuse.prefix_cache) > 0
    reuse.clear_prefix_cache()
    hits = reuse.prefix_cache.hits
    await reuse.generate(p2 + got[0].token_ids + obs, GREEDY)
    assert reuse.prefix_cache.hits == hits
    assert reuse._logits_to_keep  # prefill computes logits for the last position only


def test_prefix_cache_keeps_one_entry_per_trajectory_within_its_bound():
    kv = [(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8))]  # 2 x 256 bytes per layer
    cache = PrefixCache(max_bytes=3 * 512)
    cache.store([1, 2, 3, 4], kv)
    cache.store([1, 2, 3, 4], kv)  # the same sequence again: no second entry
    assert len(cache) == 1
    assert cache.lookup([1, 2, 3, 4]) is None
    assert cache.lookup([1, 2, 3, 4, 5]).token_ids == [1, 2, 3, 4]
    cache.store([1, 2, 3, 4, 5, 6, 7, 8], [(torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8))])
    assert len(cache) == 1
    assert cache.nbytes == 1024
    cache.store([9, 9, 9, 9], kv)  # 1024 + 512 fits
    cache.store([7, 7, 7, 7], kv)  # past the bound: the least recently used (the long one) goes
    assert sorted(e.token_ids[0] for e in cache._entries.values()) == [7, 9]
    assert cache.nbytes == 1024
    PrefixCache(0).store([1], kv)  # disabled: nothing kept, no error


def test_device_and_dtype_are_checked_and_default_to_bf16_on_a_gpu():
    assert resolve_dtype("cpu") is None
    assert resolve_dtype("cpu", "auto") is None
    assert resolve_dtype("cpu", "bfloat16") is torch.bfloat16
    with pytest.raises(ConfigError, match="floating torch dtype"):
        resolve_dtype("cpu", "int8")
    with pytest.raises(ConfigError, match="not a torch device"):
        resolve_dtype("gpu0")
    if torch.cuda.is_available():
        assert resolve_dtype("cuda") is (torch.bfloat16 if torch.cuda.is_bf16_supported() else None)
    else:
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_dtype("cuda")


def test_make_policy_takes_device_dtype_and_batch_size(tiny_qwen):
    from agentfly_gym.rollout.policies.factory import make_policy

    policy, _ = make_policy(str(tiny_qwen), device="cpu", dtype="bfloat16", max_batch_size=3)
    try:
        assert policy.model.dtype == torch.bfloat16
        assert policy.max_batch_size == 3
        assert policy.device.type == "cpu"
        g = asyncio.run(policy.generate(chat_ids(policy, "hi"), GREEDY))
        assert len(g.token_ids) == 6
    finally:
        policy.close()
    with pytest.raises(ConfigError, match="max_batch_size"):
        make_policy(str(tiny_qwen), max_batch_size=0)
    with pytest.raises(ConfigError, match="dtype"):
        make_policy(str(tiny_qwen), dtype="float33")


@pytest.mark.slow
def test_rollout_command_takes_device_dtype_and_max_batch_size(tiny_qwen, tmp_path):
    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agentfly_gym", "rollout", "--env", "Chess-v0", "--policy",
                               str(tiny_qwen), "-n", "2", "--max-turns", "1", "--max-tokens", "4", "--no-progress",
                               *extra], capture_output=True, text=True, timeout=300)

    r = run("--device", "cpu", "--dtype", "bfloat16", "--max-batch-size", "2", "--output-dir", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a" / "summary.json").is_file()
    bad = run("--dtype", "float33", "--output-dir", str(tmp_path / "b"))
    assert bad.returncode == 2 and "float33" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    if not torch.cuda.is_available():
        bad = run("--device", "cuda", "--output-dir", str(tmp_path / "c"))
        assert bad.returncode == 2 and "CUDA" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
