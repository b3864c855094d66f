"""Where data sets live, and the clear error when one is missing.

Resolution order for a data set ``name`` (``"alfworld"``, ``"webshop"``, ``"chess"``):

1. an explicit ``data_dir=`` argument of the environment;
2. the data set's own environment variable where upstream defines one
   (``ALFWORLD_DATA`` for ALFWorld, ``WEBSHOP_DATA`` for WebShop);
3. ``$AGENTFLY_GYM_DATA/<name>`` (one root holding every data set, the layout of the
   project's shared data folder);
4. the default cache folder, ``~/.cache/<name>`` for ALFWorld (upstream's default) and
   ``~/.cache/agentfly-gym/<name>`` otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import DataNotFoundError

__all__ = ["resolve_data_dir", "DATA_ROOT_ENV", "cache_dir"]

DATA_ROOT_ENV = "AGENTFLY_GYM_DATA"

_OWN_ENV = {"alfworld": "ALFWORLD_DATA", "webshop": "WEBSHOP_DATA"}
_DEFAULTS = {"alfworld": "~/.cache/alfworld"}


def cache_dir(*parts: str) -> Path:
    """``$AGENTFLY_GYM_CACHE`` or ``~/.cache/agentfly-gym``, joined with ``parts`` (not created)."""
    root = os.environ.get("AGENTFLY_GYM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agentfly-gym")
    return Path(root, *parts)


def resolve_data_dir(name: str, data_dir: str | os.PathLike | None = None, *, must_contain: str | None = None,
                     how_to_get: str = "") -> Path:
    """The folder of data set ``name`` (see the module docstring for the order).

    Args:
        name: data set name.
        data_dir: explicit folder, wins over everything else.
        must_contain: a relative path that must exist inside the folder.
        how_to_get: instructions appended to the error message.

    Raises:
        DataNotFoundError: no candidate folder exists (or lacks ``must_contain``); the
            message lists the places searched and how to obtain the data.
    """
    candidates: list[Path] = []
    if data_dir is not None:
        candidates.append(Path(data_dir).expanduser())
    else:
        own = _OWN_ENV.get(name)
        if own and os.environ.get(own):
            candidates.append(Path(os.environ[own]).expanduser())
        if os.environ.get(DATA_ROOT_ENV):
            candidates.append(Path(os.environ[DATA_ROOT_ENV]).expanduser() / name)
        candidates.append(Path(_DEFAULTS.get(name, str(cache_dir(name)))).expanduser())
    for c in candidates:
        if c.is_dir() and (must_contain is None or (c / must_contain).exists()):
            return c
    searched = ", ".join(str(c / must_contain) if must_contain else str(c) for c in candidates)
    env_hint = f"set data_dir=..., {_OWN_ENV[name]}=... or {DATA_ROOT_ENV}=<root holding {name}/>" if name in _OWN_ENV \
        else f"set data_dir=... or {DATA_ROOT_ENV}=<root holding {name}/>"
    raise DataNotFoundError(f"{name} data not found (searched: {searched}). {how_to_get} Then {env_hint}.".strip())
