"""The version guard every ``_compat`` module shares: which installed distributions are not among the versions a
workaround was verified with (see the project's rule: a workaround of a dependency lives in a ``_compat`` module
next to its user, guarded by the versions it was written for).

One rule says whether a version was checked (:func:`is_checked`: an exact version, or a prefix ending in ``.``
such as ``"2.60."`` for a whole release series), one function warns once (:func:`warn_once`); the env
``_compat`` modules use :func:`verified` on their ``TESTED`` tables, Ray's and the tokenizer mirror's use
:func:`is_checked` on the version of the module they were given."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading
from collections.abc import Mapping

__all__ = ["installed_version", "is_checked", "untested_versions", "verified", "warn_once"]


def is_checked(version: str, checked: tuple[str, ...]) -> bool:
    """Whether ``version`` is one of ``checked``: equal to an entry, or starting with an entry that ends in ``.``
    (a release series: ``"2.60."`` checks ``2.60.0`` and ``2.60.1``, not ``2.600.0``)."""
    return any(version == c or (c.endswith(".") and version.startswith(c)) for c in checked)


def warn_once(seen: set[str] | threading.Event, key: str, log: logging.Logger, message: str, *args: object) -> None:
    """Log ``message % args`` as a warning unless ``seen`` already holds ``key`` (a set: once per key, e.g. per
    installed version; an Event: once in all)."""
    if isinstance(seen, threading.Event):
        if seen.is_set():
            return
        seen.set()
    else:
        if key in seen:
            return
        seen.add(key)
    log.warning(message, *args)


@functools.lru_cache(maxsize=64)
def installed_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"not installed"``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def untested_versions(tested: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """The distributions of ``tested`` (name -> verified versions) whose installed version is not one of them:
    ``{name: installed version or "not installed"}``; empty when all are known."""
    return {name: v for name, versions in tested.items() if not is_checked(v := installed_version(name), versions)}


def verified(tested: Mapping[str, tuple[str, ...]], warned: threading.Event, log: logging.Logger, message: str) -> bool:
    """True where every distribution of ``tested`` has a verified version installed; else False, after logging
    ``message % (tested, untested)`` as a warning once per ``warned`` event (one per ``_compat`` module)."""
    bad = untested_versions(tested)
    if bad:
        warn_once(warned, "", log, message, dict(tested), bad)
    return not bad
