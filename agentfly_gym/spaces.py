"""Text spaces for language environments."""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces

__all__ = ["TextSpace", "TEXT_CHARSET"]

TEXT_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


class TextSpace(spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains any Python ``str`` up to ``max_length`` characters.

    Language-model observations and actions use the whole of Unicode, so membership does
    not restrict the character set; ``sample()`` draws from printable ASCII, spaces and
    newlines (``TEXT_CHARSET``).
    """

    def __init__(self, max_length: int = 65536, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=TEXT_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length and other.min_length == self.min_length
