"""Where data sets live, and the clear error when one is missing.

Resolution order for a data set ``name`` (``"alfworld"``, ``"webshop"``, ``"chess"``):

1. an explicit ``data_dir=`` argument of the environment;
2. the data set's own environment variable where upstream defines one
   (``ALFWORLD_DATA`` for ALFWorld, ``WEBSHOP_DATA`` for WebShop);
3. ``$AGENTFLY_GYM_DATA/<name>`` (one root holding every data set, the layout of the
   project's shared data folder);
4. the default cache folder, ``~/.cache/<name>`` for ALFWorld (upstream's default) and
   ``~/.cache/agentfly-gym/<name>`` otherwise (where ``agentfly-gym data download`` writes);
5. the small public sample shipped inside the package (``agentfly_gym/samples/<name>``; see its
   README for what it holds and where it comes from), so every environment runs with no data set up.

Steps 2-5 are only tried when no ``data_dir=`` is given: an explicit folder never falls back.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataNotFoundError

__all__ = ["resolve_data_dir", "data_candidates", "sample_dir", "default_download_dir", "DATA_ROOT_ENV", "cache_dir"]

DATA_ROOT_ENV = "AGENTFLY_GYM_DATA"

_OWN_ENV = {"alfworld": "ALFWORLD_DATA", "webshop": "WEBSHOP_DATA"}
_DEFAULTS = {"alfworld": "~/.cache/alfworld"}
#: data sets with a sample shipped in the package (folder names under ``agentfly_gym/samples``)
_SAMPLES = ("chess", "alfworld", "webshop")


def cache_dir(*parts: str) -> Path:
    """``$AGENTFLY_GYM_CACHE`` or ``~/.cache/agentfly-gym``, joined with ``parts`` (not created)."""
    root = os.environ.get("AGENTFLY_GYM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agentfly-gym")
    return Path(root, *parts)


def sample_dir(name: str) -> Path | None:
    """The folder of the sample of data set ``name`` shipped in the package, or ``None`` if there is none."""
    if name not in _SAMPLES:
        return None
    p = Path(__file__).resolve().parents[1] / "samples" / name
    return p if p.is_dir() else None


def default_download_dir(name: str) -> Path:
    """Where ``agentfly-gym data download`` puts data set ``name`` by default.

    ``$AGENTFLY_GYM_DATA/<name>`` when that variable is set, else the default cache folder of step 4
    (``~/.cache/alfworld`` for ALFWorld, ``~/.cache/agentfly-gym/<name>`` otherwise), so that the
    resolution order finds what was downloaded.
    """
    if os.environ.get(DATA_ROOT_ENV):
        return Path(os.environ[DATA_ROOT_ENV]).expanduser() / name
    return Path(_DEFAULTS.get(name, str(cache_dir(name)))).expanduser()


def data_candidates(name: str, data_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """The folders searched for data set ``name``, in order, each with a label saying where it comes from.

    Labels: ``"data_dir"``, the variable's name (``"ALFWORLD_DATA"``, ``"WEBSHOP_DATA"``,
    ``"AGENTFLY_GYM_DATA"``), ``"cache"`` and ``"bundled sample"``.  The folders need not exist.
    """
    if data_dir is not None:
        return [("data_dir", Path(data_dir).expanduser())]
    out: list[tuple[str, Path]] = []
    own = _OWN_ENV.get(name)
    if own and os.environ.get(own):
        out.append((own, Path(os.environ[own]).expanduser()))
    if os.environ.get(DATA_ROOT_ENV):
        out.append((DATA_ROOT_ENV, Path(os.environ[DATA_ROOT_ENV]).expanduser() / name))
    out.append(("cache", Path(_DEFAULTS.get(name, str(cache_dir(name)))).expanduser()))
    sample = sample_dir(name)
    if sample is not None:
        out.append(("bundled sample", sample))
    return out


def resolve_data_dir(name: str, data_dir: str | os.PathLike | None = None, *, must_contain: str | None = None,
                     how_to_get: str = "") -> Path:
    """The folder of data set ``name`` (see the module docstring for the order).

    Args:
        name: data set name.
        data_dir: explicit folder, wins over everything else (and is the only one tried).
        must_contain: a relative path that must exist inside the folder, or a glob pattern
            (``"items_ins_v2*.json"``) that must match something there.
        how_to_get: instructions appended to the error message.

    Raises:
        DataNotFoundError: no candidate folder exists (or lacks ``must_contain``); the
            message lists the places searched and how to obtain the data.
    """
    candidates = [p for _label, p in data_candidates(name, data_dir)]
    for c in candidates:
        if c.is_dir() and (must_contain is None or (c / must_contain).exists()
                           or (any(ch in must_contain for ch in "*?[") and any(c.glob(must_contain)))):
            return c
    searched = ", ".join(str(c / must_contain) if must_contain else str(c) for c in candidates)
    env_hint = f"set data_dir=..., {_OWN_ENV[name]}=... or {DATA_ROOT_ENV}=<root holding {name}/>" if name in _OWN_ENV \
        else f"set data_dir=... or {DATA_ROOT_ENV}=<root holding {name}/>"
    raise DataNotFoundError(f"{name} data not found (searched: {searched}). {how_to_get} Then {env_hint}.".strip())
