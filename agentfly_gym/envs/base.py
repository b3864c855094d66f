"""The common base of every agentfly-gym environment: async first, text in and text out.

Subclasses implement two coroutines::

    async def _reset_episode(self, scope, options) -> tuple[str, dict]
    async def _step_episode(self, action) -> tuple[str, float, bool, bool, dict]

and obtain whatever backs them (a simulator, a container, a shared server) from the
rollout scope the base class opens for each episode.  The base class owns the episode
lifecycle: one rollout scope per episode (released when the episode ends, on error,
on the next reset or on close), the step timeout, the step limit, standard ``info`` keys,
and the conversion of resource faults into handled observations (:func:`fault_step`).

Every environment declares what it accepts and offers the same way: :attr:`AgentFlyEnv.reset_options`
(the reset options it knows, checked once here) and :meth:`AgentFlyEnv.expert_action` (its expert, or
:class:`~agentfly_gym.errors.NoExpert`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium

from ..errors import ConfigError, EnvError, ModelOutputError, NoExpert, ResetNeeded, ResourceDied, ResourceError, ResourceTimeout
from ..limits import check_int
from ..resources.inprocess import InProcessResource
from ..resources.protocol import Manager
from ..resources.scope import RolloutScope
from ..resources.select import default_manager
from ..spaces import TextSpace
from ..utils.aio import run_sync
from ._compat import enclosing_time_limit, limit_of_gymnasium_make
from .prompting import AgentPrompt

__all__ = ["AgentFlyEnv", "EnvResources", "StepResult", "fault_message", "fault_step"]

log = logging.getLogger(__name__)

StepResult = tuple[str, float, bool, bool, dict[str, Any]]

_episode_ids = itertools.count(1)


def fault_message(fault: BaseException | str) -> str:
    """The text of a handled fault: a str as given, an exception as ``"<TypeName>: <message>"``."""
    return fault if isinstance(fault, str) else f"{type(fault).__name__}: {fault}"


def fault_step(fault: BaseException | str) -> StepResult:
    """The step result that ends an episode after a handled fault (a dead or stuck resource, a crashed step).

    The one format of every handled fault, from :class:`AgentFlyEnv` and from
    :class:`~agentfly_gym.vector.AsyncTextVectorEnv` alike::

        ("Error: <message>. The episode has ended.", 0.0, False, True, {"error": "<message>"})

    with ``<message>`` = :func:`fault_message` (``"ResourceDied: ..."`` for an exception): zero reward,
    truncated (not terminated: the task did not end, the episode was cut), and ``info["error"]`` set.
    """
    message = fault_message(fault)
    return f"Error: {message}. The episode has ended.", 0.0, False, True, {"error": message}


class EnvResources:
    """What every agentfly environment (a Gymnasium :class:`AgentFlyEnv`, a PettingZoo AEC env) does with its
    resources: :attr:`manager` is the manager it was given, or the running loop's :func:`default_manager` when
    none was given or the given one was closed; :meth:`close` ends the running episode (its rollout scope).

    Subclasses set ``_manager``, ``_scope`` (the episode's scope, None before the first reset), ``_closed``
    and implement ``async aclose()``.
    """

    _manager: Manager | None = None

    @property
    def manager(self) -> Manager:
        """The resource manager (the running loop's default one unless given)."""
        if self._manager is None or self._manager.closed:
            self._manager = default_manager()
        return self._manager

    def discard(self) -> None:
        """Close an environment that never started an episode (a probe built only to check its constructor's
        arguments): it holds nothing, so no event loop is needed.  Idempotent.

        Raises:
            EnvError: an episode was started (its resources must be released: call ``close()``).
        """
        if self._scope is not None and not self._closed:
            raise EnvError(f"{type(self).__name__}: an episode was started; close() it to release its resources")
        self._closed = True

    def close(self) -> None:
        """Sync wrapper of ``aclose()``; nothing to do when closed or when no episode ever started."""
        if self._closed:
            return
        if self._scope is None:
            self._closed = True
            return
        run_sync(self.aclose())


class AgentFlyEnv(EnvResources, gymnasium.Env[str, str]):
    """A text environment whose backing resources come from a :class:`ResourceManager`.

    Args:
        manager: the resource manager; default: :func:`default_manager` of the loop the env
            runs in (the background loop for the sync API).
        step_timeout: seconds one step may take; past it the episode is truncated with
            ``info["error"]`` and the backing resource is discarded.
        reset_timeout: seconds a reset may take, including waiting for a free resource.
        max_episode_steps: steps after which the episode is truncated (and its rollout scope released);
            ``None`` for no limit.  ``gymnasium.make_vec(id, max_episode_steps=N)`` passes ``N`` here;
            ``gymnasium.make(id, max_episode_steps=N)`` sets it to ``N`` too (Gymnasium passes ``N`` to its
            ``TimeLimit`` wrapper only; the env reads it from the ``make`` call, see :mod:`._compat`), and so
            does a ``TimeLimit`` wrapped around the env by hand, at the sync ``reset``: the env truncates at
            the same step as the wrapper and releases its simulator, engine or container there instead of
            holding it until the next reset.
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the last observation).

    Subclasses declare :attr:`reset_options` (option name -> what it means); :meth:`areset` refuses any
    other option with a ``ConfigError`` naming the valid ones.  Environments with an expert override
    :meth:`expert_action`.

    Info keys on every reset and step: ``task_id`` (str), ``step`` (int, steps taken),
    ``score`` (float, the env's native score), ``won`` (bool), ``error`` (str or None: a
    handled fault); on reset also ``episode_id`` (str, unique per episode; also
    :attr:`episode_id`), kept out of step infos so that two episodes with the same seed and
    actions give equal step infos (Gymnasium's ``check_env`` requires it).  Environments
    with a list of valid actions add ``admissible_actions`` (list[str]).

    Async API: ``await env.areset(seed=..., options=...)``, ``await env.astep(action)``,
    ``await env.aclose()``.  The sync API (``reset``/``step``/``close``) runs the same
    coroutines on a background loop.  After :func:`gymnasium.make`, reach the async API
    through ``env.unwrapped``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    env_name: ClassVar[str] = "Base"
    agent_prompt: ClassVar[AgentPrompt] = AgentPrompt(system="You are an agent in a text environment. End each reply with 'Action: <action>'.")
    max_observation_length: ClassVar[int] = 1 << 20
    max_action_length: ClassVar[int] = 1 << 16
    #: The reset options this env accepts: name -> what it means.  :meth:`areset` refuses every other
    #: key.  A class attribute, or set per instance where it depends on a constructor argument; None
    #: only for an env that forwards its options to another system that checks them (a bridge).
    reset_options: Mapping[str, str] | None = MappingProxyType({})

    def __init__(self, *, manager: Manager | None = None, step_timeout: float | None = 120.0,
                 reset_timeout: float | None = 900.0, max_episode_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode={render_mode!r} is not one of {self.metadata['render_modes']}")
        if step_timeout is not None and step_timeout <= 0:
            raise ConfigError(f"step_timeout={step_timeout!r} must be None or > 0 seconds")
        check_int("max_episode_steps", max_episode_steps, optional=True)
        self.render_mode = render_mode
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
        self.max_episode_steps = limit_of_gymnasium_make() or max_episode_steps
        self.observation_space = TextSpace(self.max_observation_length)
        self.action_space = TextSpace(self.max_action_length)
        self._manager = manager
        self._scope: RolloutScope | None = None
        self._episode_id: str | None = None
        self._task_id: str = ""
        self._steps = 0
        self._last_obs = ""
        self._closed = False

    # ------------------------------------------------------------------ subclass hooks
    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Acquire what the episode needs from ``scope``, start the task, return (observation, info).

        Set ``self._task_id``.  Use ``self.np_random`` for any random choice.
        """
        raise NotImplementedError

    async def _step_episode(self, action: str) -> StepResult:
        """Apply ``action`` (a str, possibly malformed) and return the Gymnasium 5-tuple."""
        raise NotImplementedError

    async def _end_of_episode(self) -> None:
        """Hook run when an episode ends, before its scope is released."""

    async def expert_action(self) -> str:
        """The environment's expert's next action for the running episode (gold path, planner, engine).

        Raises:
            NoExpert: this environment has no expert (the default; environments with one override this).
            ResetNeeded: no episode is running.
        """
        raise NoExpert(f"{self.env_name} has no expert: {type(self).__name__} does not define expert_action()")

    def episode_resource_specs(self) -> list:
        """The specs every episode of this env holds in its rollout scope (for capacity checks).

        Empty by default; environments whose episodes each hold a pooled resource list its spec, so
        that :class:`~agentfly_gym.vector.AsyncTextVectorEnv` can refuse a batch reset that could
        never finish.
        """
        return []

    # ------------------------------------------------------------------ properties
    @property
    def scope(self) -> RolloutScope:
        """The current episode's rollout scope.

        Raises:
            ResetNeeded: no episode is running.
        """
        if self._scope is None:
            raise ResetNeeded(f"{self.env_name}: no episode is running; call reset() first")
        return self._scope

    @property
    def scope_is_open(self) -> bool:
        """True while an episode (and its rollout scope) is running."""
        return self._scope is not None

    @property
    def episode_id(self) -> str | None:
        """The current (or last) episode's id, None before the first reset; also its rollout scope's id."""
        return self._episode_id

    @property
    def scope_id(self) -> str:
        """The id of the current (or last) episode's rollout scope (:meth:`ResourceManager.scope`), ``""`` before
        the first reset; what a :class:`~agentfly_gym.rollout.trajectory.Trajectory` records as ``scope_id``."""
        return self._episode_id or ""

    @property
    def task_id(self) -> str:
        return self._task_id

    # ------------------------------------------------------------------ async API
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new episode.  Returns ``(observation, info)``.

        Args:
            seed: seeds ``self.np_random`` (task choice) as in Gymnasium.
            options: environment-specific, the keys of :attr:`reset_options` (e.g. ``{"task_id": ...}``).

        Raises:
            ConfigError: bad options.  An unknown key (named together with the valid ones) is refused
                before anything changes: the running episode, if any, goes on.
            ResourceTimeout / ResourceStartError: no backing resource could be had.
        """
        if self._closed:
            raise ResetNeeded(f"{self.env_name}: the environment is closed")
        if options is not None and not isinstance(options, dict):
            raise ConfigError(f"options must be a dict or None, got {type(options).__name__}")
        self._check_reset_options(options or {})  # a refused reset leaves the running episode as it was
        super().reset(seed=seed)
        await self._finish_episode()
        self._episode_id = f"{self.env_name}-{next(_episode_ids)}"
        self._scope = self.manager.scope(self._episode_id)
        self._steps = 0
        try:
            async with asyncio.timeout(self.reset_timeout):
                obs, info = await self._reset_with_retry(dict(options or {}))
        except TimeoutError as e:
            await self._finish_episode()
            if isinstance(e, ResourceError):
                raise
            waiting = [f"{p.spec.label} (capacity {p.capacity}, in use {p.metrics.in_use}, waiting {p.metrics.waiting})"
                       for p in self.manager.pools.values() if p.metrics.waiting]
            raise ResourceTimeout(
                f"{self.env_name}: reset did not finish within reset_timeout={self.reset_timeout}s"
                + (f"; still waiting for a free instance of: {', '.join(waiting)}. Every running episode holds its "
                   "resource until it ends, so a batch reset of more sub-environments than the pool's capacity "
                   "cannot finish: raise the env's cap (max_instances=) or "
                   "drive sub-environments asynchronously (astep_env, asend/arecv, the rollout runner)"
                   if waiting else "")) from None
        except BaseException:
            await self._finish_episode()
            raise
        self._last_obs = obs
        return obs, self._complete_info(info, reset=True)

    async def astep(self, action: str) -> StepResult:
        """Apply one action.  Returns ``(observation, reward, terminated, truncated, info)``.

        A malformed action yields a handled observation (the env's own message), never an
        exception.  A resource fault, a fault caused by model output
        (:class:`~agentfly_gym.errors.ModelOutputError`, e.g. a symlink or FIFO the model planted where
        the env writes a file) or a step over ``step_timeout`` truncates the episode with
        ``info["error"]`` set and the resource discarded.

        Cancelling the call ends the episode (its resources are released at once); the next call must be
        a reset.

        Raises:
            ResetNeeded: no episode is running (call reset, also after the episode ended).
            TypeError: ``action`` is not a str.
        """
        if self._scope is None:
            raise ResetNeeded(f"{self.env_name}: no episode is running; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"{self.env_name}: action must be a str, got {type(action).__name__}: {action!r}")
        if len(action) > self.max_action_length:
            action = action[: self.max_action_length]
        # lone surrogates cannot be encoded (py4j, sockets, files): replace them instead of failing the simulator
        action = action.encode("utf-8", "replace").decode("utf-8")
        try:
            async with asyncio.timeout(self.step_timeout):
                obs, reward, terminated, truncated, info = await self._step_episode(action)
        except asyncio.CancelledError:
            # whether the action took effect is unknown, so the episode cannot go on: it ends here and its
            # resources go back to their pools now (not when the env is next reset or closed, which an
            # abandoned env never is); the next call must be a reset
            log.info("%s episode %s: a step was cancelled; the episode ends", self.env_name, self._episode_id)
            await self._finish_episode()
            raise
        except TimeoutError:
            obs, reward, terminated, truncated, info = await self._handled_fault(
                f"the environment did not answer within step_timeout={self.step_timeout}s")
        except (ResourceError, ModelOutputError, OSError, EOFError) as e:
            obs, reward, terminated, truncated, info = await self._handled_fault(e)
        except (ResetNeeded, ConfigError, TypeError):
            raise
        except Exception as e:
            log.exception("%s: step failed", self.env_name)
            obs, reward, terminated, truncated, info = await self._handled_fault(e)
        self._steps += 1
        if not (terminated or truncated) and self.max_episode_steps is not None and self._steps >= self.max_episode_steps:
            truncated = True
        self._last_obs = obs
        info = self._complete_info(info)
        if terminated or truncated:
            await self._finish_episode()
        return obs, float(reward), bool(terminated), bool(truncated), info

    async def aend_episode(self) -> None:
        """End the running episode now, releasing its rollout scope; the next call must be a reset."""
        await self._finish_episode()

    async def aclose(self) -> None:
        """End the running episode (releasing its resources); the shared manager stays open."""
        await self._finish_episode()
        self._closed = True

    # ------------------------------------------------------------------ sync API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Sync wrapper of :meth:`areset`.  Inside a ``TimeLimit`` wrapper, adopts its step limit first."""
        limit = enclosing_time_limit(self)
        if limit is not None:
            self.max_episode_steps = limit
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> StepResult:
        """Sync wrapper of :meth:`astep`."""
        return run_sync(self.astep(action))

    def render(self) -> str | None:
        """The last observation (``render_mode="ansi"``), else None."""
        return self._last_obs if self.render_mode == "ansi" else None

    # ------------------------------------------------------------------ internals
    async def _reset_with_retry(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``_reset_episode``, tried once more on fresh instances if a resource died during it.

        A simulator killed while it loads a task (a JVM or engine process gone, a broken pipe)
        would otherwise lose the whole trajectory; the retry draws the same task (``np_random`` is
        rewound) and its resources replace the dead ones, which are discarded.
        """
        scope = self._scope
        assert scope is not None
        rng_state = self.np_random.bit_generator.state
        try:
            return await self._reset_episode(scope, dict(options))
        except (ResourceDied, BrokenPipeError, ConnectionError, EOFError) as e:
            log.warning("%s episode %s: a resource died during reset (%s: %s); retrying once on a fresh instance",
                        self.env_name, self._episode_id, type(e).__name__, e)
            for r in list(scope.resources.values()):
                if isinstance(r, InProcessResource):
                    r.mark_dead(f"{type(e).__name__}: {e}")
                await scope.discard(r)
        self.np_random.bit_generator.state = rng_state
        return await self._reset_episode(scope, dict(options))

    def _check_reset_options(self, options: dict[str, Any]) -> None:
        if self.reset_options is None:
            return
        unknown = sorted(map(str, set(options) - set(self.reset_options)))
        if unknown:
            raise ConfigError(f"{self.env_name}: unknown reset options {unknown}; valid: {sorted(self.reset_options)}")

    def _complete_info(self, info: dict[str, Any], *, reset: bool = False) -> dict[str, Any]:
        out = {"task_id": self._task_id, "step": self._steps, "score": 0.0, "won": False, "error": None}
        if reset:
            out["episode_id"] = self._episode_id or ""
        out.update(info)
        return out

    async def _handled_fault(self, fault: BaseException | str) -> StepResult:
        """Truncate the episode after a fault (:func:`fault_step`), discarding the resources it held (their
        state is unknown)."""
        message = fault_message(fault)
        log.warning("%s episode %s: %s", self.env_name, self._episode_id, message)
        scope = self._scope
        if scope is not None:
            for r in list(scope.resources.values()):
                if isinstance(r, InProcessResource):
                    r.mark_dead(message)
                await scope.discard(r)
        return fault_step(message)

    async def _finish_episode(self) -> None:
        scope = self._scope
        if scope is None:
            return
        try:
            await self._end_of_episode()
        finally:
            self._scope = None
            await scope.aclose()
