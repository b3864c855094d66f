"""An environment from a task: :class:`ToolEnv` and :func:`make_tool_env`.

A task is rows (a prompt and reference fields), tools (:func:`~agentfly_gym.tools.tool`), a reward function and a
system prompt.  An episode is one conversation: the observation of the reset is the row's prompt; each action is the
model's whole reply.  A reply with tool calls (in the model family's native format, :mod:`.formats`) runs them,
concurrently, and the observation is their results (the ``role: "tool"`` messages in ``info["tool_messages"]``, in
call order; the observation text joins their contents).  The episode ends when

* the model answers without a tool call (terminated; reward = the reward function on that reply),
* it calls a finishing tool (``@tool(finish=True)``; terminated; the completion is what that tool returned), or
* the ``max_turns``-th reply is still a tool call (truncated; the reward function still scores the reply).

Faults: a malformed call, an unknown tool, bad arguments, a tool that raises or exceeds its timeout (an async tool
that blocks the event loop past it included, see :mod:`.stalls`) are all observations (an error message in the tool
message) and the episode goes on.  A reply longer than ``max_action_length`` (65,536 characters) is cut there: the
observation says so (a call it cut off is reported as cut, not as malformed) and ``info["reply_cut"]`` holds how many
characters were dropped.  A reward function that raises or returns no finite number ends the episode with reward 0,
truncated, ``info["error"]`` and ``info["reward_error"]`` set and ``info["score"]`` None (no score, not a score of 0),
so the trajectory is recorded as an error (``status="error"``, ``reward_error`` set), never as a scored 0.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import gymnasium

from ..envs.base import AgentFlyEnv, StepResult, fault_message
from ..envs.prompting import AgentPrompt
from ..errors import ConfigError, ResetNeeded, ResourceError
from ..limits import check_int
from ..resources.scope import RolloutScope
from ..utils.suggest import name_unknown
from .formats import FORMATS, ToolCall, ToolCallError, format_tool_call, parse_tool_calls
from .stalls import ToolBlockedLoop
from .tasks import check_fields, load_tasks
from .tool import Tool, check_tools
from .threads import run_in_daemon_thread

__all__ = ["ToolEnv", "ToolPrompt", "make_tool_env", "tool_call_id", "DEFAULT_SYSTEM_PROMPT"]

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = ("You are a helpful assistant. Use the tools when they help; when you know the answer, reply "
                         "with it without calling a tool.")


class ToolPrompt(AgentPrompt):
    """The prompt of a :class:`ToolEnv`: the action is the whole reply (the env parses its tool calls), and a step's
    observation goes back as the ``role: "tool"`` messages of ``info["tool_messages"]``."""

    def parse_action(self, text: str) -> str:
        return text

    def turn_messages(self, observation: str, info: dict | None = None) -> list[dict]:
        msgs = (info or {}).get("tool_messages")
        if msgs:
            return [dict(m) for m in msgs]
        return super().turn_messages(observation, info)


def _jsonable(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def tool_call_id(turn: int, index: int) -> str:
    """A deterministic 9-character alphanumeric call id (Mistral's templates require exactly that shape)."""
    return f"{turn % 100000:05d}{index % 10000:04d}"


class ToolEnv(AgentFlyEnv):
    """A tool-calling task as an :class:`~agentfly_gym.envs.base.AgentFlyEnv` (see the module docstring).

    Args:
        tasks: the task rows (see :func:`~agentfly_gym.tools.tasks.load_tasks`).
        tools: :class:`~agentfly_gym.tools.Tool` objects (plain functions are decorated with ``@tool``).
        reward: ``reward(completion=<final assistant message>, **row) -> float`` (sync or async); it may name a
            ``messages`` parameter (the whole conversation) and declare resources with
            :func:`agentfly_gym.rewards.resourced` (e.g. an LLM judge, ``scope="global"``).
        system_prompt: the system message (None: :data:`DEFAULT_SYSTEM_PROMPT`).
        max_turns: replies after which the episode is truncated (the reward still scores the last one).
        tool_format: how replies are parsed, one of :data:`~agentfly_gym.tools.formats.FORMATS` (``"auto"``: by
            the markers the reply holds).
        prompt_key, id_key: the row fields holding the prompt and the task id.
        expert: optional ``expert(row, messages) -> str``, the next reply of a scripted expert
            (:meth:`expert_action`, the ``expert`` policy).
        env_name: the name in logs and episode ids.
        max_result_chars: characters of one tool result the model sees; a longer one is cut and says so.
        manager, step_timeout, reset_timeout, max_episode_steps, render_mode: as in :class:`AgentFlyEnv`.

    Reset options: ``task_id`` (a row's id), ``index`` (a row's position); else a row drawn with ``np_random``.

    Info keys (besides the base's): on reset ``tools`` (the tool names); on a step ``tool_calls`` (the parsed
    calls, as dicts), ``tool_messages`` (the results, as ``role: "tool"`` messages with ``name``, ``tool_call_id``
    and ``content``), ``tool_errors`` (how many calls failed), ``turn``, ``reply_cut`` (characters dropped from a
    reply over ``max_action_length``; 0 when none were); when a reward function fails, ``reward_error`` (the same
    text as ``error``) and ``score`` None.
    """

    reset_options = MappingProxyType({"task_id": "the id of a task row (its id field)",
                                      "index": "the position of a task row (0-based)"})

    def __init__(self, *, tasks: Any, tools: Sequence[Tool | Callable[..., Any]], reward: Callable[..., Any],
                 system_prompt: str | None = None, max_turns: int = 10, tool_format: str = "auto",
                 prompt_key: str = "prompt", id_key: str = "id",
                 expert: Callable[[dict[str, Any], list[dict[str, Any]]], str] | None = None,
                 env_name: str = "ToolEnv", max_result_chars: int = 16384, step_timeout: float | None = 300.0,
                 **kwargs: Any) -> None:
        _check_kwargs(kwargs)
        super().__init__(step_timeout=step_timeout, **kwargs)
        if tool_format not in FORMATS:
            raise ConfigError(f"tool_format={tool_format!r} is not one of {FORMATS}")
        check_int("max_turns", max_turns)
        self.reward_fn = _check_reward(reward)
        needs = reward_fields(self.reward_fn)
        if _is_loaded(tasks, prompt_key):
            check_fields(tasks, needs)
            self.tasks = tasks
        else:
            self.tasks = load_tasks(tasks, prompt_key=prompt_key, id_key=id_key, required=needs)
        self.tools = {t.name: t for t in check_tools(tools)}
        self.max_turns = max_turns
        self.tool_format = tool_format
        self.prompt_key, self.id_key = prompt_key, id_key
        self.expert = expert
        self.env_name = env_name
        check_int("max_result_chars", max_result_chars)
        self.max_result_chars = max_result_chars
        self.agent_prompt = ToolPrompt(system=DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt,
                                       tools=tuple(t.schema for t in self.tools.values()))
        self._ids = {str(r.get(id_key, i)): i for i, r in enumerate(self.tasks)}
        self._row: dict[str, Any] = {}
        self._messages: list[dict[str, Any]] = []
        self._turn = 0
        self._reply_length = 0
        self._global_held: set[str] = set()

    async def atask_ids(self, split: str | None = None) -> list[str]:
        """The ids of the task rows, in row order.  The rows are the split: give train and test as two task
        files (two envs).

        Raises:
            ConfigError: a ``split`` other than None.
        """
        if split is not None:
            raise ConfigError(f"{self.env_name} has no split={split!r}: its tasks are the rows it was given; "
                              "make one env per split from separate task files")
        return list(self._ids)

    # ------------------------------------------------------------------ episode
    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "task_id" in options and "index" in options:
            raise ConfigError(f"{self.env_name}: give task_id or index, not both")
        if "task_id" in options:
            tid = str(options["task_id"])
            if tid not in self._ids:
                some = list(self._ids)[:5]
                raise ConfigError(f"{self.env_name}: task_id={tid!r} is no task's id (e.g. {some}, "
                                  f"{len(self._ids)} in all)")
            index = self._ids[tid]
        elif "index" in options:
            index = options["index"]
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.tasks):
                raise ConfigError(f"{self.env_name}: index={index!r} must be an integer in [0, {len(self.tasks)})")
        else:
            index = int(self.np_random.integers(len(self.tasks)))
        self._row = self.tasks[index]
        self._task_id = str(self._row.get(self.id_key, index))
        prompt = self._row[self.prompt_key]
        self._messages = [{"role": "system", "content": self.agent_prompt.system}, {"role": "user", "content": prompt}]
        self._turn = 0
        return prompt, {"tools": list(self.tools)}

    async def astep(self, action: str) -> StepResult:
        """As :meth:`AgentFlyEnv.astep <agentfly_gym.envs.base.AgentFlyEnv.astep>`; a reply over
        ``max_action_length`` characters is cut there, and the observation and ``info["reply_cut"]`` say so."""
        self._reply_length = len(action) if isinstance(action, str) else 0  # the base cuts it before _step_episode
        return await super().astep(action)

    async def _step_episode(self, action: str) -> StepResult:
        self._turn += 1
        self._messages.append({"role": "assistant", "content": action})
        last = self._turn >= self.max_turns
        cut = max(0, self._reply_length - self.max_action_length)
        self._reply_length = 0
        said = (f"your reply was cut at {self.max_action_length:,} characters (it had {cut + self.max_action_length:,}; "
                f"the rest was dropped)") if cut else ""
        try:
            calls = parse_tool_calls(action, self.tool_format)
        except ToolCallError as e:
            why = f"{said}, so its tool call could not be read whole" if cut else "your tool call could not be parsed"
            msg = {"role": "tool", "name": "", "tool_call_id": tool_call_id(self._turn, 0), "content": f"Error: {why}: {e}"}
            return await self._observe([], [msg], 1, action, last, cut)
        if not calls:
            return await self._end(action, terminated=True, info={"turn": self._turn, "tool_calls": [], "reply_cut": cut})
        results = await asyncio.gather(*(self._run_call(c) for c in calls))
        messages = []
        for k, (call, (content, _, _)) in enumerate(zip(calls, results)):
            messages.append({"role": "tool", "name": call.name, "tool_call_id": call.id or tool_call_id(self._turn, k),
                             "content": content})
        if cut:  # the calls before the cut ran; the model still learns that the rest of its reply was lost
            messages[0]["content"] = f"Note: {said}.\n{messages[0]['content']}"
        errors = sum(1 for _, ok, _ in results if not ok)
        finished = [(c, value) for c, (_, ok, value) in zip(calls, results) if ok and self.tools[c.name].finish]
        if finished:
            self._messages.extend(messages)
            value = finished[0][1]
            completion = action if value is None else _jsonable(value)
            return await self._end(completion, terminated=True,
                                   info=self._step_info(calls, messages, errors, cut), observation=_join(messages))
        return await self._observe(calls, messages, errors, action, last, cut)

    async def _observe(self, calls: list[ToolCall], messages: list[dict[str, Any]], errors: int, action: str,
                       last: bool, cut: int) -> StepResult:
        self._messages.extend(messages)
        info = self._step_info(calls, messages, errors, cut)
        if last:  # max_turns replies: the episode is cut, the reward still scores the last reply
            return await self._end(action, terminated=False, info=info, observation=_join(messages))
        return _join(messages), 0.0, False, False, info

    def _step_info(self, calls: list[ToolCall], messages: list[dict[str, Any]], errors: int, cut: int
                   ) -> dict[str, Any]:
        return {"turn": self._turn, "tool_calls": [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls],
                "tool_messages": messages, "tool_errors": errors, "reply_cut": cut}

    async def _run_call(self, call: ToolCall) -> tuple[str, bool, Any]:
        """``(content for the model, ok, returned value)`` of one call; every fault is a message, never raised
        (except a resource fault, which ends the episode through the base class)."""
        t = self.tools.get(call.name)
        if t is None:
            return f"Error: there is no tool named {call.name!r}; the tools are {sorted(self.tools)}", False, None
        problem = t.check_arguments(call.arguments)
        if problem:
            return f"Error: {problem}", False, None
        try:
            async with asyncio.timeout(t.timeout) as deadline:
                resources = await self._resources(t)
                value = await t(call.arguments, resources, deadline=deadline.when())
        except ToolBlockedLoop as e:  # an async tool that blocked the loop past its timeout: its late result is dropped
            return f"Error: {e}", False, None
        except TimeoutError:
            return f"Error: the tool {t.name!r} did not finish within its timeout of {t.timeout} s", False, None
        except asyncio.CancelledError:
            raise
        except ResourceError:
            raise  # a dead or stuck backing resource: the base class truncates the episode and discards it
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001  (back to the model; sys.exit too)
            log.debug("%s: tool %s raised", self.env_name, t.name, exc_info=True)
            return f"Error: the tool {t.name!r} raised {fault_message(e)}", False, None
        try:
            content = _jsonable(value)
        except Exception as e:  # noqa: BLE001  (a result that cannot be shown: too deep, a failing __str__)
            return f"Error: the result of the tool {t.name!r} could not be shown: {fault_message(e)}", False, None
        if len(content) > self.max_result_chars:
            content = content[: self.max_result_chars] + f"\n[... cut: {len(content):,} characters in all]"
        return content, True, value

    async def _resources(self, t: Tool) -> dict[str, Any]:
        if not t.resources:
            return {}
        if t.scope == "global":
            out = {}
            for name, spec in t.resources.items():
                out[name] = await self.manager.acquire_global(spec, user=self)
                self._global_held.add(spec.key)
            return out
        scope = self.scope
        return {name: await scope.acquire(spec) for name, spec in t.resources.items()}

    async def _end(self, completion: str, *, terminated: bool, info: dict[str, Any], observation: str = "") -> StepResult:
        try:
            reward = await self._score(completion)
        except asyncio.CancelledError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001  (the trajectory's error, not a 0)
            message = f"the reward function failed: {fault_message(e)}"
            log.warning("%s episode %s: %s", self.env_name, self.episode_id, message)
            # no score (None, not 0.0): the trajectory records reward_error, and its status is "error"
            return (f"Error: {message}. The episode has ended.", 0.0, False, True,
                    {**info, "error": message, "reward_error": message, "score": None, "won": False,
                     "completion": completion})
        info = {**info, "score": reward, "won": reward > 0, "completion": completion}
        return observation, reward, terminated, not terminated, info

    async def _score(self, completion: str) -> float:
        fn = self.reward_fn
        kwargs = {**self._row, "completion": completion}
        target = inspect.unwrap(fn)
        params = inspect.signature(target).parameters
        resource_names = set(getattr(fn, "resource_specs", {}) or {})
        if "messages" in params:
            kwargs["messages"] = [dict(m) for m in self._messages]
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        kwargs = {k: v for k, v in kwargs.items() if k not in resource_names}
        if resource_names:  # agentfly_gym.rewards.resourced: the manager supplies its resources
            value = await fn(manager=self.manager, scope=self.scope, **kwargs)
        elif inspect.iscoroutinefunction(target):
            value = await fn(**kwargs)
        else:
            value = await run_in_daemon_thread(fn, **kwargs)  # not the loop's executor: see tools/threads.py
            if inspect.isawaitable(value):
                value = await value
        if not isinstance(value, (int, float)) and hasattr(value, "item") and getattr(value, "shape", ()) == ():
            value = value.item()  # a numpy (or torch) scalar or 0-d array: its Python number
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise TypeError(f"the reward function returned {value!r}; it must return a finite number (a float)")
        return float(value)

    async def _end_of_episode(self) -> None:
        for key in self._global_held:
            for t in self.tools.values():
                for spec in t.resources.values():
                    if spec.key == key:
                        self.manager.leave_global(spec, self)
        self._global_held.clear()

    async def expert_action(self) -> str:
        """The ``expert`` given to the constructor, on the running episode's row and messages.

        Raises:
            NoExpert: no expert was given.
            ResetNeeded: no episode is running.
        """
        if self._scope is None:
            raise ResetNeeded(f"{self.env_name}: no episode is running; call reset() first")
        if self.expert is None:
            return await super().expert_action()
        out = self.expert(self._row, [dict(m) for m in self._messages])
        return await out if inspect.isawaitable(out) else out

    @property
    def random_actions(self) -> tuple[str, ...]:
        """Well-formed replies for the ``random`` policy: one call of each tool with placeholder arguments that
        pass its schema (the first ``enum`` value, else ``"x"``, 0, 0.0, False, [] or {} by type), written in the
        env's tool format, and a plain answer that calls no tool (ends the episode).  A tool whose schema no
        placeholder passes is left out."""
        fmt = self.tool_format if self.tool_format != "auto" else "hermes"
        out = []
        for t in self.tools.values():
            props = (t.parameters or {}).get("properties") or {}
            args = {name: _placeholder(schema) for name, schema in props.items()}
            if not t.check_arguments(args):
                out.append(format_tool_call(t.name, args, fmt))
        return (*out, "I do not know the answer.")

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The running episode's conversation so far (system, user, then assistant replies and tool messages)."""
        return [dict(m) for m in self._messages]


_PLACEHOLDERS = {"string": "x", "integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}, "null": None}


def _placeholder(schema: Any) -> Any:
    """A value of a JSON schema's type (``enum``: its first value; a list of types: the first known)."""
    if not isinstance(schema, Mapping):
        return "x"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "string")
    for k in (kind if isinstance(kind, list) else [kind]):
        if k in _PLACEHOLDERS:
            value = _PLACEHOLDERS[k]
            return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value
    return "x"


def _check_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Raise a ConfigError naming an argument that neither :class:`ToolEnv` nor :class:`AgentFlyEnv` takes (with
    the close match: ``max_turn`` -> ``max_turns``), not the constructor's bare TypeError."""
    base = set(inspect.signature(AgentFlyEnv.__init__).parameters) - {"self"}
    unknown = [k for k in kwargs if k not in base]
    if not unknown:
        return
    known = sorted(base | {name for name, p in inspect.signature(ToolEnv.__init__).parameters.items()
                           if name != "self" and p.kind is p.KEYWORD_ONLY})
    said, s = name_unknown(unknown, known)
    raise ConfigError(f"unknown tool environment argument{s} {said}; the arguments are {known}")


def _join(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m["content"]) for m in messages)


def _is_loaded(tasks: Any, prompt_key: str) -> bool:
    return isinstance(tasks, list) and bool(tasks) and all(isinstance(r, dict) and isinstance(r.get(prompt_key), str)
                                                            for r in tasks)


def _check_reward(reward: Any) -> Callable[..., Any]:
    if not callable(reward):
        raise ConfigError(f"reward must be a function reward(completion, **row) -> float, got {type(reward).__name__}")
    try:
        params = inspect.signature(inspect.unwrap(reward)).parameters
    except (TypeError, ValueError) as e:
        raise ConfigError(f"reward {reward!r}: cannot read its signature: {e}") from None
    if "completion" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ConfigError(f"reward {getattr(reward, '__name__', reward)!r} must take a 'completion' argument (the final "
                          f"assistant message), e.g. def reward(completion: str, answer: str, **row) -> float; it "
                          f"takes {list(params)}")
    return reward


def reward_fields(reward: Callable[..., Any]) -> list[str]:
    """The row fields ``reward`` cannot do without: its arguments that have no default, less those the environment
    supplies (``completion``, ``messages``) and the resources a ``@resourced`` reward gets from the manager.

    ``def exact(completion, answer, **row)`` -> ``["answer"]``; a reward that reads fields only through ``**row``
    declares none (nothing to check).
    """
    params = inspect.signature(inspect.unwrap(reward)).parameters
    supplied = {"completion", "messages", "manager", "scope", *(getattr(reward, "resource_specs", None) or {})}
    return [n for n, p in params.items() if n not in supplied and p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _make_vector(factory: Callable[..., ToolEnv], num_envs: int = 1, *, autoreset_mode: Any = None,
                 manager: Any = None, max_episode_steps: int | None = None, **env_kwargs: Any):
    from ..vector import AsyncTextVectorEnv, AutoresetMode

    check_int("num_envs", num_envs)
    if max_episode_steps is not None:
        env_kwargs["max_episode_steps"] = max_episode_steps
    return AsyncTextVectorEnv([lambda: factory(manager=manager, **env_kwargs) for _ in range(num_envs)],
                              autoreset_mode=autoreset_mode or AutoresetMode.NEXT_STEP)


def _definition(value: Any, _path: frozenset[int] = frozenset(), _captured: bool = False) -> Any:
    """A comparable stand-in for ``value`` (a :class:`ToolEnv` argument) that two imports of one module agree on:
    a function by where its code is (file, line, qualified name) and by what it captures (its closure cells, default
    arguments and, for a bound method, its object), not by its identity; plain data by value; any other object by
    identity, except one that a function captures, which counts by its type (a ``make_env`` that builds a fresh API
    client for its reward each call stays one definition; captured numbers or strings that differ do not)."""
    if isinstance(value, Tool):
        return ("tool", value.name, _definition(dict(value.schema)), _definition(value.fn, _path),
                tuple(sorted((k, repr(v)) for k, v in value.resources.items())), value.scope, value.timeout, value.finish)
    if isinstance(value, functools.partial):
        return ("partial", _definition(value.func, _path), _definition(list(value.args), _path),
                _definition(dict(value.keywords), _path))
    if isinstance(value, (str, int, bool, type(None))):
        return value
    if isinstance(value, float):
        return ("float", repr(value))  # NaN equals itself here
    if isinstance(value, (bytes, bytearray)):
        return ("bytes", bytes(value))
    if callable(getattr(value, "tobytes", None)) and hasattr(value, "dtype"):  # an array (numpy and the like)
        return ("array", str(value.dtype), tuple(getattr(value, "shape", ())), value.tobytes())
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        if id(value) in _path:  # a container that holds itself
            return ("cycle",)
        inner = _path | {id(value)}
        if isinstance(value, Mapping):
            return ("dict", tuple((str(k), _definition(v, inner, _captured))
                                  for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
        if isinstance(value, (set, frozenset)):
            return ("set", tuple(sorted((_definition(v, inner, _captured) for v in value), key=repr)))
        return ("list", tuple(_definition(v, inner, _captured) for v in value))
    fn = inspect.unwrap(value) if callable(value) else value
    owner = getattr(fn, "__self__", None) if inspect.ismethod(fn) else None
    fn = getattr(fn, "__func__", fn)  # a bound method: its function (and its object, below)
    code = getattr(fn, "__code__", None)
    if code is None:
        return ("object", type(value).__module__, type(value).__qualname__) if _captured else ("object", id(value))
    where = ("code", code.co_filename, code.co_firstlineno, getattr(fn, "__qualname__", ""))
    if id(fn) in _path:  # a function that captures itself (a recursive inner function): its place says enough
        return where
    inner = _path | {id(fn)}
    cells = []
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            cells.append((name, _definition(cell.cell_contents, inner, True)))
        except ValueError:  # a cell not yet filled
            cells.append((name, ("empty",)))
    return (*where, tuple(cells), _definition(list(getattr(fn, "__defaults__", None) or ()), inner, True),
            _definition(dict(getattr(fn, "__kwdefaults__", None) or {}), inner, True),
            None if owner is None else _definition(owner, inner, True))


def make_tool_env(env_id: str, *, tasks: Any, tools: Sequence[Tool | Callable[..., Any]], reward: Callable[..., Any],
                  system_prompt: str | None = None, max_turns: int = 10, replace: bool = False,
                  **env_kwargs: Any) -> str:
    """Register a Gymnasium environment of a tool-calling task and return its id.

    The environment (a :class:`ToolEnv`) works with ``gymnasium.make(env_id)``, ``gymnasium.make_vec(env_id,
    num_envs=...)``, the rollout runner, ``agentfly-gym rollout --env module:function`` and the verl plugin.
    Everything is checked here, so a bad task, tool or reward fails at this call.

    An id already registered is refused unless ``replace=True``, with one exception: the same definition again
    (the same tasks and options, tools and reward defined by the same code, e.g. a module imported twice, once as
    ``__main__`` and once by name, or a ``make_env`` called twice) registers it again quietly.  Functions made by one
    factory are the same definition only when what they capture (closure cells, defaults) is equal plain data (an
    object that is not plain data counts by its type, e.g. a fresh API client): two closures over different values
    are two environments.

    Args:
        env_id: the Gymnasium id, ``"namespace/Name-vN"`` (e.g. ``"my/Add-v0"``).
        tasks: a list of dicts, a ``.jsonl``/``.json``/``.parquet`` path, or a ``datasets.Dataset``; each row holds
            ``"prompt"`` (the first user message) and any reference fields the reward reads (e.g. ``"answer"``).
        tools: the tools (:func:`~agentfly_gym.tools.tool`; plain typed functions are decorated).
        reward: ``reward(completion, **row) -> float`` (see :class:`ToolEnv`).
        system_prompt: the system message.
        max_turns: replies per episode.
        replace: replace a different environment already registered under ``env_id`` (e.g. after editing a
            tool in a notebook).
        env_kwargs: further :class:`ToolEnv` arguments (``tool_format``, ``prompt_key``, ``expert``,
            ``step_timeout``, ...), defaults of every env made from the id (``gymnasium.make(env_id, **kw)``
            overrides them).

    Returns:
        ``env_id``.

    Raises:
        ConfigError: a bad id, task rows (among them a row without a field the reward reads: an argument of
            ``reward`` without a default), tool (no type hints or docstring, two with one name) or reward; an id
            already registered to another environment (without ``replace=True``).
    """
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError(f"env_id must be a non-empty str such as 'my/Task-v0', got {env_id!r}")
    prompt_key, id_key = env_kwargs.get("prompt_key", "prompt"), env_kwargs.get("id_key", "id")
    reward = _check_reward(reward)
    config = dict(tasks=load_tasks(tasks, prompt_key=prompt_key, id_key=id_key, required=reward_fields(reward)),
                  tools=check_tools(tools), reward=reward, system_prompt=system_prompt, max_turns=max_turns,
                  env_name=env_kwargs.pop("env_name", env_id.rsplit("/", 1)[-1]), **env_kwargs)
    ToolEnv(**config)  # every argument checked now, not at the first make
    factory = functools.partial(ToolEnv, **config)
    old = gymnasium.registry.get(env_id)
    if old is not None and not replace:
        entry = old.entry_point
        same = (isinstance(entry, functools.partial) and entry.func is ToolEnv
                and _definition(entry.keywords) == _definition(config))
        if not same:
            what = ("another tool environment (other tasks, tools, reward or options, or other values its "
                    "functions capture)"
                    if isinstance(entry, functools.partial) and entry.func is ToolEnv else f"{entry!r}")
            raise ConfigError(f"env_id={env_id!r} is already registered, to {what}; choose another id, or pass "
                              "replace=True to make_tool_env to replace it")
    try:
        if env_id in gymnasium.registry:
            del gymnasium.registry[env_id]
        gymnasium.register(id=env_id, entry_point=factory, vector_entry_point=functools.partial(_make_vector, factory),
                           disable_env_checker=True, order_enforce=True)
    except gymnasium.error.Error as e:
        raise ConfigError(f"env_id={env_id!r} cannot be registered: {e}") from None
    return env_id
