"""Limits as values: the one integer rule of options and arguments, and the per-episode limits.

:func:`check_int` is the rule every integer option follows ("``NAME=VALUE`` must be an integer >= N"),
as :func:`~agentfly_gym.data.task_draw.check_seed` is for seeds: call it instead of writing the check
again.  :class:`EpisodeLimits` is what bounds one episode (turns, token caps, step-mode history); one
value is shared by :func:`~agentfly_gym.rollout.episode.play_episode`,
:class:`~agentfly_gym.rollout.runner.RolloutConfig`, :class:`~agentfly_gym.rollout.tasks.TaskRunner` and
the multi-agent runner (:class:`~agentfly_gym.rollout.multiagent.MultiAgentConfig`), in the manner of
python-chess's ``Limit`` and httpx's ``Limits``.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from .errors import ConfigError

__all__ = ["DEFAULT_HISTORY", "DEFAULT_MAX_TURNS", "EpisodeLimits", "check_int"]

#: Step mode: past (action, observation) pairs shown in each fresh prompt, unless told otherwise.
DEFAULT_HISTORY = 3
#: Policy turns of a single-agent episode, unless told otherwise.
DEFAULT_MAX_TURNS = 10


def check_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None, optional: bool = False,
              unit: str | None = None) -> Any:
    """``value`` if it is an integer in ``[minimum, maximum]`` (a NumPy integer too; a bool is not one).

    Args:
        name: the option's name, as the user wrote it (it is the error's ``field`` and starts its message).
        value: the value to check.
        minimum, maximum: the inclusive bounds (``maximum`` None: no upper bound).
        optional: None is accepted (and returned) too, meaning "no limit" or "the default".
        unit: what the integer counts (``"tokens"``, ``"plies"``, ``"MiB"``), added to the message.

    Returns:
        ``value`` as a plain ``int`` (or None when ``optional`` and None).

    Raises:
        ConfigError: with ``field=name``; the message reads e.g. ``"max_turns=0 must be an integer >= 1"``.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum or (
            maximum is not None and value > maximum):
        what = f"an integer in [{minimum}, {maximum}]" if maximum is not None else f"an integer >= {minimum}"
        raise ConfigError(f"{name}={value!r} must be {'None or ' if optional else ''}{what}"
                          f"{f' ({unit})' if unit else ''}", field=name)
    return int(value)


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """What bounds one episode; frozen and hashable, checked when built.

    Attributes:
        max_turns: most policy turns (multi-agent: per player; rejected moves count); the episode ends
            truncated after them.  An integer >= 1.
        max_context_tokens: chain mode: a hard cap on the chain (prompt + response tokens); None: none.
        max_response_tokens: chain mode: stop before a turn once the response holds at least this many
            tokens (a trainer's response budget); None: none.
        max_prompt_tokens: step mode: the most tokens of one step's prompt (older history dropped first);
            None: none.
        history: step mode: past (action, observation) pairs shown in each fresh prompt; an integer >= 0.

    Options of the other mode are ignored (as they always were).

    Raises:
        ConfigError: a value out of range (``field`` names it).
    """

    max_turns: int = DEFAULT_MAX_TURNS
    max_context_tokens: int | None = None
    max_response_tokens: int | None = None
    max_prompt_tokens: int | None = None
    history: int = DEFAULT_HISTORY

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise (a NumPy integer to int) once, here
        set_(self, "max_turns", check_int("max_turns", self.max_turns))
        for name in ("max_context_tokens", "max_response_tokens", "max_prompt_tokens"):
            set_(self, name, check_int(name, getattr(self, name), optional=True, unit="tokens"))
        set_(self, "history", check_int("history", self.history, minimum=0))

    @classmethod
    def merge(cls, limits: EpisodeLimits | None = None, /, *, default_max_turns: int = DEFAULT_MAX_TURNS,
              **given: Any) -> EpisodeLimits:
        """``limits`` (None: the defaults, with ``default_max_turns``) with the keyword arguments that are not
        None put in place: how functions that kept their old keywords (``max_turns=``, ``history=``, ...)
        build their limits.

        Raises:
            ConfigError: an unknown keyword, or a value out of range.
        """
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown episode limits {unknown}; valid: {[f.name for f in dataclasses.fields(cls)]}",
                              field=unknown[0])
        if limits is not None and not isinstance(limits, EpisodeLimits):
            raise ConfigError(f"limits={limits!r} must be an EpisodeLimits or None", field="limits")
        set_ = {k: v for k, v in given.items() if v is not None}
        if limits is None:
            return cls(**{"max_turns": default_max_turns, **set_})
        return dataclasses.replace(limits, **set_) if set_ else limits

    def to_dict(self) -> dict[str, int | None]:
        """The limits as a JSON-ready dict (field -> value)."""
        return dataclasses.asdict(self)
