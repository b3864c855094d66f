"""OpenEnv environments as agentfly environments, through ``openenv-core`` 0.3 (``pip install 'agentfly-gym[openenv]'``).

The other direction (an agentfly environment served to OpenEnv clients) is :mod:`.openenv_serving`.

**Wrapping** (OpenEnv env -> agentfly Gymnasium env): :class:`OpenEnvEnv` plays an OpenEnv
environment through OpenEnv's own client (``GenericEnvClient``, one WebSocket session per episode).
The server is either given (``base_url``), served from an OpenEnv ASGI app (``app="module:attr"``)
by the resource manager (an :class:`OpenEnvServer` resource, ``InProcessSpec``), or runs in a
container of an OpenEnv image (``image=...``, e.g. the one
:func:`~agentfly_gym.images.openenv.build_openenv_image` builds): a ``ContainerSpec`` with the
server's port published on 127.0.0.1 (Docker backend).  Servers and containers are pooled up to
``max_instances``, held by one episode at a time; on reuse a container is replaced by a fresh one (the
pool's reset-on-reuse rule), an in-process server gets a fresh OpenEnv session and ``reset``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any


from ..envs.base import AgentFlyEnv, StepResult
from ..envs.prompting import AgentPrompt
from ..errors import ConfigError, EnvError, ResourceDied, ResourceStartError
from ..resources.scope import RolloutScope
from ..resources.spec import ContainerSpec, InProcessSpec
from .uvicorn_server import started_server

__all__ = ["OpenEnvEnv", "OpenEnvServer", "wait_for_health"]



class OpenEnvServer:
    """An OpenEnv ASGI app served by uvicorn on 127.0.0.1 in a daemon thread (an in-process resource).

    Args:
        app: ``"module:attr"`` of the app (e.g. the ``app`` of an OpenEnv env's ``server/app.py``).
        start_timeout: seconds to wait for the server to accept connections.

    Attributes:
        base_url: ``http://127.0.0.1:<port>``.

    Raises:
        ResourceStartError: the server did not come up in time.
    """

    def __init__(self, app: str, start_timeout: float = 60.0) -> None:
        import uvicorn

        from ..resources.backends.model_service import free_port
        from ..utils.imports import load_object

        asgi = load_object(app, what="app")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        settled = threading.Event()  # set once the server accepts connections, or its thread ended without
        self._server = started_server(uvicorn.Config(asgi, host="127.0.0.1", port=self.port, log_level="warning"),
                               on_started=settled.set)

        def run() -> None:
            try:
                self._server.run()
            finally:
                settled.set()

        self._thread = threading.Thread(target=run, name=f"openenv-{self.port}", daemon=True)
        self._thread.start()
        if not settled.wait(start_timeout) or not self._server.started:
            self._server.should_exit = True
            raise ResourceStartError(f"OpenEnv app {app} did not start on {self.base_url} within {start_timeout}s")

    def healthy(self) -> bool:
        return self._thread.is_alive() and bool(self._server.started)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class OpenEnvEnv(AgentFlyEnv):
    """An OpenEnv environment as an agentfly (Gymnasium, text) env, played with OpenEnv's ``GenericEnvClient``.

    Args:
        base_url: a running OpenEnv server (``http://host:port``); or
        app: ``"module:attr"`` of an OpenEnv ASGI app, served by the resource manager
            (:class:`OpenEnvServer`, one per episode in flight, pooled up to ``max_instances``); or
        image: a container image whose command serves OpenEnv on ``port`` (e.g.
            ``build_openenv_image()``'s tag): one container per episode in flight, pooled up to
            ``max_instances`` and replaced by a fresh one on reuse; the server is used once its
            ``/health`` answers 200 (within ``server_timeout`` seconds).  A container the pool keeps idle
            (the next env reuses it warm) is removed after ``ContainerSpec.max_idle_time``, 300 s unless
            ``container={"max_idle_time": ...}`` says otherwise.
        port: the server's TCP port inside the container (``image`` only; default 8000).
        command: the container's command (``image`` only; default OpenEnv's ``uvicorn server.app:app``
            on ``port``).
        container: further ``ContainerSpec`` fields for ``image`` (e.g. ``{"cpus": 0.5, "memory": "512m"}``).
        server_timeout: seconds to wait for a container's server to answer ``/health``.
        action_field: the OpenEnv action field that receives the action text (e.g. ``"message"``).
        observation_field: the observation field shown as the text observation; None shows
            the whole observation as JSON (sorted keys).
        reset_kwargs: keyword arguments of every OpenEnv ``reset`` (beside ``seed``).
        max_instances: pool capacity for ``app`` servers.
        system_prompt: what an LM agent is told (the env's action format).
        (manager, step_timeout, reset_timeout, max_episode_steps, render_mode: see AgentFlyEnv.)

    Rewards: OpenEnv's ``reward`` (None counts 0.0); ``done`` ends the episode (terminated).
    ``info`` has ``openenv`` (the raw observation dict) beside the standard keys.

    A connection lost mid-episode (the server or its container died) ends the episode with a
    handled observation (``truncated``, ``info["error"]``) and the container is discarded.

    Raises:
        ConfigError: not exactly one of ``base_url`` / ``app`` / ``image``; an empty ``action_field``;
            bad ``container`` fields (``{"backend": "sandbox"}`` among them: it cannot publish the port).
    """

    env_name = "OpenEnv"
    reset_options = None  # passed on to the OpenEnv server's reset, which checks them
    agent_prompt = AgentPrompt(system="You are an agent in an OpenEnv environment. Read each observation and end "
                                      "each reply with 'Action: <action>'.")

    def __init__(self, *, base_url: str | None = None, app: str | None = None, image: str | None = None,
                 port: int = 8000, command: tuple[str, ...] | list[str] | None = None,
                 container: dict[str, Any] | None = None, server_timeout: float = 120.0,
                 action_field: str = "message",
                 observation_field: str | None = None, reset_kwargs: dict[str, Any] | None = None,
                 max_instances: int = 4, system_prompt: str | None = None, message_timeout: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if sum(x is not None for x in (base_url, app, image)) != 1:
            raise ConfigError("OpenEnvEnv needs exactly one of base_url (a running server), app ('module:attr') "
                              f"or image (a container image); got base_url={base_url!r}, app={app!r}, image={image!r}")
        if not action_field:
            raise ConfigError("action_field must name the OpenEnv action field that takes the action text")
        self.base_url, self.app = base_url, app
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_kwargs = dict(reset_kwargs or {})
        self.message_timeout = message_timeout
        self.server_spec = (InProcessSpec(factory="agentfly_gym.bridges.openenv:OpenEnvServer", kwargs={"app": app},
                                          max_instances=max_instances) if app is not None else None)
        self.port, self.server_timeout = port, server_timeout
        self.container_spec = (_server_container_spec(image, port, command, container, max_instances, server_timeout)
                               if image is not None else None)
        if system_prompt is not None:
            self.agent_prompt = AgentPrompt(system=system_prompt)
        self._client = None
        self._url: str | None = base_url

    def episode_resource_specs(self) -> list:
        return [s for s in (self.server_spec, self.container_spec) if s is not None]

    def _text(self, observation: dict[str, Any]) -> str:
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise EnvError(f"OpenEnv observation has no field {self.observation_field!r} "
                               f"(fields: {sorted(observation)})")
            return str(observation[self.observation_field])
        return json.dumps(observation, sort_keys=True, ensure_ascii=False, default=str)

    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        from openenv.core.generic_client import GenericEnvClient

        url = self.base_url
        if self.server_spec is not None:
            server = await scope.acquire(self.server_spec)
            url = server.obj.base_url
        if self.container_spec is not None:
            box = await scope.acquire(self.container_spec)
            host, port = box.endpoint(self.port)
            url = f"http://{host}:{port}"
            try:
                await wait_for_health(url, box, timeout=self.server_timeout)
            except ResourceStartError:
                await scope.discard(box)  # a server that never came up is not handed to the next episode
                raise
        self._url = url
        self._client = GenericEnvClient(base_url=url, message_timeout_s=self.message_timeout)
        seed = int(self.np_random.integers(2**31 - 1))
        kwargs = {**self.reset_kwargs, **options}
        result = await self._guard(self._client.reset(seed=seed, **kwargs))
        self._task_id = str(kwargs.get("task_id", seed))
        return self._text(result.observation), {"openenv": result.observation}

    async def _guard(self, call: Any) -> Any:
        """Await an OpenEnv client call; a lost connection becomes :class:`ResourceDied` (the server is gone)."""
        from websockets.exceptions import ConnectionClosed

        try:
            return await call
        except (ConnectionClosed, ConnectionError, OSError) as e:
            raise ResourceDied(f"the OpenEnv server at {self._url} is gone ({type(e).__name__}: {e})") from e

    async def _step_episode(self, action: str) -> StepResult:
        result = await self._guard(self._client.step({self.action_field: action}))
        reward = 0.0 if result.reward is None else float(result.reward)
        return self._text(result.observation), reward, bool(result.done), False, {"openenv": result.observation}

    async def _end_of_episode(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.disconnect()


def _server_container_spec(image: str, port: int, command: Any, container: dict[str, Any] | None,
                           max_instances: int, server_timeout: float) -> ContainerSpec:
    """The ``ContainerSpec`` of an OpenEnv server image: ``port`` published, network on, the server as command."""
    from ..images.openenv import openenv_server_command

    extra = dict(container or {})
    fixed = {"image", "ports", "command", "max_instances"} & set(extra)
    if fixed:
        raise ConfigError(f"container={container!r}: {sorted(fixed)} are set by OpenEnvEnv (use image=, port=, "
                          "command=, max_instances=)")
    if extra.get("network") is False:
        raise ConfigError("container={'network': False} cannot publish the server's port; leave network on")
    extra.setdefault("start_timeout", max(60.0, server_timeout))
    try:
        return ContainerSpec(image=image, ports=(port,), network=True, max_instances=max_instances,
                             command=tuple(command) if command is not None else openenv_server_command(port),
                             **{k: v for k, v in extra.items() if k != "network"})
    except TypeError as e:
        raise ConfigError(f"container={container!r}: {e}") from None


async def wait_for_health(url: str, box: Any = None, *, timeout: float = 120.0, interval: float = 0.2) -> None:
    """Wait until ``GET {url}/health`` answers 200 (OpenEnv servers' health endpoint).

    Args:
        url: the server's base URL.
        box: its container (optional): a container that stops meanwhile fails at once.
        timeout: seconds.
        interval: seconds between polls.

    Raises:
        ResourceDied: ``box`` stopped before the server answered.
        ResourceStartError: no 200 within ``timeout`` (the last answer or error is in the message).
    """
    import httpx

    from ..resources.base import ResourceStatus

    deadline = time.monotonic() + timeout
    last = "no answer"
    polls = 0
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:  # no proxy between us and loopback
        while True:
            try:
                r = await http.get(f"{url}/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            polls += 1
            if box is not None and polls % 10 == 0 and await box.status() == ResourceStatus.UNHEALTHY:
                raise ResourceDied(f"{box.id}: the container stopped before its OpenEnv server answered {url}/health "
                                   f"(last: {last})")
            if time.monotonic() > deadline:
                raise ResourceStartError(f"the OpenEnv server at {url} did not answer /health with 200 within "
                                         f"{timeout}s (last: {last})")
            await asyncio.sleep(interval)
