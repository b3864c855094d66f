"""Where Gymnasium gives an env no public way to learn its step limit: read it from Gymnasium's frames,
guarded by the Gymnasium versions this was written for.

``gymnasium.make(id, max_episode_steps=N)`` (and ``make(spec)`` with ``spec.max_episode_steps``) does not
pass ``N`` to the env: it builds the env, sets ``env.unwrapped.spec`` with ``max_episode_steps=None`` and
only then wraps the env in ``TimeLimit(env, N)``; a ``TimeLimit`` wrapped by hand is equally invisible to
the env inside.  An :class:`~agentfly_gym.envs.base.AgentFlyEnv` that does not know the limit cannot end
its episode at it, so its simulator, engine or container stays held until the next reset or close.  The
public routes do not reach it: a registered ``additional_wrappers`` entry (applied after ``TimeLimit``,
where ``env.spec.max_episode_steps`` is public) makes ``gymnasium.make_vec`` refuse the env's
``vector_entry_point``; ``make_vec`` itself passes ``max_episode_steps`` to the vector entry point
publicly, and :class:`~agentfly_gym.vector.AsyncTextVectorEnv` takes it from there.

So the two functions below read Gymnasium's own frames: :func:`limit_of_gymnasium_make` the locals
``max_episode_steps``/``env_spec`` of the running ``gymnasium.envs.registration.make`` (found by its code
object), :func:`enclosing_time_limit` the ``_max_episode_steps`` of a ``TimeLimit`` whose ``reset`` is
running.  Both depend on Gymnasium's private names, verified only for the versions in :data:`TESTED`;
with any other version they return None (the env keeps its own limit, ``TimeLimit`` still truncates as
Gymnasium's, only the resources are released at the next reset instead of at the limit), log one warning,
and ``tests/test_compat_versions.py`` fails naming the version to re-check.
"""

from __future__ import annotations

import inspect
import logging
import threading

import gymnasium
import gymnasium.envs.registration
import gymnasium.wrappers

from ..utils.versions import untested_versions as _untested, verified as _verified

__all__ = ["TESTED", "enclosing_time_limit", "limit_of_gymnasium_make", "untested_versions"]

log = logging.getLogger(__name__)

#: The distributions whose private names this module reads, and the versions it was verified with.
TESTED: dict[str, tuple[str, ...]] = {"gymnasium": ("1.4.0",)}

_warned = threading.Event()


def untested_versions() -> dict[str, str]:
    """The installed distributions of :data:`TESTED` whose version was not verified:
    ``{name: installed version or "not installed"}``; empty when all are known."""
    return _untested(TESTED)


def _applies() -> bool:
    """True where the installed versions are the verified ones; else False (one warning per process)."""
    return _verified(TESTED, _warned, log,
                     "agentfly-gym envs do not read gymnasium.make's max_episode_steps: verified with %s, installed %s; "
                     "pass max_episode_steps to the env itself")


def _valid(n: object) -> int | None:
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def limit_of_gymnasium_make() -> int | None:
    """The step limit of the ``gymnasium.make`` call that is constructing an env now, else None (also with
    an untested Gymnasium, or where frames are not available)."""
    if not _applies():
        return None
    code = getattr(getattr(gymnasium.envs.registration, "make", None), "__code__", None)
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code is code:
                n = frame.f_locals.get("max_episode_steps")
                if n is None:
                    n = getattr(frame.f_locals.get("env_spec"), "max_episode_steps", None)
                return _valid(n)
            frame = frame.f_back
        return None
    finally:
        del frame


def enclosing_time_limit(env: gymnasium.Env) -> int | None:
    """The ``max_episode_steps`` of a ``gymnasium.wrappers.TimeLimit`` around ``env`` whose ``reset`` is
    running now (found in the calling frames), else None (also with an untested Gymnasium)."""
    if not _applies():
        return None
    frame = inspect.currentframe()
    try:
        while frame is not None:
            wrapper = frame.f_locals.get("self")
            if isinstance(wrapper, gymnasium.wrappers.TimeLimit) and wrapper.unwrapped is env:
                return _valid(getattr(wrapper, "_max_episode_steps", None))
            frame = frame.f_back
        return None
    finally:
        del frame
