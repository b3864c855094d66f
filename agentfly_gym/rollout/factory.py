"""Old import path of :mod:`agentfly_gym.rollout.policies.factory` (kept for existing imports)."""

from .policies.factory import POLICY_NAMES, make_policy

__all__ = ["make_policy", "POLICY_NAMES"]
