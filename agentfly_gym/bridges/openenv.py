"""OpenEnv in both directions, through ``openenv-core`` 0.3 (``pip install 'agentfly-gym[openenv]'``).

**Serving** (agentfly env -> OpenEnv clients): :func:`create_openenv_app` builds OpenEnv's own
FastAPI app (``openenv.core.env_server.create_fastapi_app``) over
:class:`AgentFlyOpenEnvironment`, an OpenEnv ``Environment`` whose ``reset_async`` /
``step_async`` drive an agentfly env.  OpenEnv makes one environment per WebSocket session; every
session's agentfly env takes its resources from the default :class:`ResourceManager` of the
server's event loop, so all sessions share pools (many clients, one WebShop server; one rollout
scope per session episode, released when the episode ends or the session closes).
``agentfly-gym serve --env WebShop-v0 --openenv --port 8000`` runs it (:func:`serve_main`); any
OpenEnv client connects, e.g. ``GenericEnvClient(base_url="http://127.0.0.1:8000")``.

Wire format (OpenEnv's): action ``{"text": "<action>"}``; observation ``{"text": <obs>, "info":
<JSON-safe info>}`` with ``reward`` (the step's env reward) and ``done`` (terminated or
truncated; ``metadata`` says which).  Reset takes ``seed`` and ``options`` (e.g.
``{"task_id": ...}``), as the agentfly env does.

**Wrapping** (OpenEnv env -> agentfly Gymnasium env): :class:`OpenEnvEnv` plays an OpenEnv
environment through OpenEnv's own client (``GenericEnvClient``, one WebSocket session per episode).
The server is either given (``base_url``), served from an OpenEnv ASGI app (``app="module:attr"``)
by the resource manager (an :class:`OpenEnvServer` resource, ``InProcessSpec``), or runs in a
container of an OpenEnv image (``image=...``, e.g. the one
:func:`~agentfly_gym.bridges.openenv_image.build_openenv_image` builds): a ``ContainerSpec`` with the
server's port published on 127.0.0.1 (Docker backend).  Servers and containers are pooled up to
``max_servers``, held by one episode at a time; on reuse a container is replaced by a fresh one (the
pool's reset-on-reuse rule), an in-process server gets a fresh OpenEnv session and ``reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import math
import threading
import time
from typing import Any

import gymnasium
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from ..envs.base import AgentFlyEnv, StepResult
from ..envs.prompting import AgentPrompt
from ..errors import ConfigError, EnvError, ResourceDied, ResourceStartError
from ..resources.manager import RolloutScope
from ..resources.spec import ContainerSpec, InProcessSpec
from ..utils.jsonargs import json_object

__all__ = ["TextAction", "TextObservation", "AgentFlyOpenEnvironment", "create_openenv_app", "serve", "serve_main",
           "OpenEnvEnv", "OpenEnvServer", "wait_for_health"]

log = logging.getLogger(__name__)


# ============================================================================ serving
class TextAction(Action):
    """An agentfly action: one text command (e.g. ``"search[red shoes]"``)."""

    text: str = Field(..., description="the action text, in the environment's action format")


class TextObservation(Observation):
    """An agentfly observation: the text, plus the env's info (task_id, step, score, won, error, ...)."""

    text: str = Field(default="", description="the observation text")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict (JSON-safe)")


def _json_safe(value: Any) -> Any:
    """``value`` with anything JSON cannot carry turned into strings (non-finite floats into None)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "item"):
        return _json_safe(value.item())
    return str(value)


class AgentFlyOpenEnvironment(Environment):
    """An agentfly env behind OpenEnv's ``Environment`` interface (one instance per OpenEnv session).

    Args:
        env_id: a registered agentfly env (``"WebShop-v0"``, ``"agentfly/Chess-v0"``, ...).
        env_kwargs: constructor kwargs of that env.

    The agentfly env is made on the first reset, inside the server's event loop, without an
    explicit manager: it uses that loop's default manager, shared by all sessions.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        from ..registration import normalize_env_id

        self.env_id = normalize_env_id(env_id)
        self.env_kwargs = dict(env_kwargs or {})
        self._env: AgentFlyEnv | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._steps = 0

    def _ensure_env(self) -> AgentFlyEnv:
        if self._env is None:
            self._loop = asyncio.get_running_loop()
            self._env = gymnasium.make(self.env_id, **self.env_kwargs).unwrapped
        return self._env

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          options: dict[str, Any] | None = None, **kwargs: Any) -> TextObservation:
        """Start an episode; returns the reset observation (reward None, done False).

        ``options`` (a dict) are the agentfly env's reset options; extra keyword arguments are
        merged into them (so ``reset(task_id=...)`` works from any client).

        Raises:
            ConfigError: bad options (OpenEnv reports it to the client as an error message).
        """
        env = self._ensure_env()
        opts = dict(options or {})
        opts.update(kwargs)
        obs, info = await env.areset(seed=seed, options=opts or None)
        self._steps = 0
        return TextObservation(text=obs, info=_json_safe(info), done=False, reward=None,
                               metadata={"episode_id": env.episode_id or ""})

    async def step_async(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        """One env step; ``done`` = terminated or truncated (``metadata`` has both flags).

        Raises:
            ResetNeeded: no episode is running.
        """
        env = self._ensure_env()
        obs, reward, terminated, truncated, info = await env.astep(action.text)
        self._steps += 1
        return TextObservation(text=obs, info=_json_safe(info), done=bool(terminated or truncated),
                               reward=float(reward), metadata={"terminated": terminated, "truncated": truncated})

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        """Sync form (OpenEnv's abstract API): runs :meth:`reset_async` on agentfly's background loop."""
        from ..utils.aio import run_sync

        return run_sync(self.reset_async(seed=seed, episode_id=episode_id, **kwargs))

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        """Sync form of :meth:`step_async` (agentfly's background loop)."""
        from ..utils.aio import run_sync

        return run_sync(self.step_async(action, timeout_s=timeout_s))

    @property
    def state(self) -> State:
        """The episode id and the steps taken in it."""
        return State(episode_id=self._env.episode_id if self._env is not None else None, step_count=self._steps)

    def get_metadata(self) -> EnvironmentMetadata:
        prompt = gymnasium.make(self.env_id, **self.env_kwargs).unwrapped.agent_prompt  # per instance (a ToolEnv's)
        return EnvironmentMetadata(name=self.env_id, description=prompt.system, version="0")

    def close(self) -> None:
        """End the session's episode, releasing its rollout scope (called by OpenEnv when the session ends).

        OpenEnv calls this from the session's worker thread; the release runs on the server loop.
        """
        env, loop, self._env = self._env, self._loop, None
        if env is None or loop is None or loop.is_closed():
            return
        try:
            if loop.is_running() and not _on_loop(loop):
                asyncio.run_coroutine_threadsafe(env.aclose(), loop).result(timeout=120)
            elif loop.is_running():
                loop.create_task(env.aclose())
        except Exception as e:  # noqa: BLE001  (the manager reaps the scope at shutdown anyway)
            log.warning("closing the %s session failed: %s: %s", self.env_id, type(e).__name__, e)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def create_openenv_app(env_id: str, *, env_kwargs: dict[str, Any] | None = None, max_sessions: int = 64):
    """OpenEnv's FastAPI app (``/ws`` sessions, ``/health``, ``/schema``, ``/metadata``) for an agentfly env.

    Args:
        env_id: a registered agentfly env id.
        env_kwargs: its constructor kwargs.
        max_sessions: most concurrent OpenEnv sessions (each holds one env; the env's own pools
            still cap what backs them).

    Raises:
        ConfigError: unknown env, bad kwargs, or ``max_sessions`` < 1.
    """
    from openenv.core.env_server.http_server import create_fastapi_app

    from ..registration import normalize_env_id

    env_id = normalize_env_id(env_id)
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ConfigError(f"max_sessions={max_sessions!r} must be an integer >= 1")
    try:  # fail on a typo now, not in the first session (building the env acquires nothing)
        probe = gymnasium.make(env_id, **dict(env_kwargs or {})).unwrapped
        probe._closed = True
    except TypeError as e:
        raise ConfigError(f"{env_id}: bad keyword arguments {sorted(env_kwargs or {})}: {e}") from None
    factory = functools.partial(AgentFlyOpenEnvironment, env_id, dict(env_kwargs or {}))
    app = create_fastapi_app(factory, TextAction, TextObservation, max_concurrent_envs=max_sessions)
    from ._compat import QuietClientDisconnect, needs_quiet_disconnect

    if needs_quiet_disconnect():  # a client's normal disconnect prints no traceback
        app.add_middleware(QuietClientDisconnect)
    return app


async def serve(env_id: str, *, host: str = "127.0.0.1", port: int = 8000, env_kwargs: dict[str, Any] | None = None,
                max_sessions: int = 64, ready: threading.Event | None = None, stop: threading.Event | None = None
                ) -> None:
    """Serve ``env_id`` through OpenEnv until interrupted (or ``stop`` is set), then release every resource.

    ``ready`` (optional) is set once the server accepts connections.
    """
    import uvicorn

    from ..resources.manager import default_manager

    app = create_openenv_app(env_id, env_kwargs=env_kwargs, max_sessions=max_sessions)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    watcher = None
    if ready is not None or stop is not None:
        async def _watch() -> None:
            while not server.started:
                await asyncio.sleep(0.05)
            if ready is not None:
                ready.set()
            while stop is not None and not stop.is_set():
                await asyncio.sleep(0.1)
            server.should_exit = True

        watcher = asyncio.create_task(_watch())
    try:
        await server.serve()
    finally:
        if watcher is not None:
            watcher.cancel()
        await default_manager().aclose()


def serve_main(argv: list[str] | None = None) -> int:
    """``agentfly-gym serve --env ID --openenv [--host H] [--port P] [--max-sessions N] [--env-kwargs JSON]``."""
    p = argparse.ArgumentParser(prog="agentfly-gym serve", allow_abbrev=False,
                                description="serve an agentfly environment to other trainers' clients")
    p.add_argument("--env", required=True, help="environment id, e.g. WebShop-v0")
    p.add_argument("--openenv", action="store_true", help="speak OpenEnv's protocol (the only one for now)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64, help="most concurrent client sessions")
    p.add_argument("--env-kwargs", default=None, help='JSON constructor kwargs, e.g. \'{"split": "test"}\'')
    args = p.parse_args(argv)
    if not args.openenv:
        p.error("name the protocol: --openenv (OpenEnv's WebSocket/HTTP server interface)")
    kwargs = json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    print(f"agentfly-gym: serving {args.env} through OpenEnv on http://{args.host}:{args.port} "
          f"(up to {args.max_sessions} sessions; Ctrl-C stops)", flush=True)
    try:
        asyncio.run(serve(args.env, host=args.host, port=args.port, env_kwargs=kwargs, max_sessions=args.max_sessions))
    except KeyboardInterrupt:
        pass
    return 0


# ============================================================================ wrapping
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
        self._server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, name=f"openenv-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise ResourceStartError(f"OpenEnv app {app} did not start on {self.base_url} "
                                         f"within {start_timeout}s")
            time.sleep(0.05)

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
            (:class:`OpenEnvServer`, one per episode in flight, pooled up to ``max_servers``); or
        image: a container image whose command serves OpenEnv on ``port`` (e.g.
            ``build_openenv_image()``'s tag): one container per episode in flight, pooled up to
            ``max_servers`` and replaced by a fresh one on reuse; the server is used once its
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
        max_servers: pool capacity for ``app`` servers.
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
                 max_servers: int = 4, system_prompt: str | None = None, message_timeout: float = 60.0,
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
                                          max_instances=max_servers) if app is not None else None)
        self.port, self.server_timeout = port, server_timeout
        self.container_spec = (_server_container_spec(image, port, command, container, max_servers, server_timeout)
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
                           max_servers: int, server_timeout: float) -> ContainerSpec:
    """The ``ContainerSpec`` of an OpenEnv server image: ``port`` published, network on, the server as command."""
    from .openenv_image import openenv_server_command

    extra = dict(container or {})
    fixed = {"image", "ports", "command", "max_instances"} & set(extra)
    if fixed:
        raise ConfigError(f"container={container!r}: {sorted(fixed)} are set by OpenEnvEnv (use image=, port=, "
                          "command=, max_servers=)")
    if extra.get("network") is False:
        raise ConfigError("container={'network': False} cannot publish the server's port; leave network on")
    extra.setdefault("start_timeout", max(60.0, server_timeout))
    try:
        return ContainerSpec(image=image, ports=(port,), network=True, max_instances=max_servers,
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
