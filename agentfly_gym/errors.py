"""The exception hierarchy of agentfly-gym.

Every error the library raises on purpose derives from :class:`AgentFlyError`, so a caller can catch
one base class; where users already catch a builtin (``ValueError``, ``TimeoutError``, ...) the error
derives from that too.  Names say what went wrong for the user, in the manner of httpx's hierarchy.
Errors carry fields, so callers and tests match on them rather than on the message's prose:
``ConfigError.field`` (the offending option), ``ResourceError.spec`` (the resource's spec, where one
is known).  Message-only construction (``ConfigError("...")``) still works; every error pickles with
its fields (a process pool, a Ray task).

The tree (classes defined outside this module are named with their module)::

    AgentFlyError
    ├── ConfigError (ValueError)                       .field: the offending option
    │   ├── rollout.light_tokenizer.UnsupportedTokenizer
    │   ├── rollout.outputs.OutputExistsError
    │   │   └── rollout.outputs.UnreadableRunError
    │   ├── rollout.outputs.OutputBusyError
    │   ├── rollout.trajectory.SchemaVersionError
    │   └── resources.containers.sandbox.files.SandboxPathError (also ModelOutputError)
    ├── CallOrderError (RuntimeError)                  a method called out of its contract's order
    │   ├── ResetNeeded (also EnvError)
    │   └── vector.AlreadyPendingCallError (also gymnasium.error.AlreadyPendingCallError)
    ├── ModelOutputError                               a fault caused by the model, handled as an observation
    ├── DataNotFoundError (FileNotFoundError)
    ├── DownloadError
    │   └── ChecksumError
    ├── ResourceError                                  .spec: the resource's spec (or None)
    │   ├── ResourceStartError
    │   ├── ResourceTimeout (TimeoutError)
    │   ├── ResourceUnavailable
    │   ├── ResourceDied
    │   ├── PoolClosedError
    │   ├── resources.backends.model_api.APIError      .status: the HTTP status
    │   └── resources.containers.docker.exec_stream.EngineError   .status, .message
    ├── EventLoopMismatch (RuntimeError)
    ├── EnvError
    │   ├── ResetNeeded (also CallOrderError)
    │   ├── NoExpert (NotImplementedError)
    │   ├── envs.chess.moves.MoveError (ValueError)
    │   └── envs.alfworld.planner.ExpertPlanError
    │       └── envs.alfworld.planner.ExpertPlanTimeout (TimeoutError)
    ├── TokenizationError
    ├── PolicyError
    │   ├── rollout.policies.endpoint_policy.EndpointError   .status: the last HTTP status
    │   └── rollout.trajectory.TextOnlyTrajectory        a text-only trajectory where token ids are needed
    ├── ToolError                                      the tool layer
    │   ├── tools.formats.ToolCallError (ValueError)
    │   ├── tools.mcp.MCPToolError (RuntimeError)
    │   ├── tools.stalls.ToolBlockedLoop (TimeoutError)
    │   └── tools.threads.UserCodeExit (RuntimeError)
    ├── gateway.messages.BadRequest                    .status, .code, .param: an OpenAI-shaped API error
    ├── gateway.command.CommandFailed (RuntimeError)   an agent's command failed in its container
    ├── envs.r2egym.actions.ActionParseError (ValueError)
    ├── envs.r2egym.local_tasks.TaskBuildError
    ├── envs.scienceworld.java_fold.FoldUnavailable (RuntimeError)
    ├── images.engine.ImageBuildError
    └── rollout.outputs.OutputWriteError (OSError)

Not in the tree, on purpose: private signals that never leave their module (``_BadArchive``,
``_GradingFault``, ``_RemoteTraceback``, the ``__cause__`` that carries a child process's traceback)
and ``envs/r2egym/r2e_tools.py``'s ``ToolError``, which runs inside a task container with the standard
library only.  ``tests/test_errors.py`` checks that no other exception class is left out.
"""

from __future__ import annotations

from typing import Any


class AgentFlyError(Exception):
    """Base class of every error raised on purpose by agentfly-gym."""

    def __reduce__(self):  # keep keyword-only fields and custom constructors across pickling
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class ConfigError(AgentFlyError, ValueError):
    """A spec, option or argument has an invalid value; the message names it and what is valid.

    Attributes:
        field: the name of the offending option or argument (e.g. ``"max_turns"``), or None when the
            error is about several at once; tests and callers match on it rather than on the message.
    """

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class CallOrderError(AgentFlyError, RuntimeError):
    """A method was called out of the order its contract requires (a second ``send`` before ``recv``,
    ``step`` before ``reset``): a bug in the calling code, not a bad value."""


class ModelOutputError(AgentFlyError):
    """A fault caused by what the model did, not by the caller: e.g. a symlink, FIFO or folder it left
    where the host reads or writes a file of the episode.

    An environment turns it into a handled observation (reward 0, ``info["error"]`` set, the episode
    truncated; see :func:`agentfly_gym.envs.base.fault_step`), never an exception to the trainer.
    """


class DataNotFoundError(AgentFlyError, FileNotFoundError):
    """A data set an environment needs is missing; the message says how to obtain it."""


class DownloadError(AgentFlyError):
    """A data file could not be downloaded (offline, HTTP error, cut off); the message says what to do."""


class ChecksumError(DownloadError):
    """A downloaded or stored file does not match its pinned SHA-256; the file was refused."""


class ResourceError(AgentFlyError):
    """A resource could not be started, reset, checked or released.

    Attributes:
        spec: the :class:`~agentfly_gym.resources.spec.ResourceSpec` of the resource or pool concerned,
            or None where the raiser does not know it.
    """

    def __init__(self, message: str = "", *, spec: Any = None) -> None:
        super().__init__(message)
        self.spec = spec


class ResourceStartError(ResourceError):
    """A resource instance failed to start (or to start within its start timeout)."""


class ResourceTimeout(ResourceError, TimeoutError):
    """An acquisition waited longer than its timeout for a free instance of a saturated pool."""


class ResourceUnavailable(ResourceError):
    """A backend cannot run here (no Docker engine, no bubblewrap, no GPU, ...)."""


class ResourceDied(ResourceError):
    """A live resource stopped answering (a killed container, a crashed JVM)."""


class PoolClosedError(ResourceError):
    """The pool or manager was closed; no more acquisitions are possible."""


class EventLoopMismatch(AgentFlyError, RuntimeError):
    """An asyncio object was used from an event loop other than the one it is bound to."""


class EnvError(AgentFlyError):
    """An environment was used in a way its contract forbids (e.g. step before reset)."""


class ResetNeeded(EnvError, CallOrderError):
    """``step`` was called before ``reset`` or after the episode ended."""


class NoExpert(EnvError, NotImplementedError):
    """The environment has no expert (``expert_action``); use a model or another baseline policy."""


class TokenizationError(AgentFlyError):
    """Incremental chat-template tokenization found a template it cannot extend safely."""


class PolicyError(AgentFlyError):
    """A policy cannot serve a request (e.g. a server that returns no token ids)."""


class ToolError(AgentFlyError):
    """A tool could not be called or did not answer (a malformed call, an MCP error, a blocked loop)."""


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    """Unpickle an error: rebuild it from ``args`` (bypassing a constructor that takes other arguments),
    then restore its attributes (the keyword-only fields)."""
    try:
        err = cls(*args)
    except Exception:  # noqa: BLE001 - e.g. APIError(message, status) pickled with args=(message,): no constructor
        err = cls.__new__(cls, *args)
        err.args = args
    err.__dict__.update(state)
    return err
