"""An LLM-as-judge reward over a model API held in global scope.

The judge asks the model to grade an answer against a reference on a 0-10 scale and
returns ``score / 10`` in [0, 1].  The prompt follows the common "single answer grading"
format of MT-Bench's judge (Zheng et al., 2023): the verdict is read from ``[[N]]``.
"""

from __future__ import annotations

import logging
import re

from ..resources.protocol import Manager
from ..resources.spec import ModelAPISpec
from .resourced import resourced

__all__ = ["LLMJudge", "parse_score", "JUDGE_PROMPT"]

log = logging.getLogger(__name__)

JUDGE_PROMPT = (
    "Please act as an impartial judge and rate how well the answer solves the task, comparing it with the "
    "reference. Reply with a short explanation, then your rating from 0 to 10 strictly in the format [[rating]], "
    "for example [[7]].\n\n[Task]\n{task}\n\n[Reference]\n{reference}\n\n[Answer]\n{answer}"
)

_BRACKET = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]")
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(?:/\s*10)?")


def parse_score(text: str, *, scale: float = 10.0) -> float | None:
    """The rating in a judge reply, scaled to [0, 1], or None if there is none.

    ``[[N]]`` wins; else the first number in [0, scale].  Values are clipped to [0, 1].
    """
    m = _BRACKET.search(text)
    candidates = [m.group(1)] if m else _NUMBER.findall(text)
    for c in candidates:
        v = float(c)
        if 0 <= v <= scale:
            return min(1.0, max(0.0, v / scale))
    return None


class LLMJudge:
    """Grades answers with a chat model behind ``spec`` (global scope: one client for all rollouts).

    Args:
        spec: the judge endpoint; ``spec.max_instances`` bounds concurrent judge requests.
        default: reward when the reply holds no rating (logged).
        max_tokens: judge reply budget.
    """

    def __init__(self, spec: ModelAPISpec, *, default: float = 0.0, max_tokens: int = 128) -> None:
        self.spec = spec
        self.default = default
        self.max_tokens = max_tokens
        self.last_reply = ""

        @resourced(scope="global", api=spec)
        async def _grade(task: str, answer: str, reference: str, *, api) -> float:
            reply = await api.chat([{"role": "user", "content": JUDGE_PROMPT.format(
                task=task, reference=reference, answer=answer)}], max_tokens=self.max_tokens, temperature=0.0)
            self.last_reply = reply
            score = parse_score(reply)
            if score is None:
                log.info("judge reply had no rating; reward %.2f: %r", self.default, reply[:200])
                return self.default
            return score

        self._grade = _grade

    async def __call__(self, task: str, answer: str, reference: str, *, manager: Manager) -> float:
        """The judged reward in [0, 1]."""
        return await self._grade(task, answer, reference, manager=manager)
