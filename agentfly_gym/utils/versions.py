"""The version guard the ``_compat`` modules share: which installed distributions are not among the versions a
workaround was verified with (see the project's rule: a workaround of a dependency lives in a ``_compat`` module
next to its user, guarded by the versions it was written for)."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading
from collections.abc import Mapping

__all__ = ["installed_version", "untested_versions", "verified"]


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
    return {name: v for name, versions in tested.items() if (v := installed_version(name)) not in versions}


def verified(tested: Mapping[str, tuple[str, ...]], warned: threading.Event, log: logging.Logger, message: str) -> bool:
    """True where every distribution of ``tested`` has a verified version installed; else False, after logging
    ``message % (tested, untested)`` as a warning once per ``warned`` event (one per ``_compat`` module)."""
    bad = untested_versions(tested)
    if bad and not warned.is_set():
        warned.set()
        log.warning(message, dict(tested), bad)
    return not bad
