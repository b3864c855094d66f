"""The running batch of :class:`~.transformers_policy.TransformersPolicy`'s worker thread and the KV-cache
operations on it: row selection, merging a fresh prefill into a running batch, and building a batched cache
from per-row cached prefixes.  Used by one thread only."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Rows", "cache_of", "joinable", "stack_right_aligned"]


@dataclasses.dataclass
class Rows:
    """The running batch of the worker thread: its requests, their KV cache and per-row decoding state.

    Between forward passes the cache holds ``T`` positions (left-padded), ``attn`` is ``(B, T + 1)``
    and covers them plus the pending token ``next_ids`` ``(B, 1)``, whose position is ``pos`` ``(B, 1)``.
    """

    reqs: list[Any]
    gens: list[Any]
    stops: list[set[int]]
    out_ids: list[list[int]]
    out_lp: list[list[float]]
    finish: list[str | None]
    next_ids: Any
    attn: Any
    pos: Any
    past: Any
    joinable: bool = False
    resolved: list[bool] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.resolved = [False] * len(self.reqs)

    _LISTS = ("reqs", "gens", "stops", "out_ids", "out_lp", "finish", "resolved")

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep``, then cut the cache columns that every remaining row has as padding."""
        import torch

        sel = torch.tensor(keep, device=self.attn.device)
        self.past.batch_select_indices(sel)
        self.next_ids, self.attn, self.pos = self.next_ids[sel], self.attn[sel], self.pos[sel]
        for name in self._LISTS:
            setattr(self, name, [getattr(self, name)[i] for i in keep])
        if self.joinable:
            lead = int(self.attn.any(dim=0).long().argmax())  # first column some row attends to
            if lead > 0:
                self.attn = self.attn[:, lead:]
                self.past = cache_of([(la.keys[..., lead:, :], la.values[..., lead:, :]) for la in self.past.layers])

    def merge(self, other: Rows) -> None:
        """Append ``other``'s rows (a fresh prefill) to this batch, left-padding the shorter KV cache."""
        import torch

        ta, tb = self.attn.shape[1], other.attn.shape[1]
        width = max(ta, tb)

        def left_pad(x: Any, n: int, dim: int) -> Any:
            if n == 0:
                return x
            shape = list(x.shape)
            shape[dim] = n
            return torch.cat([x.new_zeros(shape), x], dim=dim)

        self.attn = torch.cat([left_pad(self.attn, width - ta, 1), left_pad(other.attn, width - tb, 1)], dim=0)
        self.past = cache_of([(torch.cat([left_pad(mine.keys, width - ta, -2), left_pad(theirs.keys, width - tb, -2)]),
                                torch.cat([left_pad(mine.values, width - ta, -2),
                                           left_pad(theirs.values, width - tb, -2)]))
                               for mine, theirs in zip(self.past.layers, other.past.layers)])
        self.next_ids = torch.cat([self.next_ids, other.next_ids])
        self.pos = torch.cat([self.pos, other.pos])
        for name in self._LISTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def cache_of(layers: list[tuple[Any, Any]]) -> Any:
    """A ``DynamicCache`` of plain full-attention layers holding ``layers`` (per layer ``(keys, values)``, each
    ``(batch, kv_heads, positions, head_dim)``), built through its public constructor (as for data gathered by
    ``torch.distributed``); the cache a row selection or a merge continues with."""
    import torch
    from transformers.cache_utils import DynamicCache

    with torch.inference_mode():
        return DynamicCache(ddp_cache_data=layers)


def joinable(past: Any) -> bool:
    """Whether new rows can be merged into this KV cache: a DynamicCache of plain full-attention layers
    (e.g. Llama/SmolLM2, Qwen2/3).  Other caches (sliding windows, linear attention) run in static waves."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return False
    layers = getattr(past, "layers", None)
    return (isinstance(past, DynamicCache) and bool(layers) and all(type(la) is DynamicLayer for la in layers)
            and all(getattr(la, "keys", None) is not None and la.keys.dim() == 4 for la in layers))


def stack_right_aligned(layers: list[tuple[Any, Any] | None], width: int) -> tuple[Any, Any]:
    """One layer's batched ``(keys, values)`` ``(rows, kv_heads, width, head_dim)`` from per-row cached
    ``(keys, values)`` ``(1, kv_heads, L_i, head_dim)`` (None: no cache for that row), each right-aligned,
    zeros on the left."""
    import torch

    ref = next(la for la in layers if la is not None)
    out = []
    for t in (0, 1):
        full = ref[t].new_zeros((len(layers), ref[t].shape[1], width, ref[t].shape[3]))
        for i, la in enumerate(layers):
            if la is not None and la[t].shape[2]:
                full[i, :, width - la[t].shape[2]:] = la[t][0]
        out.append(full)
    with torch.inference_mode():
        return out[0], out[1]
