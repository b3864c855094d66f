"""A token-faithful policy over an OpenAI-compatible server (vLLM's ``/v1/completions``).

Request (vLLM >= 0.10.2 field names)::

    POST {base_url}/completions
    {"model": M, "prompt": [<prompt token ids>], "max_tokens": N, "temperature": T, "top_p": P,
     "top_k": K, "seed": S, "logprobs": 0, "return_token_ids": true, "return_tokens_as_token_ids": true,
     "skip_special_tokens": false, "stop_token_ids": [...]}

The prompt goes out as token ids (never re-rendered), and the sampled ids come back in
``choices[0].token_ids`` (``return_token_ids``); older servers are read through
``choices[0].logprobs.tokens`` entries of the form ``"token_id:<id>"``
(``return_tokens_as_token_ids``).  Logprobs are ``choices[0].logprobs.token_logprobs``.
A server that returns neither (e.g. ``transformers serve``, OpenAI's own API) is refused with
:class:`~agentfly_gym.errors.PolicyError`: recovering ids by re-tokenizing the text would
bring back the drift that token-id rollouts exist to avoid.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import PolicyError
from .base import Generation, SamplingParams

__all__ = ["OpenAITokenPolicy", "parse_completion_choice"]


def parse_completion_choice(choice: dict[str, Any]) -> tuple[list[int], list[float] | None]:
    """Sampled ids and logprobs from one ``/v1/completions`` choice.

    Raises:
        PolicyError: the choice carries no token ids.
    """
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None:
        toks = lp.get("tokens")
        if toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
            ids = [int(t.split(":", 1)[1]) for t in toks]
    if ids is None:
        raise PolicyError("the server returned no token ids (it needs vLLM's return_token_ids or "
                          "return_tokens_as_token_ids); refusing to re-tokenize text, which drifts")
    if logprobs is not None:
        logprobs = [float(x) if x is not None else float("nan") for x in logprobs]
        if len(logprobs) != len(ids):
            raise PolicyError(f"the server returned {len(logprobs)} logprobs for {len(ids)} token ids")
    return [int(i) for i in ids], logprobs


class OpenAITokenPolicy:
    """:class:`~agentfly_gym.rollout.policies.base.TextPolicy` over an OpenAI-compatible server.

    Args:
        api: a started :class:`~agentfly_gym.resources.backends.model_api.ModelAPIResource`
            (concurrency bound and retries), e.g. ``await manager.acquire_global(ModelAPISpec(...))``
            pointing at ``ModelServiceResource.base_url``.
        tokenizer: the served model's Hugging Face tokenizer (used for rendering prompts and
            decoding replies for display only).
    """

    def __init__(self, api: Any, tokenizer: Any) -> None:
        self.api = api
        self.tokenizer = tokenizer

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        t0 = time.monotonic()
        payload: dict[str, Any] = {
            "model": self.api.spec.model, "prompt": list(prompt_ids), "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
        }
        if sampling.top_k and sampling.top_k > 0:
            payload["top_k"] = sampling.top_k
        if sampling.seed is not None:
            payload["seed"] = sampling.seed
        if sampling.stop_token_ids:
            payload["stop_token_ids"] = list(sampling.stop_token_ids)
        from ...resources.backends.model_api import APIError

        try:
            data = await self.api.post("completions", payload)
        except APIError as e:
            if 400 <= e.status < 500 and "token" in str(e).lower():
                raise PolicyError(f"the server refused token-id fields ({e}); it cannot serve a token-faithful "
                                  "policy (vLLM >= 0.10.2 can; re-tokenizing text would drift)") from e
            raise
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError) as e:
            raise PolicyError(f"unexpected completion answer: {str(data)[:300]}") from e
        ids, logprobs = parse_completion_choice(choice)
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish, text=text,
                          latency=time.monotonic() - t0)
