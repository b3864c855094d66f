"""Gymnasium registration of every agentfly-gym environment, declared in one place.

``import agentfly_gym`` calls :func:`register_envs`; it only records entry-point strings,
so no environment module (and no simulator) is imported until ``gymnasium.make``.
Both ``gymnasium.make("agentfly/Chess-v0")`` (after ``import agentfly_gym``) and
``gymnasium.make("agentfly_gym:agentfly/Chess-v0")`` work.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium

__all__ = ["ENVS", "MULTIAGENT_ENVS", "register_envs", "make_vector", "make_multiagent"]

NAMESPACE = "agentfly"

#: name -> (entry point, default kwargs)
ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "Chess-v0": ("agentfly_gym.envs.chess:ChessEnv", {}),
    "ScienceWorld-v0": ("agentfly_gym.envs.scienceworld:ScienceWorldEnv", {}),
    "ALFWorld-v0": ("agentfly_gym.envs.alfworld:ALFWorldEnv", {}),
    "WebShop-v0": ("agentfly_gym.envs.webshop:WebShopEnv", {}),
    "R2EGym-v0": ("agentfly_gym.envs.r2egym:R2EGymEnv", {}),
}

#: multi-agent (PettingZoo AEC) environments: name -> (entry point, default kwargs).  PettingZoo has no
#: registry; these are made with :func:`make_multiagent` (or the module's ``env()`` / ``raw_env``).
MULTIAGENT_ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "ChessSelfPlay-v0": ("agentfly_gym.envs.chess.selfplay:ChessSelfPlayEnv", {}),
}


def make_multiagent(env_id: str, **kwargs: Any):
    """A multi-agent environment by id: ``"agentfly/ChessSelfPlay-v0"`` (``"ChessSelfPlay-v0"`` and
    ``"ChessSelfPlay"`` too), as an unwrapped PettingZoo ``AECEnv`` built with ``kwargs``.

    Raises:
        ConfigError: no multi-agent environment has that id.
    """
    from .errors import ConfigError
    from .utils.imports import load_object

    name = env_id.split("/", 1)[1] if env_id.startswith(f"{NAMESPACE}/") else env_id
    if name not in MULTIAGENT_ENVS and f"{name}-v0" in MULTIAGENT_ENVS:
        name = f"{name}-v0"
    if name not in MULTIAGENT_ENVS:
        raise ConfigError(f"unknown multi-agent environment {env_id!r}; known: "
                          f"{[f'{NAMESPACE}/{n}' for n in MULTIAGENT_ENVS]}")
    entry_point, defaults = MULTIAGENT_ENVS[name]
    return load_object(entry_point, what="entry point")(**{**defaults, **kwargs})


def make_vector(entry_point: str, num_envs: int = 1, **kwargs: Any):
    """Vector entry point: an :class:`~agentfly_gym.vector.AsyncTextVectorEnv` of ``num_envs`` copies.

    ``vector_kwargs`` accepted through ``kwargs``: ``autoreset_mode``, ``manager``.  All
    other kwargs go to each sub-environment.
    """
    from .vector import AsyncTextVectorEnv

    return AsyncTextVectorEnv.from_entry_point(entry_point, num_envs=num_envs, **kwargs)


def register_envs() -> None:
    """Register ``agentfly/<Name>-v0`` for every environment (idempotent)."""
    for name, (entry_point, kwargs) in ENVS.items():
        env_id = f"{NAMESPACE}/{name}"
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            id=env_id,
            entry_point=entry_point,
            vector_entry_point=functools.partial(make_vector, entry_point),
            kwargs=dict(kwargs),
            disable_env_checker=True,
            order_enforce=True,
        )
