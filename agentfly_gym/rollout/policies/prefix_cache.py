"""A small per-policy cache of finished requests' KV caches, so that a chain-mode turn prefills only its new tokens.

In chain mode a trajectory's next prompt is its previous prompt, the sampled reply and the observation's tokens:
it extends the previous request's token ids.  When a request finishes, the policy stores the keys and values of
every position it ran (the prompt and all sampled tokens but the last, which was never fed back) under those
token ids; a later request whose prompt starts with a stored sequence (and is longer) starts from that KV cache.
Entries live on the model's device; the least recently used go first once their bytes pass the bound, and an
entry that a newer one extends is dropped when the newer one is stored (a trajectory keeps one entry).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

__all__ = ["CachedPrefix", "PrefixCache"]


@dataclasses.dataclass
class CachedPrefix:
    """One stored sequence: ``token_ids`` (length ``L``) and per layer ``(keys, values)``, each a tensor
    ``(1, kv_heads, L, head_dim)``; ``nbytes`` is their size in bytes."""

    token_ids: list[int]
    layers: list[tuple[Any, Any]]
    nbytes: int


class PrefixCache:
    """Least-recently-used store of :class:`CachedPrefix` entries bounded by ``max_bytes``.

    Used by one thread (the policy's worker); not thread-safe.

    Args:
        max_bytes: most bytes of keys and values held (0 disables the cache: nothing is stored).

    Attributes:
        hits: lookups that found a prefix.  reused_tokens: prompt tokens those lookups did not prefill.
        nbytes: bytes held now.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: collections.OrderedDict[int, CachedPrefix] = collections.OrderedDict()
        self._next = 0
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt_ids: list[int]) -> CachedPrefix | None:
        """The longest stored entry whose token ids are a proper prefix of ``prompt_ids`` (at least one prompt
        token is left to prefill, since the next token's logits come from it), or None."""
        best_key, best = None, None
        n = len(prompt_ids)
        for key, e in self._entries.items():
            m = len(e.token_ids)
            if (m < n and (best is None or m > len(best.token_ids)) and prompt_ids[m - 1] == e.token_ids[-1]
                    and prompt_ids[:m] == e.token_ids):
                best_key, best = key, e
        if best is not None:
            self._entries.move_to_end(best_key)
            self.hits += 1
            self.reused_tokens += len(best.token_ids)
        return best

    def store(self, token_ids: list[int], layers: list[tuple[Any, Any]]) -> None:
        """Keep ``layers`` (per layer ``(keys, values)``, ``(1, kv_heads, len(token_ids), head_dim)``) for
        ``token_ids``; entries that ``token_ids`` extends are dropped, and the oldest entries while the bytes
        exceed ``max_bytes`` (an entry larger than the bound is not stored)."""
        if not token_ids or self.max_bytes <= 0:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        n = len(token_ids)
        for key, e in list(self._entries.items()):
            m = len(e.token_ids)
            if m <= n and token_ids[:m] == e.token_ids:
                self._drop(key)
            elif m > n and e.token_ids[:n] == token_ids:
                return  # a longer stored sequence already covers this one
        while self._entries and self.nbytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = CachedPrefix(list(token_ids), layers, nbytes)
        self._next += 1
        self.nbytes += nbytes

    def clear(self) -> None:
        """Drop every entry (frees their device memory)."""
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes
