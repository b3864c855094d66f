"""Policies that need no model, for tests and benchmarks."""

from __future__ import annotations

import random
from typing import Any

from ...errors import NoExpert, PolicyError

__all__ = ["RandomPolicy", "ExpertPolicy"]


class RandomPolicy:
    """Uniformly random choice among ``info["admissible_actions"]``, else among the env's ``random_actions``.

    An env with a free-text action space (R2E-Gym) lists no admissible actions; it may instead name a few
    well-formed actions in a ``random_actions`` attribute (a sequence of str) for this policy to choose among.

    Args:
        seed: seeds the policy's own ``random.Random``.
        fallback: action used when the env lists neither; ``None`` raises.

    Raises (from :meth:`act`):
        PolicyError: the env gives no admissible actions, has no ``random_actions`` and no fallback is set.
    """

    #: the library's runners turn on an env's ``with_admissible_actions`` for this policy
    #: (:func:`~agentfly_gym.rollout.env_needs.policy_env_kwargs`)
    needs_admissible_actions = True

    def __init__(self, seed: int | None = None, fallback: str | None = None) -> None:
        self._rng = random.Random(seed)
        self.fallback = fallback

    async def act(self, observation: str, info: dict[str, Any], env: Any) -> str:
        actions = info.get("admissible_actions") or getattr(getattr(env, "unwrapped", env), "random_actions", None)
        if not actions:
            if self.fallback is None:
                raise PolicyError(f"{type(env).__name__} gives no admissible_actions; RandomPolicy needs them "
                                  "(pass fallback=... or enable the env's admissible actions)")
            return self.fallback
        return self._rng.choice(list(actions))


class ExpertPolicy:
    """The environment's own expert (``await env.expert_action()``): gold paths, planners, Stockfish.

    Raises (from :meth:`act`):
        PolicyError: the environment has no expert.
    """

    async def act(self, observation: str, info: dict[str, Any], env: Any) -> str:
        try:
            return await env.unwrapped.expert_action()
        except NoExpert as e:
            raise PolicyError(str(e)) from e
