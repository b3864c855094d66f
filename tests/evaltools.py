"""A small tool environment for the evaluation tests, registered by ``tests.evaltools:make_env`` (what
``agentfly-gym eval --env tests.evaltools:make_env`` names).

Tasks (each a real :func:`~agentfly_gym.tools.make_tool_env` row; the reward is an exact match of the final
answer):

* ``right``: the expert calls ``add`` then answers correctly: every sample succeeds;
* ``wrong``: the expert answers wrongly without a call: no sample succeeds;
* ``half``: the expert alternates right and wrong answers over the process (``HALF``): k even -> c = k / 2;
* ``broken``: the reward function raises: every sample is an infrastructure error (``reward_error``).

``PLAYS`` counts the expert's first replies per task (one per episode played), so a test can tell what a re-run
played again.
"""

from __future__ import annotations

import itertools
from collections import Counter

from agentfly_gym.tools import make_tool_env, tool
from agentfly_gym.tools.formats import format_tool_call

ENV_ID = "evaltest/Arith-v0"
PLAYS: Counter = Counter()
HALF = itertools.count()

TASKS = [
    {"id": "right", "prompt": "What is 2+3?", "answer": "5"},
    {"id": "wrong", "prompt": "What is 4+4?", "answer": "8"},
    {"id": "half", "prompt": "What is 1+1?", "answer": "2"},
    {"id": "broken", "prompt": "What is 0+0?", "answer": "0"},
]


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def exact(completion: str, answer: str, id: str) -> float:
    if id == "broken":
        raise RuntimeError("the grader is down")
    return 1.0 if completion.strip() == answer else 0.0


def expert(row: dict, messages: list) -> str:
    replies = sum(1 for m in messages if m["role"] == "assistant")
    if replies == 0:
        PLAYS[row["id"]] += 1
    if row["id"] == "right":
        return format_tool_call("add", {"a": 2, "b": 3}) if replies == 0 else messages[-1]["content"]
    if row["id"] == "half":
        return "2" if next(HALF) % 2 == 0 else "3"
    return "7" if row["id"] == "wrong" else "0"


def make_env() -> str:
    """Register the env (once per process) and return its id."""
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        make_tool_env(ENV_ID, tasks=TASKS, tools=[add], reward=exact, expert=expert, max_turns=3)
    return ENV_ID
