"""Tools from typed Python functions: :func:`tool` and :class:`Tool`.

A tool is a plain function (sync or async) with type hints and a Google-style docstring::

    @tool
    def add(a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: the first number
            b: the second number
        '''
        return a + b

Its name, description and the JSON schema of its arguments, in the OpenAI function format that chat templates
read (``{"type": "function", "function": {"name", "description", "parameters"}}``), are built by transformers'
:func:`transformers.utils.get_json_schema` from the signature and the docstring.

A tool declares the resources it needs and receives them live; it holds no acquisition or release code::

    @tool(resources={"box": ContainerSpec(image="host", max_instances=24)})
    async def python(code: str, box) -> str:
        '''Run Python code and return what it printed.

        Args:
            code: the program
        '''
        return (await box.exec(["python3", "-c", code])).output

``box`` is left out of the schema; the environment acquires the spec under the episode's rollout scope (the same
container on every turn of the rollout, released when the episode ends) or, with ``scope="global"``, once for
everyone (:meth:`~agentfly_gym.resources.ResourceManager.acquire_global`).

What a timeout can stop: a sync tool runs on a daemon thread of its own (:mod:`.threads`); at its timeout the model
gets an error and the call is abandoned (the thread runs on until the function returns; its result is dropped).  An
async tool runs on the event loop, and its timeout stops it at an ``await`` only: one that blocks the loop
(``time.sleep`` or a blocking client inside ``async def``) stalls every rollout on that loop until it returns, and
no timeout can stop it.  Such a call is detected and reported (:mod:`.stalls`): a WARNING while it holds the loop
past its timeout, then a timeout error to the model with its late result dropped.  Write blocking code as a plain
``def``, or ``await asyncio.to_thread(...)`` its blocking part.

Arguments are checked against the schema (:meth:`Tool.check_arguments`).  JSON has one number type, and JSON Schema
counts ``2.0`` as an integer, so an ``int`` argument written ``2.0`` is accepted and the function gets ``2``
(:meth:`Tool.coerce_arguments`, as pydantic's lax mode behind MCP's and OpenAI's Python tool servers does);
``2.5`` (or ``true``) for an ``int`` is refused with an error message to the model.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError
from ..resources.spec import ResourceSpec
from ..utils.suggest import name_unknown
from .stalls import StallWatch, watch_loop_stalls
from .threads import run_in_daemon_thread

__all__ = ["Tool", "tool", "check_tools", "DEFAULT_TOOL_TIMEOUT"]

#: Seconds a tool call may take by default; past it the model gets an error message instead of a result.
DEFAULT_TOOL_TIMEOUT = 60.0

_SCOPES = ("rollout", "global")


@dataclasses.dataclass(frozen=True, eq=False)
class Tool:
    """A function the model can call, with its JSON schema and the resources it needs.

    Build one with :func:`tool`.

    Attributes:
        fn: the function (sync or async); called with the model's arguments and the live resources as keywords.
        name: the name the model calls it by (the function's name unless given).
        description: the docstring's description.
        schema: the OpenAI function schema ``{"type": "function", "function": {"name", "description",
            "parameters"}}`` (what ``tokenizer.apply_chat_template(..., tools=[...])`` takes).
        resources: keyword name -> resource spec; each arrives live as that keyword argument.
        scope: ``"rollout"`` (acquired in the episode's rollout scope: the same instance every turn, released
            when the episode ends) or ``"global"`` (one shared instance, ``acquire_global``).
        timeout: seconds one call may take (None: no limit); past it the model gets an error message.
            A sync function runs on a daemon thread of its own, which a timeout cannot stop: the call is
            abandoned.  An async function is stopped at an ``await``; one that blocks the event loop cannot be
            stopped (it is reported, and its late result dropped: see the module docstring).
        finish: calling this tool ends the episode (the reward is computed then).
    """

    fn: Callable[..., Any]
    name: str
    description: str
    schema: Mapping[str, Any]
    resources: Mapping[str, ResourceSpec] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    scope: str = "rollout"
    timeout: float | None = DEFAULT_TOOL_TIMEOUT
    finish: bool = False
    _stalls: StallWatch = dataclasses.field(default_factory=StallWatch, init=False, repr=False)  # see tools/stalls.py

    def __deepcopy__(self, memo: dict) -> Tool:  # immutable: Gymnasium deep-copies env specs (make_vec)
        return self

    def __copy__(self) -> Tool:
        return self

    @property
    def parameters(self) -> Mapping[str, Any]:
        """The JSON schema of the arguments (``schema["function"]["parameters"]``)."""
        return self.schema["function"]["parameters"]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def check_arguments(self, arguments: Any) -> str | None:
        """What is wrong with ``arguments`` for this tool (a message for the model), or None when they fit.

        Checks that they are a JSON object, that no argument is unknown (or names a resource), that every
        required one is there, and their types against the schema (``jsonschema``; as JSON Schema has it,
        ``2.0`` is an integer and ``2.5`` is not: :meth:`coerce_arguments` makes the former ``2``).
        """
        if not isinstance(arguments, dict):
            return f"the arguments of {self.name!r} must be a JSON object, got {type(arguments).__name__}"
        params = self.parameters
        props = params.get("properties", {})
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            return f"{self.name!r} takes no argument(s) {unknown}; its arguments are {sorted(props)}"
        missing = [k for k in params.get("required", []) if k not in arguments]
        if missing:
            return f"{self.name!r} is missing required argument(s) {missing}"
        validator = self._arguments_validator
        if validator is None:
            return None
        import jsonschema

        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        except RecursionError:
            return f"the arguments of {self.name!r} are nested too deeply"
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or "arguments"
            return f"bad argument {where!r} for {self.name!r}: {error.message}"
        return None

    @functools.cached_property
    def _arguments_validator(self) -> Any:
        """The ``jsonschema`` validator of :attr:`parameters`, built and its schema checked once (what
        ``jsonschema.validate`` does on every call: 4-5 ms each on a loaded 2-core machine, on the event loop);
        None where jsonschema is missing or rejects a schema transformers wrote (the call is not blocked)."""
        try:
            import jsonschema
        except ImportError:  # not a hard dependency: the checks above still run
            return None
        params = dict(self.parameters)
        cls = jsonschema.validators.validator_for(params)
        try:
            cls.check_schema(params)
        except jsonschema.SchemaError:
            return None
        return cls(params)

    def coerce_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """``arguments`` (already checked) with every integral float where the schema wants an integer (and not
        a number) made an ``int``: ``{"a": 2.0}`` -> ``{"a": 2}`` for ``a: int``, also inside lists, tuples,
        dicts and optional or union types.  JSON Schema counts ``2.0`` as an integer; the function should get
        the ``int`` its type hint names (pydantic's lax mode, which MCP's and OpenAI's Python tool servers use,
        does the same)."""
        props = self.parameters.get("properties", {})
        return {k: _coerce_integers(v, props.get(k)) for k, v in arguments.items()}

    async def __call__(self, arguments: Mapping[str, Any], resources: Mapping[str, Any] | None = None, *,
                       deadline: float | None = None) -> Any:
        """Call the tool with ``arguments`` (already checked; :meth:`coerce_arguments` is applied) and the live
        ``resources``.  No timeout here (the caller's ``asyncio.timeout``); ``deadline`` (the loop's clock, e.g.
        that timeout's ``when()``) lets an async tool that blocks the event loop past it be reported and its late
        result dropped (:class:`~agentfly_gym.tools.stalls.ToolBlockedLoop`)."""
        kwargs = {**self.coerce_arguments(arguments), **(resources or {})}
        if self.is_async:
            return await watch_loop_stalls(self.fn(**kwargs), name=self.name, timeout=self.timeout, deadline=deadline,
                                           stalls=self._stalls)
        return await run_in_daemon_thread(self.fn, **kwargs)  # not the loop's executor: see tools/threads.py


def _coerce_integers(value: Any, schema: Any) -> Any:
    """``value`` with each integral float made an int where ``schema`` (an argument's JSON schema) wants an integer
    and not a number; follows ``items``/``prefixItems``, ``properties``/``additionalProperties``, ``anyOf``/``oneOf``."""
    if not isinstance(schema, Mapping):
        return value
    branches = [schema] + [b for key in ("anyOf", "oneOf", "allOf") for b in (schema.get(key) or ())
                           if isinstance(b, Mapping)]
    types: set[str] = set()
    for b in branches:
        t = b.get("type")
        types.update([t] if isinstance(t, str) else [x for x in (t or ()) if isinstance(x, str)])
    if isinstance(value, float):
        return int(value) if "integer" in types and "number" not in types and value.is_integer() else value
    if isinstance(value, list):
        for b in branches:
            if "items" in b or "prefixItems" in b:
                prefix = b.get("prefixItems") or []
                return [_coerce_integers(v, prefix[i] if i < len(prefix) else b.get("items")) for i, v in enumerate(value)]
        return value
    if isinstance(value, dict):
        for b in branches:
            props, extra = b.get("properties") or {}, b.get("additionalProperties")
            if props or isinstance(extra, Mapping):
                return {k: _coerce_integers(v, props.get(k, extra)) for k, v in value.items()}
        return value
    return value


def _schema(fn: Callable[..., Any], name: str, description: str | None, hidden: set[str]) -> dict[str, Any]:
    """The OpenAI function schema of ``fn`` without the ``hidden`` (resource) parameters, by transformers'
    ``get_json_schema``."""
    from transformers.utils.chat_template_utils import (DocstringParsingException, TypeHintParsingException,
                                                        get_json_schema)

    fname = getattr(fn, "__name__", repr(fn))
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"tool {fname!r}: cannot read its signature: {e}") from None
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"tool {fname!r}: *args/**kwargs ({p.name}) cannot be described to a model; "
                              "name every argument with a type hint")
    unknown = sorted(hidden - set(sig.parameters))
    if unknown:
        raise ConfigError(f"tool {fname!r}: resources {unknown} are not parameters of the function; add a keyword "
                          f"parameter of that name to receive each (parameters: {list(sig.parameters)})")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # noqa: BLE001  (a hint that does not resolve)
        raise ConfigError(f"tool {fname!r}: its type hints do not resolve: {type(e).__name__}: {e}") from None
    shown = [p for n, p in sig.parameters.items() if n not in hidden]
    missing = [p.name for p in shown if p.name not in hints]
    if missing:
        raise ConfigError(f"tool {fname!r}: argument(s) {missing} have no type hint; give each argument one "
                          f"(e.g. 'def {fname}({missing[0]}: str, ...)') so that its JSON schema can be built")
    doc = inspect.getdoc(fn)
    if not doc and description is None:
        raise ConfigError(f"tool {fname!r} has no docstring; write one (Google style) with a description and an "
                          f"'Args:' section describing {[p.name for p in shown]}")

    def stand_in() -> None:  # what get_json_schema reads: the shown parameters, their hints and the docstring
        pass

    stand_in.__name__ = name
    stand_in.__qualname__ = name
    stand_in.__doc__ = doc or description
    stand_in.__signature__ = sig.replace(parameters=shown, return_annotation=inspect.Signature.empty)  # type: ignore[attr-defined]
    stand_in.__annotations__ = {p.name: hints[p.name] for p in shown}
    try:
        schema = get_json_schema(stand_in)
    except DocstringParsingException as e:
        raise ConfigError(f"tool {fname!r}: {e}. Describe every argument in the docstring's 'Args:' section, one "
                          "line each: '    name: what it is'") from None
    except TypeHintParsingException as e:
        raise ConfigError(f"tool {fname!r}: {e}. Use JSON-like types (str, int, float, bool, list[...], dict[str, ...], "
                          "Literal[...], Optional[...])") from None
    if description is not None:
        schema["function"]["description"] = description
    if not schema["function"].get("description"):
        raise ConfigError(f"tool {fname!r}: its docstring has no description before 'Args:'; say what the tool does")
    return schema


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         resources: Mapping[str, ResourceSpec] | None = None, scope: str = "rollout",
         timeout: float | None = DEFAULT_TOOL_TIMEOUT, finish: bool = False, **unknown: Any) -> Any:
    """Turn a typed function (sync or async) into a :class:`Tool`; usable as ``@tool`` or ``@tool(...)``.

    Args:
        fn: the function; every argument the model passes needs a type hint and a line in the docstring's
            ``Args:`` section (Google style), as transformers' ``get_json_schema`` requires.
        name: the tool's name (default: the function's ``__name__``).
        description: overrides the docstring's description.
        resources: keyword name -> :class:`~agentfly_gym.resources.spec.ResourceSpec`; the function must have a
            keyword parameter of each name, which receives the live resource (and is left out of the schema).
        scope: ``"rollout"`` (default: one instance per episode, the same on every turn) or ``"global"``.
        timeout: seconds a call may take (default 60; None: no limit); past it the model gets an error message
            and the episode goes on.  It holds for a sync function (run on a daemon thread of its own; the call
            is abandoned, the thread runs on until the function returns) and for an async one at an ``await``.
            It cannot stop an async function that blocks the event loop (``time.sleep`` or a blocking client
            inside ``async def``): that stalls every rollout on the loop until it returns; it is logged (WARNING,
            naming the line) and its late result dropped (the model gets a timeout error).  Write such a tool as a
            plain ``def`` or ``await asyncio.to_thread(...)`` its blocking part.
        finish: a call to this tool ends the episode.

    Returns:
        A :class:`Tool` (or, without ``fn``, a decorator that makes one).

    Raises:
        ConfigError: an argument without a type hint or a docstring line, no docstring, ``*args``/``**kwargs``,
            a resource that is not a parameter, a bad scope or timeout, or an option ``tool`` does not take
            (``@tool(timout=5)``: the message names the close match, ``timeout``).
    """
    if unknown:
        _refuse_unknown_options(unknown)
    if scope not in _SCOPES:
        raise ConfigError(f"tool scope={scope!r} must be one of {_SCOPES}")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"tool timeout={timeout!r} must be None or > 0 seconds")
    specs = dict(resources or {})
    for key, spec in specs.items():
        if not isinstance(spec, ResourceSpec):
            raise ConfigError(f"tool resource {key!r} must be a ResourceSpec (e.g. ContainerSpec(...)), got "
                              f"{type(spec).__name__}")

    def make(f: Callable[..., Any]) -> Tool:
        if isinstance(f, Tool):
            raise ConfigError(f"{f.name!r} is already a tool")
        if not callable(f):
            raise ConfigError(f"@tool needs a function, got {type(f).__name__}")
        tool_name = name or getattr(f, "__name__", None)
        if not tool_name or not isinstance(tool_name, str) or tool_name == "<lambda>":
            raise ConfigError("a tool needs a name: decorate a named function or pass name=")
        schema = _schema(f, tool_name, description, set(specs))
        return Tool(fn=f, name=tool_name, description=schema["function"]["description"], schema=schema,
                    resources=MappingProxyType(specs), scope=scope, timeout=timeout, finish=finish)

    return make if fn is None else make(fn)


def _refuse_unknown_options(unknown: Mapping[str, Any]) -> None:
    """Raise a ConfigError naming each option :func:`tool` does not take, with its close match, not Python's bare
    ``TypeError: tool() got an unexpected keyword argument``."""
    known = sorted(n for n, p in inspect.signature(tool).parameters.items() if p.kind is p.KEYWORD_ONLY)
    said, s = name_unknown(unknown, known)
    raise ConfigError(f"@tool got unknown option{s} {said}; its options are {known}")


def check_tools(tools: Sequence[Tool | Callable[..., Any]]) -> list[Tool]:
    """``tools`` as a list of :class:`Tool` (plain functions are decorated with :func:`tool`).

    Raises:
        ConfigError: two tools share a name (the message names them), or a function cannot be a tool.
    """
    if isinstance(tools, (Tool, str)) or callable(tools):
        raise ConfigError("tools must be a list of tools, e.g. tools=[add]")
    out = [t if isinstance(t, Tool) else tool(t) for t in tools]
    seen: dict[str, Tool] = {}
    for t in out:
        if t.name in seen:
            raise ConfigError(f"two tools are named {t.name!r} ({getattr(seen[t.name].fn, '__qualname__', '?')} and "
                              f"{getattr(t.fn, '__qualname__', '?')}); give one another name with @tool(name=...)")
        seen[t.name] = t
    return out
