"""Environments: one module or package per environment (simulator side and Gymnasium side)."""

from typing import TYPE_CHECKING

from ..utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on first
    # use (agentfly_gym.utils.lazy), so reading one env's data files imports no env base or resource manager
    from .base import AgentFlyEnv, StepResult
    from .prompting import AgentPrompt, extract_action

__getattr__, __dir__ = lazy_exports(__name__, {"AgentFlyEnv": "base", "StepResult": "base",
                                               "AgentPrompt": "prompting", "extract_action": "prompting"})

__all__ = ["AgentFlyEnv", "AgentPrompt", "StepResult", "extract_action"]
