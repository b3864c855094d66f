"""Old import path of :mod:`agentfly_gym.rollout.policies.vllm_policy` (kept for existing imports)."""

from .policies.vllm_policy import VLLMPolicy

__all__ = ["VLLMPolicy"]
