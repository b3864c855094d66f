"""The exception hierarchy of agentfly-gym.

Every error the library raises on purpose derives from :class:`AgentFlyError`, so a
caller can catch one base class.  Names say what went wrong for the user, in the
manner of httpx's hierarchy.
"""

from __future__ import annotations


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
    """A resource could not be started, reset, checked or released."""


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


class ResetNeeded(EnvError):
    """``step`` was called before ``reset`` or after the episode ended."""


class NoExpert(EnvError, NotImplementedError):
    """The environment has no expert (``expert_action``); use a model or another baseline policy."""


class TokenizationError(AgentFlyError):
    """Incremental chat-template tokenization found a template it cannot extend safely."""


class PolicyError(AgentFlyError):
    """A policy cannot serve a request (e.g. a server that returns no token ids)."""


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
