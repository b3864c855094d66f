"""An asynchronous vector environment for text environments.

:class:`AsyncTextVectorEnv` offers two faces over the same sub-environments:

* Gymnasium's batch API (``reset``/``step`` and ``areset``/``astep``): all sub-environments
  step *concurrently* in one event loop, with Gymnasium 1.x autoreset modes and the
  dict-of-arrays ``infos`` format.  A batch still returns when its slowest member does.
* The asynchronous API that matters for agentic RL, after EnvPool: ``send(actions, env_ids)``
  schedules steps and returns at once; ``recv(min_ready=..., timeout=...)`` returns the
  sub-environments that are done, so fast ones never wait for slow ones.  ``astep_env`` /
  ``areset_env`` drive one sub-environment from a coroutine.

All sub-environments share one :class:`~agentfly_gym.resources.ResourceManager`, so
their simulators, containers and servers come from the same pools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium.error
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .envs.base import AgentFlyEnv, fault_step
from .errors import CallOrderError, ConfigError, ModelOutputError, ResetNeeded
from .limits import check_int
from .resources.protocol import Manager
from .utils.aio import run_sync
from .utils.imports import load_object

__all__ = ["AlreadyPendingCallError", "AsyncTextVectorEnv", "VectorResult"]


class AlreadyPendingCallError(CallOrderError, gymnasium.error.AlreadyPendingCallError):
    """``send`` named a sub-env whose previous step was not received yet (``recv`` it first).

    Gymnasium's name for this misuse, so a Gymnasium user's ``except AlreadyPendingCallError`` still
    catches it; also a :class:`~agentfly_gym.errors.CallOrderError`.

    Attributes:
        name: the call that is pending (``"step"``), as in Gymnasium.
        env_id: the sub-env's index.
    """

    def __init__(self, message: str, name: str = "step", *, env_id: int | None = None) -> None:
        Exception.__init__(self, message)
        self.name, self.env_id = name, env_id

log = logging.getLogger(__name__)

#: (observations, rewards, terminated, truncated, infos, env_ids)
VectorResult = tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]


def _load(entry_point: str) -> Callable[..., AgentFlyEnv]:
    return load_object(entry_point, what="entry point")


def _is_scalar(value: Any) -> bool:
    return type(value) in (int, float, bool) or isinstance(value, np.number)


def _add_info(out: dict[str, Any], info: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """Add sub-env ``i``'s ``info`` to the batched ``out`` (``n`` entries), as Gymnasium 1.x's
    ``VectorEnv._add_info`` does: per key an array of length ``n`` and a boolean mask ``_key``; a dict
    value (``final_info`` under ``SAME_STEP``) is batched recursively into a dict of arrays with its own
    masks; ``final_obs`` is an object array.  Beyond Gymnasium, values of mixed types in one key turn the
    array into an object array instead of failing (text envs report e.g. ``error`` as None or a str)."""
    for key, value in info.items():
        if key == "final_obs":
            arr = out.get(key)
            if arr is None:
                arr = np.full(n, None, dtype=object)
            arr[i] = value
        elif isinstance(value, dict):
            arr = _add_info(out.get(key, {}), value, i, n)
        else:
            arr = out.get(key)
            if arr is None:
                if _is_scalar(value):
                    arr = np.zeros(n, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    arr = np.zeros((n, *value.shape), dtype=value.dtype)
                else:
                    arr = np.full(n, None, dtype=object)
            if arr.dtype != object:
                fits = _is_scalar(value) if arr.ndim == 1 else (
                    isinstance(value, np.ndarray) and value.shape == arr.shape[1:])
                if not fits:
                    old, arr = arr, np.full(n, None, dtype=object)
                    for j in np.flatnonzero(out[f"_{key}"]):
                        arr[j] = old[j]
            arr[i] = value
        mask = out.get(f"_{key}")
        if mask is None:
            mask = np.zeros(n, dtype=np.bool_)
        mask[i] = True
        out[key], out[f"_{key}"] = arr, mask
    return out


def _batch_infos(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Gymnasium's vector info format (see :func:`_add_info`): per key an array of length n plus a
    boolean mask ``_key``; nested dicts (``final_info``) as dicts of such arrays."""
    out: dict[str, Any] = {}
    for i, info in enumerate(infos):
        _add_info(out, info, i, len(infos))
    return out


class AsyncTextVectorEnv(VectorEnv):
    """``num_envs`` text environments stepped independently on one event loop.

    Args:
        env_fns: callables that each build one :class:`~agentfly_gym.envs.AgentFlyEnv`.
        autoreset_mode: a :class:`gymnasium.vector.AutoresetMode` (or its value):
            ``NEXT_STEP`` (default): the step after an episode ends resets that sub-env (its
            action is ignored, reward 0); ``SAME_STEP``: the ending step returns the reset
            observation and puts the last one in ``infos["final_obs"]`` (object array) and its info in
            ``infos["final_info"]`` (a dict of arrays with ``_key`` masks, as Gymnasium 1.x batches it;
            ``infos["_final_info"]`` marks the sub-envs that ended);
            ``DISABLED``: call ``reset(options={"reset_mask": mask})`` yourself.

    Observations are tuples of ``str`` (length ``num_envs``, or the number of ready envs
    for :meth:`recv`); rewards float64 arrays; terminated/truncated bool arrays.

    The sync API runs on the library's background loop (:mod:`agentfly_gym.utils.aio`); the
    async API runs in the caller's loop.  Do not mix both on one instance.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": ["ansi"]}

    def __init__(self, env_fns: Sequence[Callable[[], AgentFlyEnv]], *,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP) -> None:
        if not env_fns:
            raise ConfigError("env_fns must hold at least one environment factory")
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ConfigError(f"autoreset_mode={autoreset_mode!r} is not one of {[m.value for m in AutoresetMode]}",
                              field="autoreset_mode") from None
        self.envs: list[AgentFlyEnv] = [fn() for fn in env_fns]
        for i, e in enumerate(self.envs):
            if not isinstance(e.unwrapped, AgentFlyEnv):
                raise ConfigError(f"env_fns[{i}] built {type(e).__name__}, not an AgentFlyEnv")
        self.envs = [e.unwrapped for e in self.envs]
        self.num_envs = len(self.envs)
        self.metadata = dict(self.metadata, autoreset_mode=self.autoreset_mode)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = self.envs[0].render_mode
        self._needs_reset = np.ones(self.num_envs, dtype=np.bool_)
        self._obs: list[str] = [""] * self.num_envs  # each sub-env's current observation ("" before its reset)
        self._pending: dict[int, asyncio.Task] = {}
        self.closed = False

    @classmethod
    def from_entry_point(cls, entry_point: str, num_envs: int = 1, *,
                         autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                         manager: Manager | None = None, max_episode_steps: int | None = None,
                         **env_kwargs: Any) -> AsyncTextVectorEnv:
        """``num_envs`` copies of the env class at ``entry_point`` sharing ``manager``.

        This is the ``vector_entry_point`` of every registered env, so
        ``gymnasium.make_vec("agentfly/Chess-v0", num_envs=8)`` returns one of these.
        """
        check_int("num_envs", num_envs)
        env_cls = _load(entry_point)
        if max_episode_steps is not None:
            env_kwargs["max_episode_steps"] = max_episode_steps
        return cls([lambda: env_cls(manager=manager, **env_kwargs) for _ in range(num_envs)],
                   autoreset_mode=autoreset_mode)

    # ------------------------------------------------------------------ async batch API
    async def areset(self, *, seed: int | Sequence[int | None] | None = None,
                     options: dict[str, Any] | None = None) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset sub-environments concurrently.

        Args:
            seed: one int (sub-env i gets ``seed + i``), a sequence of ``num_envs`` seeds, or None.
            options: passed to every sub-env; ``options["reset_mask"]`` (bool array, shape ``(num_envs,)``)
                resets only those sub-envs; the others are returned with their current observation (as
                Gymnasium's vector envs do; ``""`` for one never reset) and no info (mask ``_key`` False).

        Raises:
            ConfigError: ``reset_mask`` has the wrong shape, or the reset needs more instances of a pool
                than its cap.
        """
        seeds = self._seeds(seed)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        mask = np.ones(self.num_envs, dtype=np.bool_) if mask is None else np.asarray(mask, dtype=np.bool_)
        if mask.shape != (self.num_envs,):
            raise ConfigError(f"reset_mask must have shape ({self.num_envs},), got {mask.shape}")
        idx = [i for i in range(self.num_envs) if mask[i]]
        self._check_capacity(idx)
        results = await asyncio.gather(*(self.envs[i].areset(seed=seeds[i], options=options or None) for i in idx))
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, (o, info) in zip(idx, results):
            self._obs[i], infos[i] = o, info
            self._needs_reset[i] = False
        return tuple(self._obs), _batch_infos(infos)

    async def astep(self, actions: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-environment concurrently (with autoreset).  Returns the Gymnasium 5-tuple of batches."""
        if len(actions) != self.num_envs:
            raise ConfigError(f"expected {self.num_envs} actions, got {len(actions)}")
        results = await asyncio.gather(*(self.astep_env(i, a) for i, a in enumerate(actions)))
        return self._stack(results)[:5]

    async def astep_env(self, env_id: int, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Step sub-environment ``env_id`` alone (autoreset applies).  Returns the single-env 5-tuple.

        Never raises for a fault of the sub-env: an unexpected error, or one caused by the model's output
        (:class:`~agentfly_gym.errors.ModelOutputError`, even where it is also a ``ConfigError``), truncates its episode
        with ``info["error"]`` (the same observation and info as a fault the sub-env handles itself:
        :func:`~agentfly_gym.envs.base.fault_step`), so one broken rollout cannot crash the others.

        Raises:
            ResetNeeded: with ``autoreset_mode=DISABLED``, the sub-env's episode has ended (a
                :class:`~agentfly_gym.errors.CallOrderError`: reset it first).
        """
        env = self.envs[env_id]
        if self._needs_reset[env_id] and self.autoreset_mode == AutoresetMode.DISABLED:
            raise ResetNeeded(f"sub-env {env_id} has ended; reset it with options={{'reset_mask': ...}}")
        try:
            if self._needs_reset[env_id]:
                obs, info = await env.areset()
                self._needs_reset[env_id] = False
                self._obs[env_id] = obs
                return obs, 0.0, False, False, info
            obs, reward, terminated, truncated, info = await env.astep(action)
        except ModelOutputError as e:  # before ConfigError: a path fault the model caused is not the caller's
            log.warning("sub-env %d: %s", env_id, e)
            await env.aend_episode()
            obs, reward, terminated, truncated, info = fault_step(e)
        except ConfigError:
            raise
        except Exception as e:  # keep the other rollouts alive
            log.exception("sub-env %d failed", env_id)
            await env.aend_episode()
            obs, reward, terminated, truncated, info = fault_step(e)
        if terminated or truncated:
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                final_obs, final_info = obs, info
                try:
                    obs, info = await env.areset()
                except Exception as e:  # contained as NEXT_STEP contains it: this sub-env alone reports the fault
                    log.exception("sub-env %d: autoreset failed", env_id)
                    obs, _, _, _, info = fault_step(e)
                    self._needs_reset[env_id] = True  # its next step tries the reset again
                info = dict(info, final_obs=final_obs, final_info=final_info)
            else:
                self._needs_reset[env_id] = True
        self._obs[env_id] = obs
        return obs, reward, terminated, truncated, info

    async def areset_env(self, env_id: int, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Reset sub-environment ``env_id`` alone."""
        obs, info = await self.envs[env_id].areset(seed=seed, options=options)
        self._needs_reset[env_id] = False
        self._obs[env_id] = obs
        return obs, info

    # ------------------------------------------------------------------ async send / recv (EnvPool style)
    async def asend(self, actions: Sequence[str], env_ids: Sequence[int] | None = None) -> None:
        """Schedule one step for each of ``env_ids`` (default: all) and return at once.

        Raises:
            ConfigError: lengths differ, or an id is out of range.
            AlreadyPendingCallError: an env already has a step in flight (a :class:`CallOrderError`).
        """
        ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        if len(actions) != len(ids):
            raise ConfigError(f"got {len(actions)} actions for {len(ids)} env ids")
        for i in ids:
            if not 0 <= i < self.num_envs:
                raise ConfigError(f"env id {i} is out of range [0, {self.num_envs})")
            if i in self._pending:
                raise AlreadyPendingCallError(f"sub-env {i} already has a step in flight; recv() it first", env_id=i)
        for i, a in zip(ids, actions):
            self._pending[i] = asyncio.ensure_future(self.astep_env(i, a))

    async def arecv(self, min_ready: int | None = None, timeout: float | None = None) -> VectorResult:
        """Wait until at least ``min_ready`` sent steps are done (default 1), or ``timeout`` seconds pass,
        and return all that are done, in completion order, with their ``env_ids``.

        Returns empty batches when nothing was pending or nothing finished in time.
        """
        if not self._pending:
            return self._stack([])
        need = max(1, min(min_ready or 1, len(self._pending)))
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            done = [i for i, t in self._pending.items() if t.done()]
            if len(done) >= need:
                break
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            await asyncio.wait([t for t in self._pending.values() if not t.done()], timeout=remaining,
                               return_when=asyncio.FIRST_COMPLETED)
        results = []
        for i in done:
            t = self._pending.pop(i)
            results.append((i, t.result()))
        return self._stack([r for _, r in results], [i for i, _ in results])

    # ------------------------------------------------------------------ sync API
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """Sync wrapper of :meth:`areset`."""
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, actions: Sequence[str]):
        """Sync wrapper of :meth:`astep`."""
        return run_sync(self.astep(actions))

    def send(self, actions: Sequence[str], env_ids: Sequence[int] | None = None) -> None:
        """Sync wrapper of :meth:`asend` (the steps run on the background loop)."""
        run_sync(self.asend(actions, env_ids))

    def recv(self, min_ready: int | None = None, timeout: float | None = None) -> VectorResult:
        """Sync wrapper of :meth:`arecv`."""
        return run_sync(self.arecv(min_ready, timeout))

    async def aclose(self) -> None:
        """Cancel steps in flight and close every sub-environment (the shared manager stays open)."""
        for t in self._pending.values():
            t.cancel()
        if self._pending:
            await asyncio.gather(*self._pending.values(), return_exceptions=True)
        self._pending.clear()
        await asyncio.gather(*(e.aclose() for e in self.envs), return_exceptions=True)
        self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        if not self.closed:
            run_sync(self.aclose())

    def render(self) -> tuple[str | None, ...]:
        return tuple(e.render() for e in self.envs)

    # ------------------------------------------------------------------ helpers
    def _check_capacity(self, resetting: list[int]) -> None:
        """Refuse a batch reset that needs more instances of a pool than its capacity.

        Every running episode holds its resource until it ends, so such a reset would wait until
        ``reset_timeout`` and fail; say so now.
        """
        need: dict[str, list] = {}
        for i, env in enumerate(self.envs):
            if i in resetting or env.scope_is_open:
                for spec in env.episode_resource_specs():
                    need.setdefault(spec.key, [spec, 0])[1] += 1
        for spec, n in need.values():
            if n > spec.max_instances:
                raise ConfigError(
                    f"a batch reset of {n} sub-environments needs {n} instances of {spec.label}, but its pool holds at "
                    f"most max_instances={spec.max_instances}: raise the env's cap (max_instances=) "
                    f"to >= {n}, or drive sub-environments asynchronously (astep_env, asend/arecv)", field="max_instances")

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ConfigError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        return seeds

    @staticmethod
    def _stack(results: Sequence[tuple[str, float, bool, bool, dict[str, Any]]], env_ids: Sequence[int] | None = None) -> VectorResult:
        obs = tuple(r[0] for r in results)
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminated = np.array([r[2] for r in results], dtype=np.bool_)
        truncated = np.array([r[3] for r in results], dtype=np.bool_)
        infos = _batch_infos([r[4] for r in results])
        ids = np.arange(len(results)) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        return obs, rewards, terminated, truncated, infos, ids
