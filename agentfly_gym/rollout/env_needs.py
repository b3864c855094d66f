"""What a policy needs of an environment's configuration, turned on where the env is made.

A scripted policy may rely on something an env gives only on request: the random policy chooses among
``info["admissible_actions"]``, which ScienceWorld lists only with ``with_admissible_actions=True`` (off
by default: it costs 5-300 ms per step).  :func:`policy_env_kwargs` is applied by
:func:`~agentfly_gym.rollout.episode.play_episode`, so the library's runners behave as the CLI does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import gymnasium

__all__ = ["policy_env_kwargs"]


def policy_env_kwargs(policy: Any, env_id: str, env_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env_kwargs`` plus what ``policy`` needs of the env: a policy with ``needs_admissible_actions``
    (the random policy) turns on ``with_admissible_actions`` in an env whose constructor takes it
    (ScienceWorld lists its valid actions only on request), unless ``env_kwargs`` set it."""
    kwargs = dict(env_kwargs or {})
    if getattr(policy, "needs_admissible_actions", False) and "with_admissible_actions" not in kwargs:
        try:
            entry = gymnasium.spec(env_id).entry_point
            cls = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
            takes = "with_admissible_actions" in inspect.signature(cls).parameters
        except Exception:  # noqa: BLE001  (an unknown id fails where the env is made, with its own message)
            takes = False
        if takes:
            kwargs["with_admissible_actions"] = True
    return kwargs
