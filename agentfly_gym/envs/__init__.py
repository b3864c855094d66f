"""Environments: one module or package per environment (simulator side and Gymnasium side)."""

from .base import AgentFlyEnv, StepResult
from .prompting import AgentPrompt, extract_action

__all__ = ["AgentFlyEnv", "AgentPrompt", "StepResult", "extract_action"]
