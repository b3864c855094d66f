"""Policies: what picks the next reply of an episode.

* :mod:`.base`: the protocols (:class:`TextPolicy` over token ids, :class:`ActionPolicy` for scripted
  actions), :class:`SamplingParams`, :class:`Generation`, and :func:`take_turn` (one turn of either kind);
* :mod:`.baselines`: :class:`RandomPolicy` and :class:`ExpertPolicy` (no model);
* :mod:`.transformers_policy`: :class:`~.transformers_policy.TransformersPolicy` (in-process, CPU default);
* :mod:`.vllm_policy`: :class:`~.vllm_policy.VLLMPolicy` (in-process vLLM, GPU);
* :mod:`.openai_policy`: :class:`~.openai_policy.OpenAITokenPolicy` (any OpenAI-compatible server);
* :mod:`.factory`: :func:`~.factory.make_policy` (a policy and its chat tokenizer from a short name).

The model-backed policies are imported from their modules only (they load torch / vLLM / httpx).
"""

from .base import ActionPolicy, Generation, SamplingParams, TextPolicy, check_policy, take_turn
from .baselines import ExpertPolicy, RandomPolicy

__all__ = ["ActionPolicy", "ExpertPolicy", "Generation", "RandomPolicy", "SamplingParams", "TextPolicy",
           "check_policy", "take_turn"]
