"""Naming unknown names with their close matches, for the errors that refuse a misspelt keyword or option.

One rule for every "did you mean" of the library (``gymnasium.make``'s env arguments, ``make_tool_env``'s
arguments, ``@tool``'s options): each unknown name quoted, followed by its closest known name
(``difflib.get_close_matches``, default cutoff 0.6) where there is one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

__all__ = ["name_unknown"]


def name_unknown(unknown: Iterable[str], known: Sequence[str]) -> tuple[str, str]:
    """``("'mdoe' (did you mean 'mode'?), 'zzz'", "s")``: the unknown names, each with its close match among
    ``known``, joined by ``", "``, and the plural ending (``"s"`` for two or more, else ``""``) for the noun
    before them."""
    said = []
    for k in unknown:
        close = difflib.get_close_matches(k, list(known), n=1)
        said.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
    return ", ".join(said), "s" if len(said) > 1 else ""
