"""A :class:`~agentfly_gym.rollout.policies.base.TextPolicy` over verl's server manager.

verl 0.9.1 hands every agent loop an ``LLMServerClient`` whose
``await generate(request_id, prompt_ids=..., sampling_params=...)`` returns a ``TokenOutput``
(``token_ids``, ``log_probs``, ``stop_reason``, ``num_preempted``, ``extra_fields``;
``verl/workers/rollout/replica.py``).  :class:`VerlServerPolicy` adapts it to the project's
``TextPolicy.generate(prompt_ids, sampling) -> Generation`` so that
:func:`~agentfly_gym.rollout.chain.run_chain_episode` and
:func:`~agentfly_gym.rollout.step.run_step_episode` drive verl's inference servers unchanged,
keeping the sampled ids verbatim.

It also enforces verl's sequence limits at generation time, so what the server sees is exactly
what the trainer will see:

* prompt: a prompt longer than ``prompt_length`` tokens is cut from the left before it is sent
  (verl's own loops cut the same side, ``AgentLoopBase._cap_text_prompt_length``); in chain
  mode the cut is fixed by the first (initial) prompt and applied to every later call, whose
  prompt is the initial prompt followed by the response so far.  (The agent loop's step-mode
  prompts arrive already fitted by :func:`agentfly_gym.rollout.step.fit_step_prompt`, which keeps
  the system prompt; the left cut is then only a safeguard.)
* response (chain mode): each call's ``max_tokens`` is capped by what is left of
  ``response_length`` (at least 1 token, as vLLM requires); the agent loop cuts the finished
  response to ``response_length``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from agentfly_gym.errors import ConfigError, PolicyError
from agentfly_gym.limits import check_int
from agentfly_gym.rollout.policies.base import Generation, SamplingParams

__all__ = ["VerlServerPolicy"]

log = logging.getLogger(__name__)


class VerlServerPolicy:
    """One trajectory's policy over verl's server manager (build one per trajectory).

    Args:
        server_manager: verl's ``LLMServerClient`` (``AgentLoopBase.server_manager``), or any
            object with the same ``async generate(request_id, *, prompt_ids, sampling_params,
            **kw) -> TokenOutput``.
        tokenizer: the Hugging Face tokenizer of the served model (decodes replies for action
            parsing only; ids are never re-encoded).
        request_id: the id of every request of this trajectory (sticky routing and prefix
            caching on one server).
        sampling_params: verl's per-request sampling dict (``temperature``, ``top_p``,
            ``top_k``, ``repetition_penalty``, ``logprobs``, ...), forwarded unchanged but for
            ``max_tokens``.
        mode: ``"chain"`` (later prompts extend the first one) or ``"step"`` (every prompt is fresh).
        prompt_length: verl's ``rollout.prompt_length`` (tokens).
        response_length: verl's ``rollout.response_length`` (tokens).
        extra_generate_kwargs: further keyword arguments for every ``generate`` call (e.g.
            ``priority``).

    Attributes:
        calls: one dict per ``generate`` call: ``prompt_ids`` (as sent), ``token_ids``,
            ``log_probs``, ``stop_reason``, ``max_tokens``.
        prompt_cut: chain mode: tokens cut from the left of every prompt (0 when the initial
            prompt fits).
        num_preempted: sum over calls of the server's preemption count, or -1 if none reported.
        min_global_steps, max_global_steps: the model-weights versions reported by the server
            (first and last call), or None.
        generate_s: seconds spent in ``generate``.

    Raises:
        ConfigError: bad mode or lengths.
    """

    tokenizer: Any

    def __init__(self, server_manager: Any, tokenizer: Any, *, request_id: str, sampling_params: dict[str, Any],
                 mode: str = "chain", prompt_length: int, response_length: int,
                 extra_generate_kwargs: dict[str, Any] | None = None) -> None:
        if mode not in ("chain", "step"):
            raise ConfigError(f"mode={mode!r} is not one of 'chain', 'step'")
        for name, v in (("prompt_length", prompt_length), ("response_length", response_length)):
            check_int(name, v, unit="tokens")
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.request_id = request_id
        self.sampling_params = dict(sampling_params)
        self.mode = mode
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.extra_generate_kwargs = dict(extra_generate_kwargs or {})
        self.calls: list[dict[str, Any]] = []
        self.prompt_cut = 0
        self._initial_len: int | None = None
        self.num_preempted = -1
        self.min_global_steps: Any = None
        self.max_global_steps: Any = None
        self.generate_s = 0.0

    def cut_for(self, prompt_len: int) -> int:
        """Tokens cut from the left of a fresh prompt of ``prompt_len`` tokens (step mode rule)."""
        return max(0, prompt_len - self.prompt_length)

    def remaining_response_tokens(self, prompt_ids_len: int) -> int:
        """Chain mode: tokens of ``response_length`` not yet used when the policy is asked to
        continue a sequence of ``prompt_ids_len`` tokens (may be <= 0)."""
        if self._initial_len is None:
            return self.response_length
        return self.response_length - (prompt_ids_len - self._initial_len)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one reply from verl's server.

        Args:
            prompt_ids: the full prompt (chain mode: initial prompt + response so far).
            sampling: its ``max_tokens`` is the per-turn cap; the other fields are ignored
                (verl's ``sampling_params`` decide).

        Returns:
            A :class:`Generation` with the server's ``token_ids`` verbatim, its ``log_probs``
            (None when the server sent none), ``finish_reason`` ``"length"`` when the reply used
            its whole ``max_tokens``, ``"aborted"`` when the server aborted it, else ``"stop"``.

        Raises:
            PolicyError: the server returned a malformed output (logprobs not aligned with ids).
        """
        ids = [int(t) for t in prompt_ids]
        max_tokens = int(sampling.max_tokens)
        if self.mode == "chain":
            if self._initial_len is None:
                self._initial_len = len(ids)
                self.prompt_cut = max(0, len(ids) - self.prompt_length)
                if self.prompt_cut:
                    log.warning("initial prompt of %d tokens exceeds rollout.prompt_length=%d; the first %d tokens "
                                "are cut (for generation and training alike)", len(ids), self.prompt_length,
                                self.prompt_cut)
            max_tokens = max(1, min(max_tokens, self.remaining_response_tokens(len(ids))))
            sent = ids[self.prompt_cut:]
        else:
            cut = self.cut_for(len(ids))
            if cut:
                log.warning("step prompt of %d tokens exceeds rollout.prompt_length=%d; the first %d tokens are cut",
                            len(ids), self.prompt_length, cut)
            max_tokens = max(1, min(max_tokens, self.response_length))
            sent = ids[cut:]
        params = dict(self.sampling_params)
        params["max_tokens"] = max_tokens
        t0 = time.monotonic()
        out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=sent, sampling_params=params,
                                                 **self.extra_generate_kwargs)
        latency = time.monotonic() - t0
        self.generate_s += latency
        token_ids = [int(t) for t in out.token_ids]
        log_probs = None if out.log_probs is None else [float(x) for x in out.log_probs]
        if log_probs is not None and len(log_probs) != len(token_ids):
            if not token_ids and not log_probs:
                pass
            elif len(log_probs) == 0:
                log_probs = None
            else:
                raise PolicyError(f"server returned {len(log_probs)} logprobs for {len(token_ids)} token ids "
                                  f"(request {self.request_id})")
        if log_probs is not None and any(math.isnan(x) for x in log_probs):
            raise PolicyError(f"server returned NaN logprobs (request {self.request_id})")
        if getattr(out, "num_preempted", None) is not None:
            self.num_preempted = max(self.num_preempted, 0) + int(out.num_preempted)
        extra = getattr(out, "extra_fields", None) or {}
        steps = extra.get("min_global_steps", extra.get("global_steps"))
        if steps is not None and self.min_global_steps is None:
            self.min_global_steps = steps
        steps = extra.get("max_global_steps", extra.get("global_steps"))
        if steps is not None:
            self.max_global_steps = steps
        stop = getattr(out, "stop_reason", None)
        if stop == "aborted":
            finish = "aborted"
        elif len(token_ids) >= max_tokens:
            finish = "length"
        else:
            finish = "stop"
        self.calls.append({"prompt_ids": sent, "token_ids": token_ids, "log_probs": log_probs, "stop_reason": stop,
                           "max_tokens": max_tokens})
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return Generation(token_ids=token_ids, logprobs=log_probs, finish_reason=finish, text=text, latency=latency)
