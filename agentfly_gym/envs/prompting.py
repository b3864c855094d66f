"""Instructions and action parsing for language-model agents, one :class:`AgentPrompt` per environment.

The environment owns its action format, so it also owns the prompt that teaches a
model that format and the lenient parser that extracts an action from model text.
Rollout code reads ``env.unwrapped.agent_prompt``.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["AgentPrompt", "extract_action"]

# Parsing runs on every reply, on the event loop, so it is linear in the reply's length.  The regexes
# this module used before, ``(?:^|\n)\s*(?:\*\*)?action(?:\*\*)?\s*[:=]\s*(.+)`` and a fence pattern
# with a lazy ``(.*?)`` body, took seconds on 20,000 newlines or on an unclosed fence, holding the
# GIL.  The functions below return exactly what ``re.findall`` returned with them (pinned by property
# tests in tests/test_action_parsing.py): regexes only find anchors, ``str.find`` does the rest.
_ACTION_KEY_RE = re.compile(r"(?:\*\*)?action(?:\*\*)?\s*[:=]", re.IGNORECASE)
_WORD_SPACE_RE = re.compile(r"\w*\s*")
_SPACE_RE = re.compile(r"\s*")
_FENCE = "```"


def _action_lines(text: str) -> list[str]:
    """The values of ``Action: <value>`` lines, in order (``findall`` of the former regex)."""
    out: list[str] = []
    end = 0  # the previous match's end: matches do not overlap
    for m in _ACTION_KEY_RE.finditer(text):
        k = m.start()
        if k < end:
            continue
        # the key must begin a line: only whitespace, holding a newline, since the text's start or a newline
        j = k
        while j > end and text[j - 1].isspace():
            j -= 1
        if not (j == 0 or "\n" in text[j:k]):
            continue
        v = _SPACE_RE.match(text, m.end()).end()
        if v < len(text):
            nl = text.find("\n", v)
            end = len(text) if nl < 0 else nl
            out.append(text[v:end])
        else:  # only whitespace follows: ".+" takes its last character that is not a newline
            tail = text[m.end():].rstrip("\n")
            if tail:
                out.append(tail[-1])
            end = len(text)
    return out


def _fence_bodies(text: str) -> list[str]:
    """The contents of fenced code blocks, in order, without the info word (``findall`` of the former regex)."""
    out: list[str] = []
    i = text.find(_FENCE)
    while i >= 0:
        body = _WORD_SPACE_RE.match(text, i + 3).end()
        close = text.find(_FENCE, body)
        if close < 0:
            break
        out.append(text[body:close])
        i = text.find(_FENCE, close + 3)
    return out


def extract_action(text: str) -> str:
    """The action in a model's reply, parsed leniently.

    Rules, in order: the last ``Action: ...`` line (case-insensitive, ``**Action**:`` too);
    else the content of the last fenced code block; else the last non-empty line.  Surrounding
    quotes, backticks and whitespace are stripped.  Returns ``""`` for an empty reply.  Takes time
    linear in ``len(text)``.

    >>> extract_action("I should search.\\nAction: search[red shoes]")
    'search[red shoes]'
    """
    matches = _action_lines(text)
    if matches:
        candidate = matches[-1]
    else:
        fences = _fence_bodies(text)
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
        tools: OpenAI function schemas the model may call natively (rendered by the chat template's ``tools=``;
            see :mod:`agentfly_gym.tools`); empty for environments whose actions are text.
    """

    system: str
    first_user_template: str = "{observation}"
    turn_user_template: str = "{observation}"
    tools: tuple = ()

    def first_message(self, observation: str) -> str:
        return self.first_user_template.format(observation=observation)

    def turn_message(self, observation: str) -> str:
        return self.turn_user_template.format(observation=observation)

    def turn_messages(self, observation: str, info: dict | None = None) -> list[dict]:
        """The messages that carry a step's observation to the model: one user message (:meth:`turn_message`);
        a tool environment's prompt returns the step's ``role: "tool"`` messages instead."""
        return [{"role": "user", "content": self.turn_message(observation)}]

    def parse_action(self, text: str) -> str:
        """The action in ``text`` (see :func:`extract_action`)."""
        return extract_action(text)
