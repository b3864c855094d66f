"""Gymnasium registration of every agentfly-gym environment, declared in one place.

``import agentfly_gym`` calls :func:`register_envs`; it only records entry-point strings,
so no environment module (and no simulator) is imported until ``gymnasium.make``.
Both ``gymnasium.make("agentfly/Chess-v0")`` (after ``import agentfly_gym``) and
``gymnasium.make("agentfly_gym:agentfly/Chess-v0")`` work.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import gymnasium

__all__ = ["ENVS", "MULTIAGENT_ENVS", "register_envs", "normalize_env_id", "normalize_multiagent_id", "make_vector",
           "make_multiagent", "env_kwarg_names", "bad_kwargs_error"]

NAMESPACE = "agentfly"

#: name -> (entry point, default kwargs)
ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "Chess-v0": ("agentfly_gym.envs.chess:ChessEnv", {}),
    "ScienceWorld-v0": ("agentfly_gym.envs.scienceworld:ScienceWorldEnv", {}),
    "ALFWorld-v0": ("agentfly_gym.envs.alfworld:ALFWorldEnv", {}),
    "WebShop-v0": ("agentfly_gym.envs.webshop:WebShopEnv", {}),
    "R2EGym-v0": ("agentfly_gym.envs.r2egym:R2EGymEnv", {}),
    # tool-calling tasks built on agentfly_gym.tools
    "CodeInterpreter-v0": ("agentfly_gym.envs.code_interpreter:CodeInterpreterEnv", {}),
    "Retrieval-v0": ("agentfly_gym.envs.retrieval:RetrievalEnv", {}),
}

#: multi-agent (PettingZoo AEC) environments: name -> (entry point, default kwargs).  PettingZoo has no
#: registry; these are made with :func:`make_multiagent` (or the module's ``env()`` / ``raw_env``).
MULTIAGENT_ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "ChessSelfPlay-v0": ("agentfly_gym.envs.chess.selfplay:ChessSelfPlayEnv", {}),
}


#: a user's ``"package.module:attr"`` -> the env id it registered (see :func:`normalize_env_id`)
_USER_ENVS: dict[str, str] = {}


def _user_env(ref: str) -> str:
    """The env id that ``ref`` (``"package.module:make_env"``, ``"package.module:ENV_ID"`` or Gymnasium's
    ``"package.module:namespace/Name-v0"``) registers, importing the module (and calling the function) once per
    process."""
    from .errors import ConfigError
    from .utils.imports import load_object

    if ref in _USER_ENVS and _USER_ENVS[ref] in gymnasium.registry:
        return _USER_ENVS[ref]
    module, _, attr = ref.partition(":")
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:  # the user's module in the current folder, as uvicorn
        sys.path.append(os.getcwd())                         # finds "main:app" (the console script does not add it)
    if "/" in attr or "-v" in attr:  # Gymnasium's own form: the import registers the id
        load_object(f"{module}:__name__", what="env module", require_callable=False)
        env_id = attr
    else:
        obj = load_object(ref, what="env factory", require_callable=False)
        env_id = obj() if callable(obj) else obj
        if not isinstance(env_id, str):
            raise ConfigError(f"--env {ref!r}: {attr} must be (or return) a registered env id such as the one "
                              f"make_tool_env returns, got {type(env_id).__name__}")
    if env_id not in gymnasium.registry:
        raise ConfigError(f"--env {ref!r} names {env_id!r}, which is not registered after importing {module!r}")
    _USER_ENVS[ref] = env_id
    return env_id


def normalize_env_id(name: str) -> str:
    """``"Chess"``, ``"Chess-v0"`` or ``"agentfly/Chess-v0"`` -> ``"agentfly/Chess-v0"`` (registers the envs first).

    A user's environment is named by the module that registers it: ``"mypkg.tasks:make_env"`` (a function that
    registers the env, e.g. with :func:`agentfly_gym.tools.make_tool_env`, and returns its id; called once per
    process), ``"mypkg.tasks:ENV_ID"`` (a str) or ``"mypkg.tasks:my/Task-v0"`` (the module registers it on import)
    -> that id.

    Raises:
        ConfigError: no registered agentfly environment has that name (the message lists the registered
            ids and the multi-agent ones, which :func:`make_multiagent` makes), or a user's module does not
            register what it names.
    """
    from .errors import ConfigError

    register_envs()
    if ":" in name and "/" not in name.partition(":")[0]:
        return _user_env(name)
    cand = name if "/" in name else f"{NAMESPACE}/{name}"
    if cand not in gymnasium.registry and f"{cand}-v0" in gymnasium.registry:
        cand = f"{cand}-v0"
    if cand not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith(f"{NAMESPACE}/"))
        multi = sorted(f"{NAMESPACE}/{n}" for n in MULTIAGENT_ENVS)
        short = {k.partition("/")[2]: k for k in known + multi}
        close = difflib.get_close_matches(name.partition("/")[2] if "/" in name else name, list(short), n=1)
        hint = f" (did you mean {short[close[0]]!r}?)" if close else ""
        raise ConfigError(f"unknown environment {name!r}{hint}; registered: {known}; multi-agent (PettingZoo, "
                          f"agentfly-gym rollout and make_multiagent only): {multi}")
    return cand


def env_kwarg_names(env_id: str) -> list[str]:
    """The keyword arguments ``gymnasium.make(env_id, **kwargs)`` accepts: the constructor's (through a
    ``**kwargs`` that it passes on, the base :class:`~agentfly_gym.envs.base.AgentFlyEnv`'s too) and
    ``gymnasium.make``'s own, sorted.  Imports the environment's module, starts nothing."""
    import inspect

    from gymnasium.envs.registration import load_env_creator

    spec = gymnasium.spec(env_id)
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    names = {n for n in inspect.signature(gymnasium.make).parameters if n not in ("id", "kwargs")}
    params = inspect.signature(creator).parameters
    names |= {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self"}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        from .envs.base import AgentFlyEnv

        names |= {n for n, p in inspect.signature(AgentFlyEnv.__init__).parameters.items()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self"}
    return sorted(names)


def bad_kwargs_error(env_id: str, kwargs: dict[str, Any], error: Exception) -> Exception:
    """The :class:`~agentfly_gym.errors.ConfigError` for ``gymnasium.make(env_id, **kwargs)`` raising ``error``
    (a ``TypeError``): it names each argument the environment does not take, with its close match
    (``mdoe`` -> ``mode``), and the arguments it does take."""
    from .errors import ConfigError
    from .utils.suggest import name_unknown

    try:
        known = env_kwarg_names(env_id)
    except (ImportError, AttributeError, TypeError, ValueError, gymnasium.error.Error):  # unreadable entry point
        return ConfigError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {error}")
    unknown = [k for k in kwargs if k not in known]
    if not unknown:
        return ConfigError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {error}")
    said, s = name_unknown(unknown, known)
    return ConfigError(f"{env_id}: bad keyword argument{s} {said}: the env takes no such argument; its arguments "
                       f"are {known}")


def normalize_multiagent_id(name: str) -> str:
    """``"ChessSelfPlay"``, ``"ChessSelfPlay-v0"`` or ``"agentfly/ChessSelfPlay-v0"`` ->
    ``"agentfly/ChessSelfPlay-v0"``: the id of a multi-agent environment of :data:`MULTIAGENT_ENVS`.

    Raises:
        ConfigError: no multi-agent environment has that name.
    """
    from .errors import ConfigError

    short = name.split("/", 1)[1] if name.startswith(f"{NAMESPACE}/") else name
    if short not in MULTIAGENT_ENVS and f"{short}-v0" in MULTIAGENT_ENVS:
        short = f"{short}-v0"
    if short not in MULTIAGENT_ENVS:
        raise ConfigError(f"unknown multi-agent environment {name!r}; known: "
                          f"{[f'{NAMESPACE}/{n}' for n in MULTIAGENT_ENVS]}")
    return f"{NAMESPACE}/{short}"


def make_multiagent(env_id: str, **kwargs: Any):
    """A multi-agent environment by id: ``"agentfly/ChessSelfPlay-v0"`` (``"ChessSelfPlay-v0"`` and
    ``"ChessSelfPlay"`` too), as an unwrapped PettingZoo ``AECEnv`` built with ``kwargs``.

    Raises:
        ConfigError: no multi-agent environment has that id.
    """
    from .utils.imports import load_object

    name = normalize_multiagent_id(env_id).split("/", 1)[1]
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
