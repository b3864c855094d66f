"""Old import path of :mod:`agentfly_gym.rollout.policies.transformers_policy` (kept for existing imports)."""

from .policies.transformers_policy import TransformersPolicy

__all__ = ["TransformersPolicy"]
