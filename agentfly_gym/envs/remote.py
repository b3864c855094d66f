"""A whole environment hosted as a pooled resource: its steps run where the instance lives, only text travels.

:class:`HostedEnv` is the object an :class:`~agentfly_gym.resources.InProcessSpec` builds: an agentfly-gym
environment made with ``gymnasium.make`` in the process that owns the instance (a Ray actor on some node
with a :class:`~agentfly_gym.resources.ray.RayResourceManager`, this process with a local manager).
:class:`RemoteEnv` is the Gymnasium env a trainer holds: each episode leases one hosted env from its
manager's pool (capped by ``max_instances``, reset on reuse) and forwards ``reset``/``step``; observations,
actions, rewards and ``info`` are the only things that cross.

    manager = RayResourceManager(placement={"hosted:agentfly/Chess-v0": {"resources": {"chess": 1}}})
    env = RemoteEnv("agentfly/Chess-v0", max_instances=8, manager=manager)
    obs, info = await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep("e2e4")

A host that dies (its actor, its node) ends the episode truncated with ``info["error"]`` (as every
environment does on a resource fault); the next reset leases a fresh instance wherever one can start.
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any

from ..errors import ConfigError
from ..resources.spec import InProcessSpec
from .base import AgentFlyEnv, StepResult

__all__ = ["HostedEnv", "RemoteEnv", "hosted_env_spec"]

log = logging.getLogger(__name__)


class HostedEnv:
    """An environment made by ``gymnasium.make(env_id, **env_kwargs)``, driven through text-only methods.

    Its methods are coroutines: a Ray host awaits them on its own event loop (one actor call per step, no
    thread hop); with a local manager ``resource.call`` returns the coroutine, which the caller awaits.

    Args:
        env_id: a registered id, e.g. ``"agentfly/Chess-v0"``.
        env_kwargs_json: the env's keyword arguments as a JSON object (JSON keeps the spec hashable).

    Raises:
        ConfigError: ``env_kwargs_json`` is not a JSON object.
    """

    def __init__(self, env_id: str, env_kwargs_json: str = "{}") -> None:
        import gymnasium

        import agentfly_gym  # noqa: F401 - registers the agentfly/* ids in this process

        kwargs = json.loads(env_kwargs_json)
        if not isinstance(kwargs, dict):
            raise ConfigError(f"env_kwargs_json={env_kwargs_json!r} must be a JSON object")
        self.env_id = env_id
        self.env = gymnasium.make(env_id, disable_env_checker=True, **kwargs)

    async def env_reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: ``(observation, info)`` of the env's ``areset(seed=seed, options=options)``."""
        return await self.env.unwrapped.areset(seed=seed, options=options)

    async def env_step(self, action: str) -> StepResult:
        """One step: ``(observation, reward, terminated, truncated, info)`` of the env's ``astep(action)``."""
        obs, reward, terminated, truncated, info = await self.env.unwrapped.astep(action)
        return obs, float(reward), bool(terminated), bool(truncated), info

    async def env_end(self) -> None:
        """End the running episode (if any), so the resources it holds go back to their pools now."""
        await self.env.unwrapped.aend_episode()

    async def aclose(self) -> None:
        """End the episode and close the env on the loop that ran it (a Ray host calls this before ``close``)."""
        await self.env.unwrapped.aclose()

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        self.env.close()


def hosted_env_spec(env_id: str, env_kwargs: dict[str, Any] | None = None, *, max_instances: int = 1,
                    **spec_kwargs: Any) -> InProcessSpec:
    """The spec of a pool of hosted ``env_id`` environments; its ``name`` is ``"hosted:<env_id>"`` (use it
    as the placement key).

    Raises:
        ConfigError: ``env_kwargs`` is not JSON-serialisable.
    """
    try:
        kwargs_json = json.dumps(env_kwargs or {}, sort_keys=True)
    except TypeError as e:
        raise ConfigError(f"env_kwargs={env_kwargs!r} must be JSON-serialisable: {e}") from None
    return InProcessSpec(factory="agentfly_gym.envs.remote:HostedEnv",
                         kwargs={"env_id": env_id, "env_kwargs_json": kwargs_json},
                         max_instances=max_instances, name=f"hosted:{env_id}", **spec_kwargs)


class RemoteEnv(AgentFlyEnv):
    """A text environment whose every episode runs on a pooled, possibly remote, :class:`HostedEnv`.

    Args:
        env_id: the hosted environment's id (e.g. ``"agentfly/ScienceWorld-v0"``).
        env_kwargs: its keyword arguments (JSON-serialisable).
        max_instances: the pool's capacity (with a Ray manager: hosted environments in the whole cluster).
        manager, step_timeout, reset_timeout, max_episode_steps, render_mode: see :class:`AgentFlyEnv`.

    Observations, rewards, ``terminated``/``truncated`` and ``info`` are the hosted env's own; the episode's
    seed is drawn from ``np_random`` (so ``reset(seed=s)`` is reproducible).
    """

    env_name = "Remote"

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None, *, max_instances: int = 1,
                 manager: Any = None, step_timeout: float | None = 120.0, reset_timeout: float | None = 900.0,
                 max_episode_steps: int | None = None, render_mode: str | None = None) -> None:
        super().__init__(manager=manager, step_timeout=step_timeout, reset_timeout=reset_timeout,
                         max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.env_id = env_id
        self.spec_of_host = hosted_env_spec(env_id, env_kwargs, max_instances=max_instances)
        self._host: Any = None

    def episode_resource_specs(self) -> list:
        return [self.spec_of_host]

    async def _host_call(self, method: str, *args: Any) -> Any:
        return await self._host_call_on(self._host, method, *args)

    async def _reset_episode(self, scope: Any, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._host = await scope.acquire(self.spec_of_host)
        seed = int(self.np_random.integers(2**31 - 1))
        obs, info = await self._host_call("env_reset", seed, options or None)
        self._task_id = str(info.get("task_id", ""))
        return obs, info

    async def _step_episode(self, action: str) -> StepResult:
        return await self._host_call("env_step", action)

    async def _end_of_episode(self) -> None:
        host, self._host = self._host, None
        if host is None or getattr(host, "dead", None) or getattr(host, "obj", True) is None:
            return
        try:
            await self._host_call_on(host, "env_end")
        except Exception as e:  # noqa: BLE001 - a host that died: the pool replaces it; the episode is over anyway
            log.info("%s: ending the hosted episode failed (%s: %s)", self.env_id, type(e).__name__, e)

    @staticmethod
    async def _host_call_on(host: Any, method: str, *args: Any) -> Any:
        out = await host.call(method, *args)
        if inspect.isawaitable(out):  # a local InProcessResource hands the coroutine back: run it here
            out = await out
        return out
