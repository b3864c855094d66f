"""What every container backend does with a command's output: keep its head and tail, in bounded memory.

Both backends feed the bytes of an exec's combined stdout and stderr to an :class:`OutputBuffer`
as they arrive and turn them into :attr:`ExecResult.output <.api.ExecResult>` with
:meth:`OutputBuffer.text`, so a long output reads the same on Docker and in the sandbox: the first
and last characters, with :data:`TRUNCATION_MARKER` in between saying how many were cut.
"""

from __future__ import annotations

__all__ = ["TRUNCATION_MARKER", "OutputBuffer"]

TRUNCATION_MARKER = "\n[... {n} characters cut ...]\n"
"""Stands in for the middle of an output longer than ``max_output``; ``{n}`` is the number of
characters cut (when bytes were dropped before decoding, their count stands in for characters)."""


class OutputBuffer:
    """Keeps the head and the tail of a byte stream, at most ``4 * max_chars`` bytes of each.

    Args:
        max_chars: the characters :meth:`text` may return (a UTF-8 character is at most 4 bytes,
            so ``4 * max_chars`` bytes of head and of tail always suffice).
    """

    def __init__(self, max_chars: int) -> None:
        self.cap = max(4 * max_chars, 64)  # bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0  # bytes dropped from the middle

    def feed(self, chunk: bytes) -> None:
        """Add the next bytes of the stream."""
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            extra = len(self.tail) - self.cap
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def text(self, max_chars: int) -> tuple[str, bool]:
        """The output as at most ``max_chars`` characters (UTF-8, invalid bytes replaced), and
        whether it was cut.

        A cut output is its first and last characters (half the room each) around
        :data:`TRUNCATION_MARKER`; with ``max_chars`` shorter than the marker, only the head.
        """
        if not self.dropped:
            full = bytes(self.head + self.tail).decode("utf-8", errors="replace")
            if len(full) <= max_chars:
                return full, False
            head_t = tail_t = full
            total = len(full)
        else:
            head_t = self.head.decode("utf-8", errors="replace")
            tail_t = self.tail.decode("utf-8", errors="replace").lstrip("\ufffd")
            total = len(head_t) + self.dropped + len(tail_t)
        marker_len = len(TRUNCATION_MARKER.format(n=total))
        if max_chars <= marker_len:
            return head_t[:max_chars], True
        keep = max_chars - marker_len
        h, t = keep // 2, keep - keep // 2
        return head_t[:h] + TRUNCATION_MARKER.format(n=total - h - t) + tail_t[len(tail_t) - t:], True
