"""Helpers of the gateway's tests: a spy over a real policy, and a scripted policy for tool-call flows."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

from agentfly_gym.rollout.policies.base import Generation, SamplingParams


class Spy:
    """A real :class:`TextPolicy` with a log of every call: ``(prompt_ids, sampled ids, logprobs)`` as the policy
    saw and returned them (what the gateway must record, id for id).  Not a fake: generation is the policy's."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.tokenizer = policy, policy.tokenizer
        self.calls: list[tuple[list[int], list[int], list[float] | None]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        gen = await self.policy.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), list(gen.token_ids), None if gen.logprobs is None else list(gen.logprobs)))
        return gen


class ScriptedPolicy:
    """A fake TextPolicy: it writes the reply ``script(prompt_text)`` returns (ids: the tokenizer's encoding of the
    text and the end-of-turn id; logprob -0.25 each).  Used where a CPU-sized real model cannot be made to emit
    well-formed tool calls (the agent frameworks' tool loops); every other test uses the real tiny model.
    ``release`` (an :class:`asyncio.Event`) may hold replies back, for hang tests."""

    def __init__(self, chat: Any, script: Callable[[str], str]) -> None:
        self.chat, self.tokenizer, self.script = chat, chat.tokenizer, script
        self.calls: list[tuple[list[int], list[int], list[float]]] = []
        self.release: asyncio.Event | None = None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if self.release is not None:
            await self.release.wait()
        text = self.script(self.tokenizer.decode(prompt_ids))
        ids = self.chat.encode(text)[: sampling.max_tokens - 1] + [self.chat.eot_token_id]
        lps = [-0.25] * len(ids)
        self.calls.append((list(prompt_ids), ids, lps))
        return Generation(token_ids=ids, logprobs=lps, finish_reason="stop", text="")


def tool_call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def add_then_answer(final: Callable[[str], str]) -> Callable[[str], str]:
    """A script: call ``add(2, 3)`` until a tool result is in the prompt (a ``<tool_response>`` block, or
    smolagents' ``Observation:`` message), then answer ``final(result)``."""
    def script(prompt: str) -> str:
        results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", prompt, re.DOTALL) \
            or re.findall(r"<\|im_start\|>user\nObservation:\s*(.*?)\s*<\|im_end\|>", prompt, re.DOTALL)
        if not results:
            return "Let me add.\n" + tool_call("add", {"a": 2, "b": 3})
        return final(results[-1])
    return script
