"""Old import path of :mod:`agentfly_gym.rollout.policies.openai_policy` (kept for existing imports)."""

from .policies.openai_policy import OpenAITokenPolicy, parse_completion_choice

__all__ = ["OpenAITokenPolicy", "parse_completion_choice"]
