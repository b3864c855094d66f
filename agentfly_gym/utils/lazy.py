"""Packages whose public names are imported when first used (PEP 562), so that importing one submodule of a
package, or the package itself, does not import all of them: ``agentfly-gym envs`` reads the Lichess puzzle file's
location from ``agentfly_gym.envs.chess.puzzles`` without importing the Stockfish engine module.

A package writes its exports twice: under ``if TYPE_CHECKING:`` as plain imports (what type checkers, IDEs and the
API reference read) and as the ``{name: submodule}`` map given here (what runs)::

    if TYPE_CHECKING:
        from .env import ChessEnv
    __getattr__, __dir__ = lazy_exports(__name__, {"ChessEnv": "env"})

``tests/test_cli_startup.py`` checks that the two agree for every package that uses this.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` that import ``exports[name]`` (a submodule,
    relative to ``package``) when ``name`` is first read, and keep the value in the package's namespace.

    Raises (from ``__getattr__``):
        AttributeError: ``name`` is not an export (as for any module attribute that does not exist).
    """
    exports = dict(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
