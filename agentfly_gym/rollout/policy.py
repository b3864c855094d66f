"""Old import path of :mod:`agentfly_gym.rollout.policies.base` (kept for existing imports)."""

from .policies.base import ActionPolicy, Generation, SamplingParams, TextPolicy, check_policy, take_turn

__all__ = ["SamplingParams", "Generation", "TextPolicy", "ActionPolicy", "check_policy", "take_turn"]
