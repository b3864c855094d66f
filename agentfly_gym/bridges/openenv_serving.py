"""Serving agentfly environments to OpenEnv clients, through ``openenv-core`` 0.3 (``pip install 'agentfly-gym[openenv]'``).

:func:`create_openenv_app` builds OpenEnv's own FastAPI app (``openenv.core.env_server.create_fastapi_app``) over
:class:`AgentFlyOpenEnvironment`, an OpenEnv ``Environment`` whose ``reset_async`` /
``step_async`` drive an agentfly env.  OpenEnv makes one environment per WebSocket session; every
session's agentfly env takes its resources from the default resource manager of the
server's event loop, so all sessions share pools (many clients, one WebShop server; one rollout
scope per session episode, released when the episode ends or the session closes).
``agentfly-gym serve --env WebShop-v0 --openenv --port 8000`` runs it (:mod:`agentfly_gym.cli.serve`); any
OpenEnv client connects, e.g. ``GenericEnvClient(base_url="http://127.0.0.1:8000")``.

Wire format (OpenEnv's): action ``{"text": "<action>"}``; observation ``{"text": <obs>, "info":
<JSON-safe info>}`` with ``reward`` (the step's env reward) and ``done`` (terminated or
truncated; ``metadata`` says which).  Reset takes ``seed`` and ``options`` (e.g.
``{"task_id": ...}``), as the agentfly env does.

The other direction (an OpenEnv environment played as an agentfly env) is :mod:`.openenv`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
from typing import Any

import gymnasium
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from ..envs.base import AgentFlyEnv
from ..limits import check_int
from .uvicorn_server import exit_when_set, started_server

__all__ = ["TextAction", "TextObservation", "AgentFlyOpenEnvironment", "create_openenv_app", "serve"]

log = logging.getLogger(__name__)


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
    check_int("max_sessions", max_sessions)
    try:  # fail on a typo now, not in the first session (building the env acquires nothing)
        probe = gymnasium.make(env_id, **dict(env_kwargs or {})).unwrapped
        probe.discard()
    except TypeError as e:
        from ..registration import bad_kwargs_error

        raise bad_kwargs_error(env_id, dict(env_kwargs or {}), e) from None
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

    from ..resources.select import default_manager

    app = create_openenv_app(env_id, env_kwargs=env_kwargs, max_sessions=max_sessions)
    server = started_server(uvicorn.Config(app, host=host, port=port, log_level="warning"),
                            on_started=ready.set if ready is not None else None)
    if stop is not None:
        exit_when_set(stop, server, asyncio.get_running_loop())
    try:
        await server.serve()
    finally:
        await default_manager().aclose()
