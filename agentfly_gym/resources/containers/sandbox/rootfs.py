"""The sandbox's root file system: which folder an image name means, and what of the host it shows.

``ContainerSpec.image`` (or ``sandbox_image``) is ``"host"`` (the host's own system folders, with
its secrets masked), an absolute path to a rootfs folder, or an image name with a rootfs folder
on disk (:func:`resolve_rootfs`).
"""

from __future__ import annotations

import importlib
import os
import re
import stat
from pathlib import Path

from ....errors import ResourceUnavailable

__all__ = ["HOST_ENTRIES", "SKIP_ROOTFS", "host_secrets", "resolve_rootfs"]

HOST_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
"""Top-level folders of the host shown (read-only) to an ``image="host"`` sandbox."""
SKIP_ROOTFS = {"proc", "dev", "sys", "tmp", "root", "run", "mnt", "media", "lost+found"}
"""Top-level entries of a rootfs folder that are never bound (the sandbox makes its own)."""


def resolve_rootfs(image: str) -> Path | None:
    """The rootfs folder of ``image``; ``None`` for ``"host"``.

    Order: ``"host"``; an absolute path to a folder; ``agentfly_gym.images.base.rootfs_dir(image)``
    when that module provides it; the Debian base image ``agentfly/base`` (``:latest``, no tag
    or its content-hash tag) maps to :func:`agentfly_gym.images.base.base_rootfs_dir` once built
    (``agentfly-gym images build base``); else ``cache_dir("images", <name>)`` or its
    ``rootfs/`` subfolder, where ``<name>`` is the image name with ``/`` and ``:`` replaced by ``_``
    (e.g. a ``docker export`` of a recipe image unpacked there).

    Raises:
        ResourceUnavailable: no rootfs folder exists for ``image``.
    """
    if image == "host":
        return None
    if image.startswith("/"):
        p = Path(image)
        if p.is_dir():
            return p
        raise ResourceUnavailable(f"image={image!r}: no rootfs folder at that path")
    tried: list[str] = []
    try:
        images = importlib.import_module("agentfly_gym.images.base")
    except ImportError:
        images = None
    fn = getattr(images, "rootfs_dir", None) if images is not None else None
    if callable(fn):
        try:
            p = fn(image)
        except Exception as e:  # the images module says why (not built, unknown name)
            raise ResourceUnavailable(f"image={image!r}: {e}") from e
        if p is not None and Path(p).is_dir():
            return Path(p)
        tried.append(f"images.rootfs_dir -> {p}")
    base_fn = getattr(images, "base_rootfs_dir", None) if images is not None else None
    repo, _, tag = image.partition(":")
    if callable(base_fn) and repo == getattr(images, "BASE_IMAGE", None):
        p = Path(base_fn())
        if (tag in ("", "latest") or image == images.base_image_tag()) and (p / ".agentfly-rootfs.json").is_file():
            return p
        tried.append(str(p))
    from ....data.paths import cache_dir

    safe = re.sub(r"[/:]", "_", image)
    for c in (cache_dir("images", safe, "rootfs"), cache_dir("images", safe)):
        tried.append(str(c))
        if c.is_dir() and any(c.iterdir()):
            return c
    raise ResourceUnavailable(
        f"image={image!r} has no rootfs folder for the sandbox backend (searched: {', '.join(tried)}); "
        "build or export the image into one of these folders, pass an absolute rootfs path, "
        "or use image='host'")


def host_secrets(etc: str = "/etc") -> list[tuple[str, bool]]:
    """Entries of the host's ``/etc`` (two levels) that are not world-readable: ``(path, is_dir)``.

    ``image="host"`` masks them (an empty file or folder), so the sandbox never shows e.g.
    ``/etc/shadow``, ``/etc/gshadow``, ``/etc/sudoers`` or ssh host keys, whatever the host holds.
    """
    found: list[tuple[str, bool]] = []

    def scan(d: str, depth: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not st.st_mode & (stat.S_IXOTH if is_dir else stat.S_IROTH) or (is_dir and not st.st_mode & stat.S_IROTH):
                found.append((e.path, is_dir))
            elif is_dir and depth < 2:
                scan(e.path, depth + 1)

    scan(etc, 1)
    return sorted(found)
