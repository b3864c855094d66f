"""Workarounds for TextWorld's private state, guarded by the versions they were written for.

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
the observations they gave before, see ``tests/test_alfworld_memory.py``).  With any other version
of ``textworld`` or ``mementos`` :func:`intern_cache_size` and :func:`clear_intern_cache` touch
nothing (they return ``None`` and log one warning), and the test of this module fails, naming the
versions to re-check.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading

__all__ = ["TESTED", "clear_intern_cache", "intern_cache_size", "untested_versions"]

log = logging.getLogger(__name__)

#: The distributions whose private state this module touches, and the versions it was verified with.
TESTED: dict[str, tuple[str, ...]] = {"textworld": ("1.7.0",), "mementos": ("1.3.1",)}

_warned = threading.Event()


def untested_versions() -> dict[str, str]:
    """The installed distributions of :data:`TESTED` whose version was not verified:
    ``{name: installed version or "not installed"}``; empty when all are known."""
    return {name: v for name, v in _installed(tuple(TESTED)).items() if v not in TESTED[name]}


@functools.lru_cache(maxsize=4)
def _installed(names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _memento_cache() -> dict | None:
    """``mementos.core._memento_cache`` where the installed versions are the verified ones, else ``None``."""
    bad = untested_versions()
    if bad:
        if not _warned.is_set():
            _warned.set()
            log.warning("ALFWorld: TextWorld's intern cache is left unbounded: it was verified with %s, installed %s",
                        {k: v for k, v in TESTED.items() if k in bad}, bad)
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
