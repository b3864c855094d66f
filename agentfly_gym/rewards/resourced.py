"""Declare the resources a tool or reward needs; the manager supplies them.

As in the AgentFly paper's listings, tool and reward code names what it needs and holds no
allocation or cleanup logic::

    @resourced(judge=ModelAPISpec(base_url=..., model=...), scope="global")
    async def judged_reward(answer: str, reference: str, *, judge) -> float:
        reply = await judge.chat([...])
        ...

    reward = await judged_reward("42", "42", manager=manager)              # global scope
    reward = await judged_reward("42", "42", manager=manager, scope=scope)  # or a rollout's scope
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import ConfigError
from ..resources.protocol import Manager
from ..resources.scope import RolloutScope
from ..resources.spec import ResourceSpec

__all__ = ["resourced"]

T = TypeVar("T")


def resourced(scope: str = "rollout", **specs: ResourceSpec) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Decorate an async tool/reward so each named ``spec`` arrives as a keyword argument.

    Args:
        scope: ``"global"`` (one shared instance per spec, e.g. a judge endpoint) or ``"rollout"``
            (the caller's rollout scope: same instance across the rollout's calls).
        specs: keyword name -> resource spec.

    The wrapped function takes ``manager=`` (required) and, for rollout scope, ``scope=``
    (a :class:`RolloutScope`; without it a one-call scope is opened and closed).

    Raises:
        ConfigError: unknown scope or no manager given.
    """
    if scope not in ("global", "rollout"):
        raise ConfigError(f"scope={scope!r} must be 'global' or 'rollout'")

    lease_scope = scope

    def deco(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, manager: Manager | None = None, scope: RolloutScope | None = None,
                          **kwargs: Any) -> T:
            if manager is None:
                raise ConfigError(f"{fn.__name__} needs manager=<ResourceManager>")
            if lease_scope == "global":
                res = {name: await manager.acquire_global(s) for name, s in specs.items()}
                return await fn(*args, **kwargs, **res)
            if scope is not None:
                res = {name: await scope.acquire(s) for name, s in specs.items()}
                return await fn(*args, **kwargs, **res)
            async with manager.scope() as own:
                res = {name: await own.acquire(s) for name, s in specs.items()}
                return await fn(*args, **kwargs, **res)

        wrapper.resource_specs = dict(specs)  # type: ignore[attr-defined]
        wrapper.resource_scope = lease_scope  # type: ignore[attr-defined]
        return wrapper

    return deco
