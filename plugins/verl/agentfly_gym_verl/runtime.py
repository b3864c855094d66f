"""Per-process state of the plugin: one :class:`WorkerRuntime` per verl agent-loop worker.

verl builds a new agent-loop object for every trajectory, so what trajectories share cannot live on
that object.  It lives on a :class:`WorkerRuntime`: the worker's
:class:`~agentfly_gym.resources.ResourceManager` (so simulators, engines and containers are reused
across all trajectories of a worker) and the self-play games in flight (the pairing of two sessions
into one game, :mod:`agentfly_gym_verl.selfplay`), and the predicted rollout lengths with the start gate that
orders the worker's rollouts by them (kept across training steps; see :meth:`WorkerRuntime.ordering`).
:func:`get_runtime` makes it lazily inside the
running event loop (a manager belongs to one loop); :func:`close` / :func:`aclose` close it and
everything it holds (the manager also tears its instances down at interpreter exit as a last resort).
With ``AGENTFLY_GYM_MANAGER=ray`` (or ``auto``: Ray when running inside a Ray job, as verl's workers do)
that manager is a :class:`~agentfly_gym.resources.ray.RayResourceManager`, so every agent-loop worker of
the cluster shares one set of pools.  Nothing happens at import.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from pathlib import Path
from typing import Any

from agentfly_gym.errors import ConfigError
from agentfly_gym.resources.protocol import Manager
from agentfly_gym.rollout.ordering import RolloutLengths, StartGate
from agentfly_gym.resources.select import manager_from_environment

__all__ = ["WorkerRuntime", "get_runtime", "get_manager", "close", "aclose", "chat_tokenizer",
           "record_failure", "failure_metrics", "reset_failure_metrics"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_runtime: WorkerRuntime | None = None  # the worker's runtime (of the loop that made it), swapped by _swap only
_chats: dict[tuple[int, str], tuple[Any, Any]] = {}
_failures: dict[str, dict[str, int]] = {"by_env": {}, "by_error": {}, "by_mode": {}}


class WorkerRuntime:
    """What one agent-loop worker's trajectories share, for the life of one event loop.

    Attributes:
        loop: the event loop it belongs to.
        manager: the resource manager (of the kind ``AGENTFLY_GYM_MANAGER`` names).
        selfplay: the self-play games in flight (:class:`agentfly_gym_verl.selfplay.SelfPlayGames`), made by
            the self-play loop on first use; None until then.
        lengths: per file (None: kept in memory only), the predicted rollout lengths of this worker, learned
            from every trajectory it finished (see :meth:`ordering`).
        gate: the start gate of this worker's rollouts (None until the first rollout).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.manager: Manager = manager_from_environment()  # ray: one set of pools for the whole cluster
        self.selfplay: Any = None
        self.lengths: dict[str | None, RolloutLengths] = {}
        self.gate: StartGate | None = None

    def ordering(self, path: str | None = None, limit: int | None = None) -> tuple[RolloutLengths, StartGate]:
        """The predicted lengths kept in ``path`` (None: in memory only) and the worker's start gate.

        The lengths are read from ``path`` on first use (a file that is not a saved estimate is logged and
        replaced by a fresh estimate, never an error of the rollouts) and written there (merged with what other
        workers wrote, atomically) whenever the worker's last rollout in flight finishes: the end of a
        training step's batch, and when the runtime closes.  The gate lets at most ``limit`` rollouts play at
        once (None: no limit), longest-predicted first; the first call fixes it.
        """
        lengths = self.lengths.get(path)
        if lengths is None:
            try:
                lengths = RolloutLengths(path=path)
            except ConfigError as e:
                log.warning("agentfly_gym_verl: %s; starting from a fresh estimate (the file is replaced at the end "
                            "of the batch)", e)
                lengths = RolloutLengths()
                lengths.path = Path(path) if path is not None else None
            self.lengths[path] = lengths
        if self.gate is None:
            self.gate = StartGate(limit, on_idle=self.save_lengths)
        elif limit != self.gate.limit and not getattr(self, "_limit_warned", False):
            self._limit_warned = True
            log.warning("agentfly_gym_verl: max_concurrent=%r ignored: this worker's start gate has limit %r (the "
                        "first agent loop's)", limit, self.gate.limit)
        return lengths, self.gate

    def save_lengths(self) -> None:
        """Write every estimate that has a file (a failure is logged: the estimate only orders rollouts)."""
        for lengths in self.lengths.values():
            if lengths.path is None or not len(lengths):
                continue
            try:
                lengths.save()
            except Exception as e:  # noqa: BLE001 - a full disk must not fail training
                log.warning("agentfly_gym_verl: could not save the predicted lengths to %s (%s: %s)", lengths.path,
                            type(e).__name__, e)

    def _forget_games(self) -> None:
        games, self.selfplay = self.selfplay, None
        if games is not None:
            games.close()

    async def aclose(self) -> None:
        """Save the predicted lengths, drop the games in flight and close the manager (from :attr:`loop`; from
        another loop it closes synchronously)."""
        self.save_lengths()
        self._forget_games()
        if self.manager.closed:
            return
        if self.loop is asyncio.get_running_loop():
            await self.manager.aclose()
        else:
            await asyncio.to_thread(_close_from_outside, self.manager, self.loop)

    def close(self, timeout: float = 120.0) -> None:
        """Synchronous :meth:`aclose`, from outside :attr:`loop` (waits ``timeout`` seconds for an orderly close
        on that loop when it runs in another thread)."""
        self.save_lengths()
        self._forget_games()
        if not self.manager.closed:
            _close_from_outside(self.manager, self.loop, timeout)


def _swap(loop: asyncio.AbstractEventLoop | None) -> tuple[WorkerRuntime | None, WorkerRuntime | None]:
    """Under the lock: with ``loop``, the live runtime of ``loop`` or a new one in place of the previous;
    with None, no runtime any more.  Returns (current, previous, when replaced)."""
    global _runtime
    with _lock:
        old = _runtime
        if loop is not None and old is not None and old.loop is loop and not old.manager.closed:
            return old, None
        _runtime = WorkerRuntime(loop) if loop is not None else None
        return _runtime, old


def record_failure(env_id: str, error: BaseException, mode: str) -> None:
    """Count one failed trajectory of this worker (see :func:`failure_metrics`)."""
    with _lock:
        for table, key in (("by_env", env_id or "?"), ("by_error", type(error).__name__), ("by_mode", mode)):
            _failures[table][key] = _failures[table].get(key, 0) + 1


def failure_metrics() -> dict[str, Any]:
    """This worker process's failed trajectories since start (or :func:`reset_failure_metrics`).

    Under verl's V1 trainer a failed trajectory leaves no training row (verl's convention for a
    session without output), so it is counted here and logged (a WARNING per failure) instead.

    Returns:
        ``{"failed_trajectories": int, "by_env": {env_id: int}, "by_error": {exception class
        name: int}, "by_mode": {"chain"/"step": int}}``.
    """
    with _lock:
        out: dict[str, Any] = {k: dict(v) for k, v in _failures.items()}
    out["failed_trajectories"] = sum(out["by_mode"].values())
    return out


def reset_failure_metrics() -> None:
    """Zero the counts of :func:`failure_metrics`."""
    with _lock:
        for v in _failures.values():
            v.clear()


def get_runtime() -> WorkerRuntime:
    """The worker's runtime, made on first call in the running loop.

    If the loop that owned the previous runtime has stopped or closed (e.g. a test's loop), that runtime
    is closed (its manager synchronously when its loop is gone) and a new one is made for the running loop.

    Raises:
        RuntimeError: no event loop is running.
    """
    loop = asyncio.get_running_loop()
    current = _runtime
    if current is not None and current.loop is loop and not current.manager.closed:
        return current
    current, old = _swap(loop)
    if old is not None and not old.manager.closed:
        log.warning("agentfly_gym_verl: the event loop changed; closing the previous resource manager %s",
                    old.manager.id)
        old._forget_games()
        if old.loop.is_running() and not old.loop.is_closed():
            asyncio.run_coroutine_threadsafe(old.manager.aclose(), old.loop)
        else:
            old.manager.close()
    return current


def get_manager() -> Manager:
    """The worker's resource manager (:attr:`WorkerRuntime.manager` of :func:`get_runtime`).

    Raises:
        RuntimeError: no event loop is running.
    """
    return get_runtime().manager


def current_runtime() -> WorkerRuntime | None:
    """The worker's runtime if one is open (never makes one)."""
    return _runtime


async def aclose() -> None:
    """Close the worker's runtime (every pooled resource is stopped, the self-play games in flight are
    dropped); idempotent.

    Call it from the loop that owns the manager; from another loop it closes it synchronously.
    """
    _, old = _swap(None)
    if old is not None:
        await old.aclose()


def close(timeout: float = 120.0) -> None:
    """Synchronous :func:`aclose`, for use outside the manager's loop (e.g. ``atexit``, a
    test teardown, a Ray actor's exit hook).

    Args:
        timeout: seconds to wait for an orderly close when the owning loop runs in another thread.

    Raises:
        RuntimeError: called from inside the loop that owns the manager (await :func:`aclose` there).
    """
    current = _runtime
    if current is not None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is current.loop:
            raise RuntimeError("agentfly_gym_verl.close() called inside the manager's own event loop; "
                               "use `await agentfly_gym_verl.aclose()` there")
    _, old = _swap(None)
    if old is not None:
        old.close(timeout)


def _close_from_outside(m: Manager, loop: asyncio.AbstractEventLoop | None, timeout: float = 120.0) -> None:
    if loop is not None and loop.is_running() and not loop.is_closed():
        fut = asyncio.run_coroutine_threadsafe(m.aclose(), loop)
        try:
            fut.result(timeout)
            return
        except (concurrent.futures.TimeoutError, RuntimeError) as e:
            log.warning("closing the resource manager on its loop failed (%s); closing synchronously", e)
    elif loop is not None and not loop.is_closed():
        try:
            loop.run_until_complete(m.aclose())
            return
        except RuntimeError as e:
            log.warning("closing the resource manager on its loop failed (%s); closing synchronously", e)
    m.close()


def chat_tokenizer(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """A cached :class:`~agentfly_gym.rollout.chat.ChatTokenizer` for ``tokenizer`` (built once per
    tokenizer object and template kwargs; its construction renders and checks the template).

    Raises:
        TokenizationError: see ``ChatTokenizer``.
    """
    from agentfly_gym.rollout.chat import ChatTokenizer

    kwargs = dict(chat_template_kwargs or {})
    key = (id(tokenizer), repr(sorted(kwargs.items())))
    with _lock:
        hit = _chats.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    chat = ChatTokenizer(tokenizer, chat_template_kwargs=kwargs)
    with _lock:
        _chats[key] = (tokenizer, chat)
    return chat
