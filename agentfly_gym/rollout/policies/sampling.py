"""Batched next-token sampling on the model's device, each row with its own parameters and random stream.

One call samples a token for every row of a ``(rows, vocab)`` logits tensor: temperature, top-k and top-p are
per-row tensors (one sort for the whole batch, only when some row truncates).  The draw is the inverse CDF: one
uniform number ``u`` per row from that row's own ``torch.Generator`` on the logits' device, then for the whole
batch one cumulative sum of the probabilities (float32, as ``torch.multinomial`` sums them) and one ``torch.searchsorted``: the token is the first
whose cumulative mass passes ``u`` (so token ``i`` comes with probability ``p_i``).  A vocabulary of noise per
row (the exponential race of vLLM's sampler) or one ``torch.multinomial`` per row cost more, on the host most
(measured: a ``multinomial`` over 49,152 ids ~10x a batched softmax on one loaded core).  A seeded row draws the
same ``u`` sequence whatever rows share its batch, so its tokens depend on its own logits only.  Only the
sampled ids and their logprobs cross to the host (one transfer per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import SamplingParams

__all__ = ["sample_rows"]


def sample_rows(logits: Any, params: Sequence[SamplingParams | None], generators: Sequence[Any]
                ) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` and its logprob.

    For row ``r`` with parameters ``s`` and float32 logits ``z`` (the row of ``logits``):

    - greedy (``s.temperature == 0``): the token is ``argmax(z)``, its logprob ``log_softmax(z)[token]``;
    - sampled: ``x = z / s.temperature``; ``top_k`` (> 0) keeps the tokens whose ``x`` is at least the k-th
      largest (ties kept, as HF ``TopKLogitsWarper``), then ``top_p`` (< 1) keeps the smallest set of most
      likely remaining tokens whose mass reaches ``top_p`` (HF ``TopPLogitsWarper`` order); the token is drawn
      from the renormalised remainder with the row's generator; its logprob is ``log_softmax(x)[token]``, the
      temperature-scaled distribution BEFORE truncation (vLLM's default ``logprobs_mode``).

    Args:
        logits: ``(rows, vocab)`` tensor of next-token logits (any float dtype, any device).
        params: per row, its sampling parameters, or None for a row to skip (its result is a greedy token that
            the caller ignores).
        generators: per row, a ``torch.Generator`` on ``logits``' device (only sampled rows use theirs).

    Returns:
        ``(token_ids, logprobs)``: two lists of length ``rows``; every logprob is <= 0.
    """
    import torch

    z = logits.float()
    _, vocab = z.shape
    dev = z.device
    sampled = [s is not None and s.temperature > 0 for s in params]
    if not any(sampled):
        tok = z.argmax(dim=-1)
        lp = torch.log_softmax(z, dim=-1).gather(1, tok[:, None]).squeeze(1)
        return tok.tolist(), lp.tolist()
    temps = torch.tensor([s.temperature if ok else 1.0 for s, ok in zip(params, sampled)], device=dev)
    x = z / temps[:, None]
    logp = torch.log_softmax(x, dim=-1)
    top_k = [s.top_k if ok and 0 < s.top_k < vocab else 0 for s, ok in zip(params, sampled)]
    top_p = [s.top_p if ok else 1.0 for s, ok in zip(params, sampled)]
    masked = x
    if any(top_k) or any(p < 1.0 for p in top_p):
        srt, idx = torch.sort(x, dim=-1, descending=True)
        if any(top_k):
            k = torch.tensor([k - 1 if k else vocab - 1 for k in top_k], device=dev)
            kth = srt.gather(1, k[:, None])
            srt = srt.masked_fill(srt < kth, float("-inf"))
        p = torch.tensor(top_p, device=dev)
        probs = torch.softmax(srt, dim=-1)
        # keep until the mass reaches top_p (the first token always kept); rows with top_p == 1 keep all
        remove = ((probs.cumsum(dim=-1) - probs) >= p[:, None]) & (p[:, None] < 1.0)
        remove[:, 0] = False
        remove |= srt == float("-inf")
        masked = x.masked_fill(torch.zeros_like(remove).scatter(1, idx, remove), float("-inf"))
    probs = torch.softmax(masked, dim=-1)
    # inverse CDF, batched: one uniform draw per row from its own generator, then one cumulative sum and one
    # search for the batch; the first token whose cumulative mass passes u (a zero-mass token never)
    u = torch.stack([torch.rand((), generator=g, device=dev) if ok else torch.zeros((), device=dev)
                     for g, ok in zip(generators, sampled)])
    cdf = probs.cumsum(dim=-1)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1).clamp(max=vocab - 1)
    if not all(sampled):  # greedy rows: argmax of z; their temperature of 1 made x equal z
        tok = torch.where(torch.tensor(sampled, device=dev), tok, z.argmax(dim=-1))
    lp = logp.gather(1, tok[:, None]).squeeze(1)
    return tok.tolist(), lp.tolist()
