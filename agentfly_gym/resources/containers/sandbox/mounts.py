"""The mount plan of a sandbox: which host folder each container path shows, read-only or private and
writable, which symlinks the root holds, which host secrets are masked, and which folders the instance's
unprivileged host user cannot reach (so that an exec stages them first)."""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import stat
import sys
from pathlib import Path

from ....errors import ConfigError
from ..api import mount_sources
from .rootfs import HOST_ENTRIES, SKIP_ROOTFS, host_secrets, resolve_rootfs

__all__ = ["BASE_WRITABLE", "SandboxMounts"]

BASE_WRITABLE = ("/tmp", "/root")
"""Container paths that are always private and writable (the workdir and the user's home are added)."""


class SandboxMounts:
    """The mount plan of :class:`~.container.SandboxContainer` (a mixin of it): :meth:`_plan_mounts` fills
    ``_ro``, ``_late_ro``, ``_links``, ``_writable``, ``_mounts``, ``_masks``, ``_extra_path`` and ``_rootfs``
    (set empty by the container's ``__init__``) from ``spec`` and ``image``; :meth:`_mount_table` is the
    table every path lookup goes through.  The private state lives under ``dir`` (or the disk volume
    ``_volume``) of the container.
    """

    @property
    def state_dir(self) -> Path:
        assert self.dir is not None
        return (self._volume or self.dir) / "state"

    @staticmethod
    def _state_name(cpath: str) -> str:
        return cpath.strip("/").replace("/", "__") or "_root"

    def _host_of_writable(self, cpath: str) -> Path:
        return self.state_dir / self._state_name(cpath)

    def _plan_mounts(self) -> None:
        spec = self.spec
        wd = posixpath.normpath(spec.workdir or "/")
        if not wd.startswith("/"):
            raise ConfigError(f"workdir={spec.workdir!r} must be an absolute path")
        self._rootfs = resolve_rootfs(self.image)
        writable = list(BASE_WRITABLE)
        ids = self._lookup_user(spec.user)
        for extra in (wd, ids[2] if ids is not None else "/"):  # the workdir, the spec user's home
            extra = posixpath.normpath(extra)
            if extra != "/" and not any(extra == w or extra.startswith(w + "/") for w in writable):
                writable.append(extra)
        self._writable = writable
        top_writable = {w.strip("/") for w in writable if w.count("/") == 1}
        if self._rootfs is None:  # the host's own system folders
            src_root = Path("/")
            names = [n for n in HOST_ENTRIES if os.path.lexists(f"/{n}")]
        else:
            src_root = self._rootfs
            names = sorted(n for n in os.listdir(src_root)
                           if n not in SKIP_ROOTFS and n not in top_writable and not n.startswith("."))
        for n in names:
            p = src_root / n
            if p.is_symlink():
                self._links[f"/{n}"] = os.readlink(p)
            else:
                self._ro.append((f"/{n}", str(p)))
        if self._rootfs is None:
            self._masks = host_secrets()
            # the running interpreter (e.g. a pyenv or venv Python outside /usr) with its packages
            for prefix in dict.fromkeys([sys.base_prefix, sys.prefix]):
                if prefix and not prefix.startswith("/usr/") and os.path.isdir(prefix):
                    self._late_ro.append((prefix, prefix))
            bindir = os.path.dirname(sys.executable)
            if not bindir.startswith("/usr/"):
                self._extra_path = bindir + ":"
        for m, source in zip(spec.mounts, mount_sources(spec)):  # a missing source is refused, never created
            self._mounts.append((posixpath.normpath(m.target), source, not m.read_only))

    def _mount_table(self) -> list[tuple[str, str, bool]]:
        """(container path, host path, writable), longest container path first."""
        table = [(c, h, False) for c, h in self._ro + self._late_ro]
        table += [(w, str(self._host_of_writable(w)), True) for w in self._writable]
        table += self._mounts
        return sorted(table, key=lambda t: len(t[0]), reverse=True)

    def _lookup_user(self, user: str) -> tuple[int, int, str] | None:
        """(uid, gid, home) for ``user``; ``None`` for root.

        Raises:
            ConfigError: the user is unknown in the rootfs's /etc/passwd.
        """
        if user in ("", "root", "0", "0:0"):
            return None
        m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
        if m:
            uid = int(m.group(1))
            return uid, int(m.group(2) or uid), "/tmp"
        passwd = (self._rootfs or Path("/")) / "etc" / "passwd"
        with contextlib.suppress(OSError):
            for line in passwd.read_text().splitlines():
                f = line.split(":")
                if len(f) >= 6 and f[0] == user:
                    return int(f[2]), int(f[3]), f[5] or "/tmp"
        raise ConfigError(f"user={user!r} is unknown: not a number 'uid[:gid]' and not in {passwd}")

    def _stage_point(self, path: str) -> str | None:
        """``None`` when the instance's host user may search every folder above ``path``; else the
        folder to stage for it: the child, on the way to ``path``, of the deepest folder closed to
        that user (one staged folder serves every source below it, e.g. a whole rootfs).  Cached."""
        if path in self._reach_cache:
            return self._reach_cache[path]
        point: str | None = None
        p = Path(path)
        chain = [*reversed(p.parents), p]  # "/", ..., path
        for i, folder in enumerate(chain[:-1]):
            try:
                st = os.stat(folder)
            except OSError:
                continue
            if not (st.st_mode & stat.S_IXOTH or (st.st_uid == self.host_uid and st.st_mode & stat.S_IXUSR)):
                point = str(chain[i + 1])
        self._reach_cache[path] = point
        return point
