"""Workarounds for TextWorld's, Fast Downward's and ALFWorld's private state, guarded by the versions they were
written for.

**Engine calls answered from a cache** (:func:`answering_engine_calls`, used by
:func:`~.engine_cache.serving`).  TextWorld's ``PddlEnv`` has no public way to hand it a game's parsed
grammar or its Fast Downward translations, which are pure functions of the game file's text and are
what a cold ALFWorld reset spends its time on.  So while it loads or resets a game, four module
attributes are rebound and restored after: ``textworld.envs.pddl.logic.GameLogic``,
``fast_downward.pddl2sas``, ``textworld.envs.pddl.textgen._parse_and_convert`` and
``textworld.logic._parse_and_convert``.  Each stand-in hands its call to the cache's answer function,
which returns what the real function returns for the same inputs (or calls it).  While an answer
function runs, the real ``GameLogic`` and ``pddl2sas`` are bound again (``pickle`` finds classes by their
module attribute).  ``pddl2sas(..., verbose=True)`` and parses with options other than ``rule_name`` pass
through.

**Game state dropped between episodes** (:func:`drop_game_state`): ``PddlEnv`` and ALFWorld's wrappers
keep the last game's ``state``/``prev_state`` in their instance dicts, linked by ``_wrapped_env``.

**TextWorld's intern cache** (:func:`clear_intern_cache`).

TextWorld interns its logic values: ``textworld.logic.Signature`` and ``Proposition`` are built
through metaclasses made by ``mementos.memento_factory``, so every call ``Proposition(name,
arguments)`` first looks up ``(class, name, ((variable name, type), ...))`` in the process-wide dict
``mementos.core._memento_cache`` and returns the instance stored there, or builds one and stores it
for ever.  Every game never seen before in a process adds its facts (~600-1,100 entries per ALFWorld
game, ~1.1 MB), and nothing ever removes them: a long-lived process that plays thousands of games
grows by gigabytes however often its simulators are replaced.

The cache is a pure memo of immutable value objects: ``Signature`` and ``Proposition`` compare and
hash by value (name and arguments), their slots are never reassigned after ``__init__``, and
TextWorld 1.7.0 never compares them by identity.  So dropping the dict only costs rebuilding an
instance the next time it is asked for; instances still referenced (by a loaded game) stay valid and
equal to the new ones.  :func:`clear_intern_cache` does that.

Only the versions in :data:`TESTED` were read and verified (games played after a clear give exactly
the observations they gave before, see ``tests/test_alfworld_memory.py``; games played through the
cache give those played without it, see ``tests/test_alfworld_engine_cache.py``).  With any other
version of these distributions nothing here touches anything (:func:`answering_engine_calls` binds
nothing, so every load computes everything itself: correct, 2-3x slower cold resets;
:func:`intern_cache_size` and :func:`clear_intern_cache` return ``None``; :func:`drop_game_state`
keeps the state until the next load replaces it), one warning is logged, and
``tests/test_compat_versions.py`` fails, naming the versions to re-check.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from ...utils.versions import untested_versions as _untested, verified as _verified

__all__ = ["TESTED", "answering_engine_calls", "clear_intern_cache", "drop_game_state", "intern_cache_size",
           "untested_versions"]

log = logging.getLogger(__name__)

#: The distributions whose private state this module touches, and the versions it was verified with.
TESTED: dict[str, tuple[str, ...]] = {"textworld": ("1.7.0",), "mementos": ("1.3.1",),
                                      "fast-downward-textworld": ("20.6.4",), "alfworld": ("0.4.2",)}

_warned = threading.Event()


def untested_versions() -> dict[str, str]:
    """The installed distributions of :data:`TESTED` whose version was not verified:
    ``{name: installed version or "not installed"}``; empty when all are known."""
    return _untested(TESTED)


def _applies() -> bool:
    """True where the installed versions are the verified ones; else False (one warning per process)."""
    return _verified(TESTED, _warned, log,
                     "ALFWorld: the engine cache, the state drop and the intern cache clear are off (every load "
                     "computes everything; TextWorld's intern cache is left unbounded): they were verified with %s, "
                     "installed %s")


#: ``answer_logic(domain, grammar, compute)`` -> a ``GameLogic``; ``compute()`` calls the real one
LogicAnswer = Callable[[str, str, Callable[[], Any]], Any]
#: ``answer_sas(domain, problem, optimize, compute)`` -> the SAS translation; ``compute()`` calls the real one
SasAnswer = Callable[[str, str, bool, Callable[[], Any]], Any]
#: ``answer_parse(parser_tag, text, rule_name, compute)`` -> the parsed snippet; tag ``"textgen"`` or ``"logic"``
ParseAnswer = Callable[[str, str, Any, Callable[[], Any]], Any]


@contextlib.contextmanager
def answering_engine_calls(answer_logic: LogicAnswer, answer_sas: SasAnswer, answer_parse: ParseAnswer) -> Iterator[bool]:
    """While the block runs, TextWorld's PDDL engine's ``GameLogic(domain, grammar)``,
    ``fast_downward.pddl2sas(domain, problem, optimize=...)`` and its two TatSu parses
    (``_parse_and_convert(text, rule_name=...)`` of ``textworld.envs.pddl.textgen`` and of
    ``textworld.logic``) are answered by the given functions, which get the real function first (see the
    module docstring): each gets the call's inputs and ``compute``, the real call.  The names are restored after the block, even on error.

    Not thread-safe: module attributes are process-wide; hold the ALFWorld engine lock around it.

    Yields:
        True, or False where the installed versions are not the verified ones (nothing is rebound: the
        engine computes everything itself).
    """
    if not _applies():
        yield False
        return
    import fast_downward
    import textworld.logic as tw_logic
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen

    real_logic = pddl_logic.GameLogic
    real_sas = fast_downward.pddl2sas
    real_symbols = textgen._parse_and_convert
    real_queries = tw_logic._parse_and_convert

    def bind(logic: Any, sas: Any) -> None:
        pddl_logic.GameLogic = logic
        fast_downward.pddl2sas = sas

    @contextlib.contextmanager
    def reals_bound() -> Iterator[None]:
        # pickle finds classes by name: the real GameLogic must be bound while a result is (un)pickled
        bind(real_logic, real_sas)
        try:
            yield
        finally:
            bind(game_logic, pddl2sas)

    def game_logic(domain: str, grammar: str) -> Any:
        with reals_bound():
            return answer_logic(domain, grammar, lambda: real_logic(domain=domain, grammar=grammar))

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        if verbose:  # prints: not answered from a cache
            return real_sas(domain, problem, verbose=verbose, optimize=optimize)
        with reals_bound():
            return answer_sas(domain, problem, bool(optimize),
                              lambda: real_sas(domain, problem, verbose=False, optimize=optimize))

    def parser(tag: str, real: Any) -> Any:
        def parse(text: str, **kwargs: Any) -> Any:
            if set(kwargs) - {"rule_name", "trace"} or kwargs.get("trace") or not isinstance(text, str):
                return real(text, **kwargs)
            return answer_parse(tag, text, kwargs.get("rule_name"), lambda: real(text, **kwargs))

        return parse

    bind(game_logic, pddl2sas)
    textgen._parse_and_convert = parser("textgen", real_symbols)
    tw_logic._parse_and_convert = parser("logic", real_queries)
    try:
        yield True
    finally:
        bind(real_logic, real_sas)
        textgen._parse_and_convert = real_symbols
        tw_logic._parse_and_convert = real_queries


def drop_game_state(env: Any) -> bool:
    """Drop the game state (``state``, ``prev_state``) that ``env`` (ALFWorld's wrappers around a
    ``PddlEnv``, linked by ``_wrapped_env``) and every env inside it keep; the next load builds a fresh one.

    Returns:
        True, or False (nothing touched) with untested versions.
    """
    if not _applies():
        return False
    inner = env
    while inner is not None:
        for attr in ("state", "prev_state"):
            if attr in vars(inner):
                setattr(inner, attr, None)
        inner = vars(inner).get("_wrapped_env")
    return True


def _memento_cache() -> dict | None:
    """``mementos.core._memento_cache`` where the installed versions are the verified ones, else ``None``."""
    if not _applies():
        return None
    try:
        from mementos import core
    except ImportError:
        return None
    cache = getattr(core, "_memento_cache", None)
    return cache if isinstance(cache, dict) else None


def intern_cache_size() -> int | None:
    """Entries in TextWorld's process-wide intern cache (``Signature``/``Proposition`` instances);
    ``None`` with untested versions of ``textworld``/``mementos``."""
    cache = _memento_cache()
    return None if cache is None else len(cache)


def clear_intern_cache() -> int | None:
    """Empty TextWorld's process-wide intern cache (see the module docstring for why that is safe).

    Returns:
        the number of entries dropped, or ``None`` (nothing touched) with untested versions of
        ``textworld``/``mementos``.
    """
    cache = _memento_cache()
    if cache is None:
        return None
    n = len(cache)
    cache.clear()  # one C call under the GIL: a concurrent lookup either hits before or misses after
    return n
