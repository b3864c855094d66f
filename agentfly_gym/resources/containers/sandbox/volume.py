"""The sandbox's disk limit: a loop-mounted ext4 file system of ``spec.disk`` bytes per instance.

Only a manager running as root can mount one; elsewhere the limit holds per file (``RLIMIT_FSIZE``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["BYTES_PER_INODE", "make_ext4", "mount_volume", "unmount_under"]

log = logging.getLogger(__name__)


BYTES_PER_INODE = 8192
"""One inode per this many bytes of a volume: the inode limit of a ``disk`` of N bytes is
``N // BYTES_PER_INODE`` files, folders and symlinks (8192 for 64 MiB, 1.3 million for 10 GB)."""


def make_ext4(img: Path, size: int, *, root_owner: tuple[int, int] = (0, 0), timeout: float = 120,
              source: Path | None = None) -> None:
    """Make ``img`` (created, must not exist) a sparse ext4 file system of ``size`` bytes with one inode per
    :data:`BYTES_PER_INODE` bytes, no journal and no reserved blocks; with ``source``, holding a copy of that
    folder's tree (``mke2fs -d``: owners, modes, device nodes and extended attributes kept).

    Raises:
        FileNotFoundError: no ``mkfs.ext4`` / ``mke2fs`` here.
        OSError, subprocess.CalledProcessError: the image or the file system could not be made.
    """
    mkfs = shutil.which("mkfs.ext4") or shutil.which("mke2fs")
    if mkfs is None:
        raise FileNotFoundError("mkfs.ext4 (e2fsprogs) is not installed")
    with open(os.open(img, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.truncate(size)
    uid, gid = root_owner
    subprocess.run([mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-O", "^has_journal", "-i", str(BYTES_PER_INODE),
                    "-E", f"lazy_itable_init=1,root_owner={uid}:{gid}", *(["-d", str(source)] if source else []),
                    str(img)],
                   check=True, capture_output=True, text=True, timeout=timeout)


def mount_volume(d: Path, size: int, uid: int, gid: int) -> Path | None:
    """A fresh ext4 file system of ``size`` bytes (sparse image ``d/disk.img``) mounted at ``d/vol``.

    ``None`` (logged) when it cannot be made here (no loop devices, no mkfs.ext4, a mount refused).
    """
    img, vol = d / "disk.img", d / "vol"
    try:
        vol.mkdir()
        make_ext4(img, size, root_owner=(uid, gid))
        subprocess.run(["mount", "-o", "loop,nosuid,nodev", str(img), str(vol)],
                       check=True, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or e
        log.info("sandbox: no loop-mounted disk (%s); the disk limit holds per file only", str(detail).strip())
        with contextlib.suppress(OSError):
            vol.rmdir()
        with contextlib.suppress(OSError):
            img.unlink()
        return None
    return vol


def unmount_under(d: Path) -> None:
    """Unmount every mount at or below ``d`` (deepest first; lazily if busy).  The loop device of
    a ``-o loop`` mount is freed with it."""
    prefix = str(d).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = []
    for line in lines:
        parts = line.split()
        if len(parts) > 1:
            mp = parts[1].encode().decode("unicode_escape")  # /proc/mounts octal-escapes spaces
            if mp.startswith(prefix) or mp == str(d):
                points.append(mp)
    for mp in sorted(points, key=len, reverse=True):
        r = subprocess.run(["umount", mp], capture_output=True, check=False)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)
