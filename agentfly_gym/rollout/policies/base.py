"""The policy protocol: token IDs in, sampled token IDs (with logprobs) out.

Token IDs are the unit of exchange between inference and training (AgentFly, section 3):
a policy returns exactly the ids it sampled, and the rollout stores them verbatim.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from ...limits import check_int

__all__ = ["SamplingParams", "Generation", "TextPolicy", "ActionPolicy", "ChatPolicy", "check_policy", "is_chat_policy",
           "take_turn"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one reply.

    Attributes:
        max_tokens: most new tokens.
        temperature: 0 means greedy.
        top_p: nucleus mass in (0, 1].
        top_k: 0 or -1 disables.
        seed: per-request seed, for reproducible sampling where the backend supports it.
        stop_token_ids: extra ids that end generation (the tokenizer's eos always does).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        import math

        from ...errors import ConfigError

        check_int("max_tokens", self.max_tokens)
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p!r} must be in (0, 1]")
        check_int("top_k", self.top_k, minimum=-1, unit="0 or -1 disable it")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Generation:
    """One sampled reply.

    Attributes:
        token_ids: the sampled ids, exactly as generated (length n, the stop token included
            when generation stopped on one).
        logprobs: per sampled id, the log-probability under the sampling distribution
            (length n), or None when the policy has none (e.g. a scripted baseline).
        finish_reason: ``"stop"`` (a stop/eos token was sampled) or ``"length"`` (max_tokens hit).
        text: the decoded reply, for parsing the action only (never re-tokenized).
        latency: seconds the request took, queueing included.
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    text: str = ""
    latency: float = 0.0


@runtime_checkable
class TextPolicy(Protocol):
    """A language-model policy over token ids.

    ``tokenizer`` is a Hugging Face tokenizer with a chat template (the rollout renders
    prompts with it).
    """

    tokenizer: Any

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one reply to ``prompt_ids``."""
        ...


@runtime_checkable
class ActionPolicy(Protocol):
    """A policy that needs no model: picks an action string from the observation and info
    (random admissible action, an environment's expert).  The rollout tokenizes its action
    with the chat tokenizer, and stores no logprobs."""

    async def act(self, observation: str, info: dict[str, Any], env: Any) -> str:
        """The next action for ``env`` (the unwrapped env, for experts that need its state)."""
        ...


@runtime_checkable
class ChatPolicy(Protocol):
    """A policy over chat messages (an OpenAI-compatible endpoint,
    :class:`~agentfly_gym.rollout.policies.endpoint_policy.EndpointPolicy`): the conversation and the env's
    tools in, a :class:`~agentfly_gym.rollout.policies.endpoint_policy.ChatReply` out.  Played in chain mode by
    :func:`~agentfly_gym.rollout.chat_episode.run_chat_episode`; its trajectories hold token ids only where
    the server returned them (``text_only`` otherwise)."""

    async def complete(self, messages: Any, *, tools: Any = (), sampling: SamplingParams | None = None) -> Any:
        """The reply to ``messages``."""
        ...


def is_chat_policy(policy: Any) -> bool:
    """True for a :class:`ChatPolicy` (it has ``complete`` and neither ``generate`` nor ``act``)."""
    return callable(getattr(policy, "complete", None)) and not hasattr(policy, "generate") \
        and not hasattr(policy, "act")


def check_policy(policy: Any) -> bool:
    """True for a :class:`TextPolicy`, False for an :class:`ActionPolicy`.

    Raises:
        PolicyError: it is neither (no ``generate`` and no ``act``).
    """
    from ...errors import PolicyError

    if hasattr(policy, "generate"):
        return True
    if hasattr(policy, "act"):
        return False
    if is_chat_policy(policy):
        raise PolicyError(f"{type(policy).__name__} is a ChatPolicy (messages in, a reply out): it plays chain mode "
                          "through play_episode / run_chat_episode, not a token-id turn loop")
    raise PolicyError(f"{type(policy).__name__} is neither a TextPolicy (generate) nor an ActionPolicy (act)")


async def take_turn(policy: Any, chat: Any, prompt_ids: list[int], sampling: SamplingParams, observation: str,
                    info: dict[str, Any], env: Any) -> tuple[list[int], list[float] | None, str, str]:
    """One policy turn: ``(sampled_ids, logprobs, finish_reason, reply_text)``.

    A TextPolicy samples from ``prompt_ids`` (ids returned verbatim); an ActionPolicy's action
    text becomes ``chat.action_ids(text)`` with no logprobs and finish reason ``"action"``.
    """
    if check_policy(policy):
        gen = await policy.generate(prompt_ids, sampling)
        sampled = list(gen.token_ids)
        reply = gen.text or chat.tokenizer.decode(sampled, skip_special_tokens=True)
        return sampled, gen.logprobs, gen.finish_reason, reply
    reply = await policy.act(observation, info, env)
    return list(chat.action_ids(reply)), None, "action", reply
