"""Per-process state of the plugin: one resource manager per verl agent-loop worker.

verl builds a new agent-loop object for every trajectory, so pools cannot live on the object.
They live here, at module level: :func:`get_manager` returns one
:class:`~agentfly_gym.resources.ResourceManager` per process, created lazily inside the running
event loop (a manager belongs to one loop), so simulators, engines and containers are reused
across all trajectories of a worker.  :func:`shutdown` / :func:`ashutdown` release everything
(the manager also tears its instances down at interpreter exit as a last resort).
With ``AGENTFLY_GYM_MANAGER=ray`` (or ``auto``: Ray when running inside a Ray job, as verl's workers do)
that manager is a :class:`~agentfly_gym.resources.ray.RayResourceManager`, so every agent-loop worker of
the cluster shares one set of pools.  Nothing happens at import.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any

from agentfly_gym.resources.protocol import Manager
from agentfly_gym.resources.select import manager_from_environment

__all__ = ["get_manager", "shutdown", "ashutdown", "chat_tokenizer", "record_failure", "failure_metrics",
           "reset_failure_metrics"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_manager: Manager | None = None
_manager_loop: asyncio.AbstractEventLoop | None = None
_chats: dict[tuple[int, str], tuple[Any, Any]] = {}
_failures: dict[str, dict[str, int]] = {"by_env": {}, "by_error": {}, "by_mode": {}}


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


def get_manager() -> Manager:
    """The worker's resource manager, created on first call in the running loop.

    If the loop that owned the previous manager has stopped or closed (e.g. a test's loop),
    that manager is closed synchronously and a new one is made for the running loop.

    Raises:
        RuntimeError: no event loop is running.
    """
    global _manager, _manager_loop
    loop = asyncio.get_running_loop()
    with _lock:
        if _manager is not None and not _manager.closed and _manager_loop is loop:
            return _manager
        old, old_loop = _manager, _manager_loop
        _manager = manager_from_environment()  # AGENTFLY_GYM_MANAGER=ray: one set of pools for the whole cluster
        _manager_loop = loop
    if old is not None and not old.closed:
        log.warning("agentfly_gym_verl: the event loop changed; closing the previous resource manager %s", old.id)
        if old_loop is not None and old_loop.is_running() and not old_loop.is_closed():
            asyncio.run_coroutine_threadsafe(old.aclose(), old_loop)
        else:
            old.close_sync()
    return _manager


async def ashutdown() -> None:
    """Close the worker's manager (every pooled resource is stopped); idempotent.

    Call it from the loop that owns the manager; from another loop it closes it synchronously.
    """
    global _manager, _manager_loop
    with _lock:
        m, m_loop = _manager, _manager_loop
        _manager, _manager_loop = None, None
    if m is None or m.closed:
        return
    if m_loop is asyncio.get_running_loop():
        await m.aclose()
    else:
        await asyncio.to_thread(_close_from_outside, m, m_loop)


def shutdown(timeout: float = 120.0) -> None:
    """Synchronous :func:`ashutdown`, for use outside the manager's loop (e.g. ``atexit``, a
    test teardown, a Ray actor's exit hook).

    Args:
        timeout: seconds to wait for an orderly close when the owning loop runs in another thread.

    Raises:
        RuntimeError: called from inside the loop that owns the manager (await :func:`ashutdown` there).
    """
    global _manager, _manager_loop
    with _lock:
        m, m_loop = _manager, _manager_loop
        if m is not None and m_loop is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is m_loop:
                raise RuntimeError("agentfly_gym_verl.shutdown() called inside the manager's own event loop; "
                                   "use `await agentfly_gym_verl.ashutdown()` there")
        _manager, _manager_loop = None, None
    if m is None or m.closed:
        return
    _close_from_outside(m, m_loop, timeout)


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
    m.close_sync()


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
