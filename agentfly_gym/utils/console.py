"""The rich console the command line prints tables with."""

from __future__ import annotations

import sys

__all__ = ["console"]

#: columns of a table written to a pipe or file (rich's default there, 80, folds paths and messages)
PIPE_WIDTH = 200


def console():
    """A ``rich.console.Console`` on stdout: the terminal's width on a terminal, :data:`PIPE_WIDTH` columns
    when stdout is a pipe or file (``$COLUMNS`` still wins)."""
    import os

    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPE_WIDTH)
