"""Instructions and action parsing for language-model agents, one :class:`AgentPrompt` per environment.

The environment owns its action format, so it also owns the prompt that teaches a
model that format and the lenient parser that extracts an action from model text.
Rollout code reads ``env.unwrapped.agent_prompt``.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["AgentPrompt", "extract_action"]

_ACTION_RE = re.compile(r"(?:^|\n)\s*(?:\*\*)?action(?:\*\*)?\s*[:=]\s*(.+)", re.IGNORECASE)
_FENCE_RE = re.compile(r"```(?:\w+)?\s*\n?(.*?)```", re.DOTALL)


def extract_action(text: str) -> str:
    """The action in a model's reply, parsed leniently.

    Rules, in order: the last ``Action: ...`` line (case-insensitive, ``**Action**:`` too);
    else the content of the last fenced code block; else the last non-empty line.  Surrounding
    quotes, backticks and whitespace are stripped.  Returns ``""`` for an empty reply.

    >>> extract_action("I should search.\\nAction: search[red shoes]")
    'search[red shoes]'
    """
    matches = _ACTION_RE.findall(text)
    if matches:
        candidate = matches[-1]
    else:
        fences = _FENCE_RE.findall(text)
        if fences and fences[-1].strip():
            candidate = fences[-1].strip().splitlines()[-1]
        else:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            candidate = lines[-1] if lines else ""
    return candidate.strip().strip("`\"'").strip()


@dataclasses.dataclass(frozen=True)
class AgentPrompt:
    """What an LM agent is told about an environment.

    Attributes:
        system: the system message: the task family, the action format, and the
            instruction to end each reply with ``Action: <action>``.
        first_user_template: format of the first user message; ``{observation}`` is replaced
            by the reset observation.
        turn_user_template: format of later user messages; ``{observation}`` is the step observation.
    """

    system: str
    first_user_template: str = "{observation}"
    turn_user_template: str = "{observation}"

    def first_message(self, observation: str) -> str:
        return self.first_user_template.format(observation=observation)

    def turn_message(self, observation: str) -> str:
        return self.turn_user_template.format(observation=observation)

    def parse_action(self, text: str) -> str:
        """The action in ``text`` (see :func:`extract_action`)."""
        return extract_action(text)
