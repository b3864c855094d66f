"""Agents as rollouts: any agent harness, run against its own gateway session, scored, with limits.

An agent is ``async def agent(base_url, api_key, task, **resources) -> answer``: it points its OpenAI client (or
framework) at ``base_url`` with ``api_key``, works on ``task`` and returns its answer.  :func:`run_agent` opens a
session with the rollout's turn limit, runs the agent under a time limit, closes and drops the session (later
calls of a lingering agent are refused; the gateway's memory does not grow with the rollouts), scores the answer and returns an :class:`AgentRollout` holding the recorded
segments.  An agent that raises, hangs past ``timeout_s`` or exhausts its turns gives an error rollout (reward 0,
``status`` ``"error"`` / ``"truncated"``), never an exception that stalls a batch.  A plain (non-async) function
runs in a worker thread; on a time-out the rollout ends at once, and the thread's further calls are refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import ConfigError
from .session import Segment

__all__ = ["AgentRollout", "prompt_task", "run_agent", "run_agents"]


@dataclasses.dataclass
class AgentRollout:
    """One agent run as recorded by the gateway.

    Attributes:
        trajectory_id, group_id, task_id: ids (rollouts of one task share ``group_id``: a GRPO group).
        answer: what the agent returned (None when it failed).
        reward: the score of the answer (0.0 when the agent or the score failed).
        status: ``complete`` (the agent returned), ``truncated`` (its session's turn limit ended it), ``error``
            (it raised or timed out; ``error`` says which).
        error: the failure, or None.
        reward_error: why ``score`` gave no reward, or None.
        segments: the recorded :class:`~.session.Segment` list (each one chain of token ids).
        num_calls, num_rewritten: chat-completion calls, and those that started a segment after the first.
        seconds: the wall time of the agent run (seconds).
    """

    trajectory_id: str
    group_id: str
    task_id: str
    answer: Any = None
    reward: float = 0.0
    status: str = "complete"
    error: str | None = None
    reward_error: str | None = None
    segments: list[Segment] = dataclasses.field(default_factory=list)
    num_calls: int = 0
    num_rewritten: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (segments as :meth:`Segment.to_json`; the answer as ``str`` when not JSON-able)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "segments"}
        if not isinstance(d["answer"], (str, int, float, bool, type(None), list, dict)):
            d["answer"] = str(d["answer"])
        d["segments"] = [s.to_json() for s in self.segments]
        return d


def prompt_task(prompt: Any) -> dict[str, Any]:
    """The task of a trainer's prompt row: ``{"prompt": text, "messages": messages}`` (text: the last user
    message's; a plain string is one user message)."""
    if isinstance(prompt, str):
        return {"prompt": prompt, "messages": [{"role": "user", "content": prompt}]}
    messages = [dict(m) for m in prompt]
    text = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    return {"prompt": text, "messages": messages}


def check_timeout(timeout_s: Any) -> float:
    """``timeout_s`` as a float of seconds > 0 (an agent's or its command's time limit).

    Raises:
        ConfigError: anything else (a bool included), ``field="timeout_s"``.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ConfigError(f"timeout_s={timeout_s!r} must be a number of seconds > 0", field="timeout_s")
    return float(timeout_s)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _describe(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {tb[-1].name}, line {tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"[:2000]


async def run_agent(gateway: Any, agent: Callable[..., Any], task: Any, *, base_url: str, timeout_s: float = 600.0,
                    max_turns: int | None = None,
                    score: Callable[[Any, Any], float | Awaitable[float]] | None = None,
                    resources: dict[str, Any] | None = None, task_id: str | None = None,
                    trajectory_id: str | None = None, group_id: str = "") -> AgentRollout:
    """Run ``agent`` on ``task`` as one rollout (see the module docstring).

    Args:
        gateway: the :class:`~.app.Gateway` (served at ``base_url``).
        agent: ``agent(base_url, api_key, task, **resources) -> answer`` (async, or plain: run in a thread).
        task: what the agent works on (passed as is).
        base_url: the gateway's root URL (``http://127.0.0.1:PORT``); the agent gets its session's
            ``{base_url}/sessions/{id}/v1``.
        timeout_s: seconds the agent may run (then it is cancelled: status ``error``).
        max_turns: the session's turn limit (None: the gateway's default).
        score: ``score(answer, task) -> reward`` (may be async), called when the agent returned; a raising score
            gives reward 0 and ``reward_error``.  None: reward 0.
        resources: keyword arguments for the agent (the rollout's container, ...).
        task_id, trajectory_id, group_id: ids recorded with the rollout (task_id defaults to ``task["task_id"]``).

    Raises:
        ConfigError: a bad ``timeout_s``.
    """
    check_timeout(timeout_s)
    if task_id is None:
        task_id = str(task.get("task_id", "")) if isinstance(task, dict) else ""
    out = AgentRollout(trajectory_id=trajectory_id or uuid.uuid4().hex[:12], group_id=group_id, task_id=task_id)
    session = gateway.open_session(max_turns=max_turns, metadata={"trajectory_id": out.trajectory_id,
                                                                  "group_id": group_id, "task_id": task_id})
    url = f"{base_url.rstrip('/')}/sessions/{session.id}/v1"
    t0 = time.monotonic()
    try:
        if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(type(agent).__call__):
            call = agent(url, session.api_key, task, **(resources or {}))
        else:
            call = asyncio.to_thread(agent, url, session.api_key, task, **(resources or {}))
        out.answer = await asyncio.wait_for(_maybe_await(call), timeout_s)
    except TimeoutError:
        out.status, out.error = "error", f"the agent ran past its time limit of {timeout_s:g} s"
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001  (agent code is hostile input: any failure is this rollout's error)
        out.status, out.error = "error", _describe(e)
    finally:
        session.close()
        gateway.sessions.pop(session.id, None)  # the rollout keeps what was recorded; the gateway forgets it
        out.seconds = time.monotonic() - t0
    if out.status == "error" and len(session.calls) >= session.max_turns:
        out.status = "truncated"  # the turn limit ended it (the agent failed on the refused call)
    out.segments = list(session.segments)
    out.num_calls = len(session.calls)
    out.num_rewritten = session.num_rewritten
    if out.error is None and score is not None:
        try:
            out.reward = float(await _maybe_await(score(out.answer, task)))
        except Exception as e:  # noqa: BLE001  (a failing score is reported, the rollout kept)
            out.reward_error = _describe(e)
    return out


async def run_agents(gateway: Any, agent: Callable[..., Any], tasks: Sequence[Any], *, base_url: str,
                     concurrency: int = 8, group_size: int = 1, **kwargs: Any) -> list[AgentRollout]:
    """:func:`run_agent` on every task (``group_size`` rollouts each, one group id per task), at most
    ``concurrency`` at once; results in task order (a task's group together).

    Raises:
        ConfigError: ``concurrency`` or ``group_size`` < 1.
    """
    from ..limits import check_int

    concurrency, group_size = check_int("concurrency", concurrency), check_int("group_size", group_size)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Any, group: str) -> AgentRollout:
        async with gate:
            return await run_agent(gateway, agent, task, base_url=base_url, group_id=group, **kwargs)

    jobs = []
    for task in tasks:
        group = uuid.uuid4().hex[:12]
        jobs += [one(task, group) for _ in range(group_size)]
    return list(await asyncio.gather(*jobs))
