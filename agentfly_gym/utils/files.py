"""Publishing a folder or a file whole: built under a temporary name beside it, renamed into place when complete;
and the lock that keeps a second process from building the same thing at once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["staged_dir", "atomic_path", "file_lock", "fsync_dir"]


@contextlib.contextmanager
def staged_dir(final: Path, *, complete: str, prefix: str | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``final``; when the block ends without error it is renamed
    to ``final``, so readers see the whole folder or none of it.

    Concurrent builders are safe: when another one renamed its copy first (``final`` then holds the file
    ``complete``), this copy is dropped. The temporary folder never outlives the block.

    Args:
        final: the folder to publish (its parent is created).
        complete: a file name that a finished copy of ``final`` always holds.
        prefix: the temporary folder's name prefix (default ``".<final name>."``).

    Raises:
        OSError: the folder cannot be created or renamed (and no finished copy is there).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix or f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / complete).is_file():  # not a race lost to another builder
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (a rename into it) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``final`` (a hidden name in the same folder) to write the file at; when
    the block ends without error the file is flushed to disk (``fsync``) and renamed to ``final``, so readers
    see the old file or the whole new one, never a part.  On error (a full disk...) the temporary file is
    removed and ``final`` is untouched.

    Raises:
        OSError: the file cannot be flushed or renamed.
    """
    final = Path(final)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, with its folder, if missing) for the block, waiting for
    another process that holds it: one build of a thing at a time across processes (two test workers, two
    shells), where the second then finds what the first built.  (An output folder's lock, which refuses a second
    writer instead of waiting, is :func:`~agentfly_gym.rollout.outputs.folder_lock`.)

    Raises:
        OSError: the lock file cannot be created or opened.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
