"""An in-process vLLM policy (GPU only): token ids in, sampled token ids and logprobs out.

Uses vLLM's asynchronous engine (``AsyncLLMEngine`` with ``TokensPrompt``), so concurrent
``generate`` calls from many rollouts are continuously batched by vLLM itself.  Logprobs are
requested with ``logprobs=0`` (the sampled token's own logprob), as verl's vLLM rollout does.
vLLM needs a GPU; on a machine without one, constructing the policy raises
:class:`~agentfly_gym.errors.ResourceUnavailable` with the reason.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from ...errors import PolicyError, ResourceUnavailable
from .base import Generation, SamplingParams

__all__ = ["VLLMPolicy"]

_ids = itertools.count()


class VLLMPolicy:
    """:class:`~agentfly_gym.rollout.policies.base.TextPolicy` over an in-process vLLM engine.

    Args:
        model: model name or local folder.
        tensor_parallel_size, gpu_memory_utilization, max_model_len: as ``vllm serve``.
        engine_kwargs: further ``AsyncEngineArgs`` fields.

    Raises:
        ResourceUnavailable: vLLM is not installed or no GPU is visible.
    """

    def __init__(self, model: str, *, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.8,
                 max_model_len: int | None = None, **engine_kwargs: Any) -> None:
        try:
            import torch
            from vllm import AsyncEngineArgs, AsyncLLMEngine
        except ImportError as e:
            raise ResourceUnavailable(f"VLLMPolicy needs vLLM (pip install vllm) and a GPU: {e}") from e
        if not torch.cuda.is_available():
            raise ResourceUnavailable("VLLMPolicy needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
        args = AsyncEngineArgs(model=model, tensor_parallel_size=tensor_parallel_size,
                               gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                               **engine_kwargs)
        self.engine = AsyncLLMEngine.from_engine_args(args)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        t0 = time.monotonic()
        sp = VSamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                             top_k=sampling.top_k if sampling.top_k > 0 else -1, seed=sampling.seed, logprobs=0,
                             stop_token_ids=list(sampling.stop_token_ids) or None, skip_special_tokens=False)
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), sp,
                                              request_id=f"afg-{next(_ids)}"):
            final = out
        if final is None or not final.outputs:
            raise PolicyError("vLLM returned no output")
        o = final.outputs[0]
        ids = list(o.token_ids)
        logprobs = None
        if o.logprobs is not None:
            logprobs = [float(step[tok].logprob) for step, tok in zip(o.logprobs, ids)]
        finish = "length" if o.finish_reason == "length" else "stop"
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish,
                          text=self.tokenizer.decode(ids, skip_special_tokens=True), latency=time.monotonic() - t0)

    def close(self) -> None:
        """Shut the engine down."""
        shutdown = getattr(self.engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
