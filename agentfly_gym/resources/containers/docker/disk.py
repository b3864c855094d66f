"""The Docker backend's kernel-enforced disk and inode limit: the container's writable layer on a
loop-mounted ext4 file system of ``spec.disk`` bytes.

The engine's own ``--storage-opt size=`` needs overlay2 over xfs mounted with ``pquota``; most hosts
(ext4 under ``/var/lib/docker``) do not have it, and a polling watchdog lets a fast writer overshoot
(2 GB in one second against a 256 MB limit).  Where the manager runs as root beside a local engine
whose storage driver is ``overlay2``, the container's layer folder (``<docker root>/overlay2/<id>``,
holding ``diff``, the upper directory, and ``work``, which overlayfs needs on the same file system)
is moved, between ``create`` and ``start``, onto a fresh ext4 image of ``disk`` bytes with one inode per
:data:`~agentfly_gym.resources.containers.sandbox.volume.BYTES_PER_INODE` bytes: a write past it fails
with ``ENOSPC`` inside the container, whatever its speed, and so does a file or symlink past the inode
count.  The image file is unlinked once mounted, so the loop device holds the only reference: when the
engine removes the container it unmounts the layer folder (``EBUSY`` makes it unmount and retry), the
loop device is detached (``autoclear``) and the space is freed; nothing is left to clean up after a
manager that died.

Cost: one ``mke2fs -d`` (which copies the nearly empty layer folder into the new file system) and one
mount per container start (it was mkfs, a mount, a copy, an unmount and a mount: about 0.4 s more per start,
median 1.09 s against 0.66 s on a loaded 2-core VM); the pool makes a parked instance's fresh container
in the background, so a re-acquisition does not wait for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from ..sandbox.volume import make_ext4

__all__ = ["RM_TIMEOUT", "UpperDir", "layer_dir", "mount_layer_volume", "overlay_paths"]

log = logging.getLogger(__name__)


def layer_dir(graph_driver: dict) -> Path | None:
    """The overlay2 layer folder of a created container (the parent of ``UpperDir`` and ``WorkDir``) when
    this process can mount over it: root, an overlay2 driver, and the folder present on this host (a
    local engine).  ``graph_driver`` is ``inspect_container(...)["GraphDriver"]``; else ``None``."""
    if os.geteuid() != 0 or (graph_driver or {}).get("Name") != "overlay2":
        return None
    data = graph_driver.get("Data") or {}
    upper, work = data.get("UpperDir"), data.get("WorkDir")
    if not upper or not work or os.path.dirname(upper) != os.path.dirname(work):
        return None
    d = Path(os.path.dirname(upper))
    return d if d.is_dir() and not os.path.ismount(d) else None


def mount_layer_volume(layer: Path, size: int) -> bool:
    """Move ``layer`` (a created, not yet started container's overlay2 folder) onto a fresh ext4 file
    system of ``size`` bytes.  False (logged) when it cannot be done here (no loop device, no
    ``mkfs.ext4``, a refused mount); ``layer`` is then as it was."""
    tmp = Path(tempfile.mkdtemp(prefix="agentfly-docker-disk-"))
    img = tmp / "layer.img"
    try:
        st = os.stat(layer)
        make_ext4(img, size, source=layer)  # the file system is made holding the layer's tree
        subprocess.run(["mount", "-o", "loop,nosuid", str(img), str(layer)], check=True, capture_output=True,
                       text=True, timeout=60)
        with contextlib.suppress(OSError):
            (layer / "lost+found").rmdir()
        os.chown(layer, st.st_uid, st.st_gid)
        os.chmod(layer, st.st_mode & 0o7777)
        return True
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or e
        log.info("docker: no loop-mounted layer (%s); the disk limit falls back", str(detail).strip())
        if os.path.ismount(layer):
            subprocess.run(["umount", "-l", str(layer)], capture_output=True, check=False)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the image too: the loop device keeps it while mounted


def overlay_paths(graph_driver: dict) -> tuple[str, str] | None:
    """``(UpperDir, MergedDir)`` of a container whose overlay2 layer is on this host (root only, as the layer folders
    are root's); ``graph_driver`` is ``inspect_container(...)["GraphDriver"]``; else ``None``."""
    if os.geteuid() != 0 or (graph_driver or {}).get("Name") != "overlay2":
        return None
    data = graph_driver.get("Data") or {}
    upper, merged = data.get("UpperDir"), data.get("MergedDir")
    if not upper or not merged or not os.path.isdir(upper):
        return None
    return upper, merged


RM_TIMEOUT = 60.0
"""Seconds the host-side removal of a writable layer may take; past it the container is replaced instead."""


@dataclasses.dataclass(frozen=True)
class UpperDir:
    """A container's overlay upper folder (its writable layer) as the engine made it at create: the folder is the
    container's ``/``, so its own mode, owner and extended attributes are the root folder's."""

    path: str
    mode: int
    uid: int
    gid: int
    xattrs: tuple[tuple[str, bytes], ...]

    @classmethod
    def record(cls, path: str) -> UpperDir:
        """Raises OSError: ``path`` cannot be read."""
        st = os.stat(path)
        return cls(path, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                   tuple((n, os.getxattr(path, n)) for n in os.listxattr(path)))

    def renew(self) -> bool:
        """Replace the folder, which the engine has unmounted (the container stopped), with a new empty one as it was
        at create: every file written, every whiteout of a deleted lower file and every change of ``/`` itself (mode,
        owner, attributes) is gone, so the next start sees the image as it is.  ``rm`` handles any depth and name
        the container made, follows no symbolic link and stays on the layer's file system.  False (logged) when it
        cannot be done: the caller replaces the container."""
        try:
            r = subprocess.run(["rm", "-rf", "--one-file-system", "--", self.path], capture_output=True, text=True,
                               timeout=RM_TIMEOUT, check=False)
            if r.returncode != 0 or os.path.lexists(self.path):
                log.info("docker: removing a container's writable layer failed: %s", r.stderr.strip()[-500:])
                return False
            os.mkdir(self.path, 0o700)
            os.chown(self.path, self.uid, self.gid)
            os.chmod(self.path, self.mode)
            for name, value in self.xattrs:
                os.setxattr(self.path, name, value)
            return True
        except (OSError, subprocess.SubprocessError) as e:
            log.info("docker: renewing a container's writable layer failed: %s", e)
            return False
