"""Rewards computed outside the environment (e.g. by an LLM judge), declared with their resources."""

from .judge import LLMJudge, parse_score
from .resourced import resourced

__all__ = ["LLMJudge", "parse_score", "resourced"]
