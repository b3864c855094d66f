"""A batching in-process transformers policy (the CPU default; works on a GPU device too).

Concurrent :meth:`TransformersPolicy.generate` calls are collected by one worker thread for up
to ``batch_wait_s`` seconds (or until ``max_batch_size`` requests are waiting) and decoded
together: one left-padded forward pass per new token for the whole batch, with a KV cache.
Each request is sampled with its own parameters and its own random generator, so requests
with different :class:`~agentfly_gym.rollout.policy.SamplingParams` share a batch correctly and
a seeded request gives the same tokens whatever it was batched with (up to floating-point
differences of padded batched matmuls, which can flip a near-tie).

Rows that finish (stop token or their own ``max_tokens``) leave the running batch together with
their KV-cache rows.  Requests that arrive while a batch runs wait for the next one (static
batching in waves, no continuous batching); measured on a loaded 2-core machine with the bundled
SmolLM2, 8 concurrent 32-token greedy requests ran 7x faster than 8 sequential ones with
identical tokens.

The event loop never blocks: requests cross to the worker thread through a queue and come
back through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import queue
import random
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PolicyError
from .policy import Generation, SamplingParams

__all__ = ["TransformersPolicy"]

log = logging.getLogger(__name__)

_STOP = object()  # the sentinel that ends the worker thread


@dataclasses.dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    t0: float


class TransformersPolicy:
    """A :class:`~agentfly_gym.rollout.policy.TextPolicy` backed by a transformers causal LM.

    Sampling, per request (``SamplingParams``): the next-token logits ``z`` (float32) give the
    distribution ``p = softmax(z / temperature)``; ``top_k`` (> 0) keeps the k most likely
    tokens, then ``top_p`` (< 1) keeps the smallest set of most likely tokens whose mass
    reaches ``top_p`` (HF ``TopPLogitsWarper`` order); the token is drawn from the renormalised
    remainder.  ``temperature == 0`` is greedy (argmax of ``z``).

    Logprobs: ``Generation.logprobs[i] = log_softmax(z_i / temperature)[token_i]``, the
    log-probability under the temperature-scaled distribution BEFORE top-k/top-p truncation
    (the convention of vLLM's default ``logprobs_mode``, and the quantity an RL trainer
    recomputes from the model); for greedy requests it is ``log_softmax(z_i)[token_i]`` of the
    raw logits.  Every value is <= 0.

    Stopping: on the tokenizer's eos id, the eos id(s) of the model's generation config and
    model config, and ``sampling.stop_token_ids``; the stop token is included in
    ``token_ids`` and ``finish_reason`` is ``"stop"``; otherwise ``max_tokens`` tokens are
    returned with ``finish_reason`` ``"length"``.

    Args:
        model: a local model folder (e.g. :func:`~agentfly_gym.rollout.models.smollm2_dir`)
            with its tokenizer (which must have a chat template for chat use).
        device: torch device string ("cpu", "cuda", "cuda:1").
        torch_threads: ``torch.set_num_threads`` value applied when the worker starts
            (process-wide: torch has one intra-op pool); None leaves torch's setting.  One
            thread is the fastest on a loaded 2-core machine.
        max_batch_size: most requests decoded together.
        batch_wait_s: seconds the worker waits for more requests after the first one arrives.
        seed: seeds the per-request seeds of requests whose ``sampling.seed`` is None (drawn in
            the order ``generate`` is called), so a run with a fixed seed and a fixed call
            order is reproducible; None draws them from the OS.
        dtype: torch dtype (or its name, e.g. "bfloat16") of the weights; None keeps the
            folder's (float32 for the bundled models).

    Attributes:
        tokenizer: the Hugging Face tokenizer of ``model``.
        model: the loaded ``PreTrainedModel``.
        eos_token_ids: frozenset of ids that always stop generation.
        num_batches: batched generations run so far (one per wave of collected requests).
        num_forward_passes: model forward calls so far (one per decoded position per batch).
        num_requests: requests served so far.

    Raises:
        ConfigError: a bad argument (the message names it).
        PolicyError: the model folder cannot be loaded.
    """

    def __init__(self, model: str | os.PathLike, *, device: str = "cpu", torch_threads: int | None = 1,
                 max_batch_size: int = 8, batch_wait_s: float = 0.02, seed: int | None = None,
                 dtype: Any = None) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size!r}")
        if batch_wait_s < 0:
            raise ConfigError(f"batch_wait_s must be >= 0 seconds, got {batch_wait_s!r}")
        if torch_threads is not None and torch_threads < 1:
            raise ConfigError(f"torch_threads must be >= 1 or None, got {torch_threads!r}")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise PolicyError(f"TransformersPolicy needs torch and transformers ({e}); "
                              "install agentfly-gym[cpu-model]") from e
        if isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ConfigError(f"dtype {dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16')")
            dtype = getattr(torch, dtype)
        path = Path(model).expanduser()
        if not path.is_dir():
            raise ConfigError(f"model {str(path)!r} is not a local model folder "
                              "(use agentfly_gym.rollout.models.smollm2_dir() for the bundled model)")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            kw = {"dtype": dtype} if dtype is not None else {}
            self.model = AutoModelForCausalLM.from_pretrained(path, **kw).to(device).eval()
        except Exception as e:  # noqa: BLE001  (reported as one clear error)
            raise PolicyError(f"cannot load model folder {str(path)!r}: {type(e).__name__}: {e}") from e
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.torch_threads = torch_threads
        self.eos_token_ids = frozenset(self._eos_ids())
        if not self.eos_token_ids:
            log.warning("model %s has no eos token id; generation stops only on max_tokens/stop_token_ids", path)
        pad = self.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else (min(self.eos_token_ids) if self.eos_token_ids else 0)
        self._vocab = int(self.model.get_input_embeddings().weight.shape[0])
        self._max_len = getattr(self.model.config, "max_position_embeddings", None)
        self._seed_rng = random.Random(seed)
        self._seeded = seed is not None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.num_batches = 0
        self.num_forward_passes = 0
        self.num_requests = 0

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None),
                    getattr(self.model.config, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(i for i in src if isinstance(i, int))
        return ids

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one reply to ``prompt_ids`` (batched with concurrent calls).

        Args:
            prompt_ids: the prompt token ids (length >= 1, each in ``[0, vocab)``).
            sampling: the request's sampling parameters.

        Returns:
            A :class:`Generation` (see the class docstring for logprobs and stopping);
            ``latency`` is seconds from this call to the result, queueing included.

        Raises:
            ConfigError: invalid sampling parameters.
            PolicyError: an invalid prompt, a prompt too long for the model, the policy is
                closed, or generation failed.
        """
        self._check(prompt_ids, sampling)
        if sampling.seed is not None:
            seed = int(sampling.seed)
        elif self._seeded:
            seed = self._seed_rng.getrandbits(63)
        else:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), sampling, seed, loop, loop.create_future(), time.perf_counter())
        with self._lock:
            if self._closed:
                raise PolicyError("the policy is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="afg-transformers-policy", daemon=True)
                self._thread.start()
            self._queue.put(req)
        return await req.future

    def close(self) -> None:
        """Stop the worker thread (after the batch in progress); waiting requests fail with
        :class:`PolicyError`.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> TransformersPolicy:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (f"TransformersPolicy({self.model.config.model_type}, device={self.device}, "
                f"max_batch_size={self.max_batch_size}, batches={self.num_batches})")

    # ------------------------------------------------------------------ validation

    def _check(self, prompt_ids: list[int], s: SamplingParams) -> None:
        if not isinstance(s, SamplingParams):
            raise ConfigError(f"sampling must be a SamplingParams, got {type(s).__name__}")
        if not isinstance(s.max_tokens, int) or s.max_tokens < 1:
            raise ConfigError(f"sampling.max_tokens must be an int >= 1, got {s.max_tokens!r}")
        if not (s.temperature >= 0 and math.isfinite(s.temperature)):
            raise ConfigError(f"sampling.temperature must be a finite number >= 0, got {s.temperature!r}")
        if not (0 < s.top_p <= 1):
            raise ConfigError(f"sampling.top_p must be in (0, 1], got {s.top_p!r}")
        if not isinstance(s.top_k, int) or s.top_k < -1:
            raise ConfigError(f"sampling.top_k must be an int >= -1 (0 or -1 disable it), got {s.top_k!r}")
        if not prompt_ids:
            raise PolicyError("prompt_ids is empty: a prompt needs at least one token")
        bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < self._vocab]
        if bad:
            raise PolicyError(f"prompt_ids holds {len(bad)} ids outside [0, {self._vocab}), e.g. {bad[:3]}")
        if self._max_len and len(prompt_ids) + s.max_tokens > self._max_len:
            raise PolicyError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({s.max_tokens}) exceeds the "
                              f"model's context of {self._max_len} tokens")

    # ------------------------------------------------------------------ worker thread

    def _worker(self) -> None:
        import torch

        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                break
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            batch = [r for r in batch if not r.future.cancelled()]
            if not batch:
                continue
            try:
                results = self._run_batch(batch)
            except Exception as e:  # noqa: BLE001  (every waiting caller gets the error)
                err = PolicyError(f"generation failed: {type(e).__name__}: {e}")
                err.__cause__ = e
                for r in batch:
                    _resolve(r, exc=err)
                continue
            for r, g in zip(batch, results):
                g.latency = time.perf_counter() - r.t0
                _resolve(r, result=g)
        # Drain: whoever still waits learns that the policy closed.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                _resolve(item, exc=PolicyError("the policy was closed before this request ran"))

    def _run_batch(self, batch: list[_Request]) -> list[Generation]:
        """Decode ``batch`` together: left padding, one forward pass per position, KV cache."""
        import torch

        n = len(batch)
        self.num_batches += 1
        self.num_requests += n
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((n, width), self._pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(batch):
            input_ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attn[i, width - len(r.prompt_ids):] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        gens = [torch.Generator(device="cpu").manual_seed(r.seed) for r in batch]
        stops = [self.eos_token_ids | set(r.sampling.stop_token_ids) for r in batch]
        out_ids: list[list[int]] = [[] for _ in batch]
        out_lp: list[list[float]] = [[] for _ in batch]
        finish: list[str | None] = [None] * n
        steps = max(r.sampling.max_tokens for r in batch)
        active = list(range(n))  # rows of the running tensors -> request index
        past = None
        with torch.inference_mode():
            for _ in range(steps):
                out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids,
                                 past_key_values=past, use_cache=True)
                self.num_forward_passes += 1
                past = out.past_key_values
                logits = out.logits[:, -1, :].float().cpu()
                nxt = torch.full((len(active),), self._pad_id, dtype=torch.long)
                for row, i in enumerate(active):
                    if finish[i] is not None:  # only where the cache could not drop the row
                        continue
                    tok, lp = _sample(logits[row], batch[i].sampling, gens[i])
                    out_ids[i].append(tok)
                    out_lp[i].append(lp)
                    nxt[row] = tok
                    if tok in stops[i]:
                        finish[i] = "stop"
                    elif len(out_ids[i]) >= batch[i].sampling.max_tokens:
                        finish[i] = "length"
                keep = [row for row, i in enumerate(active) if finish[i] is None]
                if not keep:
                    break
                if len(keep) < len(active) and hasattr(past, "batch_select_indices"):
                    # Drop finished rows from the batch (and their KV cache) so that short
                    # requests do not cost long ones anything.
                    sel = torch.tensor(keep, device=self.device)
                    past.batch_select_indices(sel)
                    attn, position_ids, nxt = attn[sel], position_ids[sel], nxt[keep]
                    active = [active[row] for row in keep]
                input_ids = nxt.unsqueeze(1).to(self.device)
                attn = torch.cat([attn, torch.ones((attn.shape[0], 1), dtype=attn.dtype, device=self.device)], dim=1)
                position_ids = position_ids[:, -1:] + 1
        return [Generation(token_ids=ids, logprobs=lps, finish_reason=f or "length",
                           text=self.tokenizer.decode(ids, skip_special_tokens=True))
                for ids, lps, f in zip(out_ids, out_lp, finish)]


def _sample(z: Any, s: SamplingParams, gen: Any) -> tuple[int, float]:
    """One token from logits ``z`` (1-D float32 tensor, length vocab) and its logprob (see
    :class:`TransformersPolicy` for the exact definitions)."""
    import torch

    if s.temperature == 0:
        tok = int(torch.argmax(z))
        return tok, float(torch.log_softmax(z, dim=-1)[tok])
    scaled = z / s.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    masked = scaled
    if s.top_k and s.top_k > 0 and s.top_k < masked.numel():
        kth = torch.topk(masked, s.top_k).values[-1]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_l, idx = torch.sort(masked, descending=True)
        cum = torch.softmax(sorted_l, dim=-1).cumsum(-1)
        remove = cum - torch.softmax(sorted_l, dim=-1) >= s.top_p  # keep until the mass reaches top_p
        remove[0] = False
        masked = masked.clone()
        masked[idx[remove]] = float("-inf")
    probs = torch.softmax(masked, dim=-1)
    tok = int(torch.multinomial(probs, 1, generator=gen))
    return tok, float(logp[tok])


def _resolve(r: _Request, *, result: Generation | None = None, exc: BaseException | None = None) -> None:
    """Complete ``r.future`` on its own loop (ignored when the caller cancelled or the loop closed)."""

    def done() -> None:
        if r.future.done():
            return
        if exc is not None:
            r.future.set_exception(exc)
        else:
            r.future.set_result(result)

    try:
        r.loop.call_soon_threadsafe(done)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass
