"""Files in and out of a sandbox: ``put_files`` and ``get_file`` on the host side of its private state.

A path is resolved as the sandbox would resolve it (its symlinks followed in the container's namespace), then
mapped through the instance's mount table onto a host path.  What the sandbox's user left there is hostile
input: nothing is opened in a way that could block (``O_NONBLOCK``) or follow a link (``O_NOFOLLOW``), and what
was opened is checked with ``fstat`` before it is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from pathlib import Path

from ....errors import ConfigError, ModelOutputError

__all__ = ["SandboxFiles", "SandboxPathError"]


class SandboxPathError(ModelOutputError, ConfigError):
    """A container path given to ``put_files``/``get_file`` leads outside the writable paths of the
    sandbox (for writes), to a place not reachable from the host (e.g. ``/proc``), through a symlink
    loop, or onto a folder.  Symlinks on the way are the model's doing, so this is a
    :class:`~agentfly_gym.errors.ModelOutputError` (an environment's step turns it into a handled
    observation); a relative path, the caller's mistake, is a plain :class:`ConfigError`."""


class SandboxFiles:
    """The file access of :class:`~.container.SandboxContainer` (a mixin of it).

    It uses the container's mount plan (``_mount_table()``, ``_links``, ``_writable``, ``_mounts``,
    ``_masks``: :class:`~.mounts.SandboxMounts`), its host ids (``host_uid``, ``host_gid``) and
    ``_check_alive()``.
    """

    def _map(self, cpath: str) -> tuple[Path, bool] | None:
        for c, h, rw in self._mount_table():
            if cpath == c or cpath.startswith(c.rstrip("/") + "/"):
                rel = cpath[len(c):].lstrip("/")
                return (Path(h) / rel if rel else Path(h)), rw
        return None

    def _resolve(self, path: str) -> str:
        """``path`` with symlinks resolved as the sandbox sees them (container namespace).

        Raises:
            SandboxPathError: relative path, or a symlink loop.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"path {path!r} must be an absolute path inside the container")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        done: list[str] = []
        hops = 0
        while parts:
            p = parts.pop(0)
            if p == "..":
                if done:
                    done.pop()
                continue
            cand = "/" + "/".join(done + [p])
            target = self._links.get(cand)
            if target is None:
                mapped = self._map(cand)
                if mapped is not None and mapped[0].is_symlink():
                    target = os.readlink(mapped[0])
            if target is not None:
                hops += 1
                if hops > 40:
                    raise SandboxPathError(f"path {path!r}: too many levels of symbolic links")
                if target.startswith("/"):
                    done = []
                parts = [x for x in target.split("/") if x not in ("", ".")] + parts
                continue
            done.append(p)
        return "/" + "/".join(done)

    def _host_path(self, path: str, *, write: bool) -> Path:
        cpath = self._resolve(path)
        mapped = self._map(cpath)
        writable = sorted({*self._writable, *(c for c, _, rw in self._mounts if rw)})
        if mapped is None or (write and not mapped[1]):
            what = "written" if write else "read from the host"
            raise SandboxPathError(
                f"path {path!r} (resolved {cpath!r}) cannot be {what}: it is outside the sandbox's "
                f"{'writable paths' if write else 'filesystem'} {writable if write else ''}".rstrip())
        return mapped[0]

    async def put_files(self, files: dict[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write files into the private state (absolute container paths; parents created).

        Symlinks on the way are followed as the sandbox would follow them.  ``str`` content
        is written as UTF-8.  Whatever else than a regular file sits at a path (a FIFO, a socket,
        a symlink made meanwhile) is replaced, as ``docker cp`` replaces it; nothing is opened
        in a way that could block (``O_NONBLOCK``) or follow a link (``O_NOFOLLOW``).

        Raises:
            ConfigError: a path is relative; nothing is written then.
            SandboxPathError: a path leads outside the writable paths (``/tmp``, ``/root``, the
                workdir, read-write mounts; nothing is written then), or onto a folder.
            ResourceDied: the sandbox was released or its private folder is gone.
        """
        self._check_alive()
        plan = [(self._host_path(p, write=True), data) for p, data in files.items()]
        await asyncio.to_thread(self._write_files, plan, mode, (self.host_uid, self.host_gid))

    @staticmethod
    def _write_files(plan: list[tuple[Path, bytes | str]], mode: int, owner: tuple[int, int]) -> None:
        for host, data in plan:
            missing = [p for p in [host.parent, *host.parent.parents] if not p.exists()]
            host.parent.mkdir(parents=True, exist_ok=True)
            for p in missing:  # new folders belong to the sandbox's user, like the files
                with contextlib.suppress(OSError):
                    os.chown(p, *owner, follow_symlinks=False)
            blob = data.encode() if isinstance(data, str) else bytes(data)
            fd = SandboxFiles._open_regular_for_write(host, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                with contextlib.suppress(OSError):
                    os.fchown(f.fileno(), *owner)
                os.fchmod(f.fileno(), mode)

    @staticmethod
    def _open_regular_for_write(host: Path, mode: int) -> int:
        """A descriptor of the regular file at ``host``, emptied, or of a new one.

        The sandbox's user owns the folder and may have left anything at ``host``: a FIFO (whose
        blocking ``open`` would hang this thread until a reader comes, i.e. forever), a socket, a
        symlink.  Such an entry is removed first; the open itself never blocks and never follows
        a link, and what it opened is checked with ``fstat``.

        Raises:
            SandboxPathError: ``host`` is a folder, or the entry keeps changing under us.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for _ in range(8):
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(host)
                if stat.S_ISDIR(st.st_mode):
                    raise SandboxPathError(f"{host.name!r} is a folder in the sandbox, not a file")
                if not stat.S_ISREG(st.st_mode):
                    os.unlink(host)
            try:
                fd = os.open(host, flags, mode)
            except OSError as e:  # a symlink (ELOOP) or a FIFO without reader (ENXIO) made since the lstat
                if e.errno in (errno.ELOOP, errno.ENXIO, errno.EEXIST, errno.ENOENT):
                    continue
                if e.errno == errno.EISDIR:
                    raise SandboxPathError(f"{host.name!r} is a folder in the sandbox, not a file") from None
                raise
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, 0)
                os.set_blocking(fd, True)
                return fd
            os.close(fd)  # a FIFO with a reader: replace it
        raise SandboxPathError(f"{host.name!r} keeps changing in the sandbox; refusing to write it")

    async def get_file(self, path: str, *, max_bytes: int = 10_000_000) -> bytes:
        """Read one file visible in the sandbox (private state, mounts or the read-only root).

        The host never blocks on what the sandbox left at ``path``: the file is opened with
        ``O_NONBLOCK | O_NOFOLLOW`` and read only when ``fstat`` says it is a regular file (a FIFO,
        socket or device reads as missing).

        Raises:
            ConfigError: a relative path.
            FileNotFoundError: no such file (or it is a directory, a FIFO or another non-regular file).
            SandboxPathError: a path not reachable from the host (``/proc``, ``/dev``), one the
                sandbox's user may not read (e.g. a masked host secret), or a symlink loop.
            ConfigError: the file is larger than ``max_bytes``.
            ResourceDied: the sandbox was released or its private folder is gone.
        """
        self._check_alive()
        cpath = self._resolve(path)
        if any(cpath == c or cpath.startswith(c + "/") for c, _ in self._masks):
            raise SandboxPathError(f"path {path!r} is hidden from the sandbox")
        host = self._host_path(path, write=False)
        return await asyncio.to_thread(self._read_file, path, host, max_bytes, self.host_uid)

    @staticmethod
    def _read_file(path: str, host: Path, max_bytes: int, uid: int) -> bytes:
        try:
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"no such file in the sandbox: {path}") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink made since the path was resolved
                raise SandboxPathError(f"path {path!r} changed into a symlink while it was read") from None
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(f"not a regular file in the sandbox: {path}")
            if st.st_uid != uid and not st.st_mode & stat.S_IROTH:  # what the sandbox's user could read
                raise SandboxPathError(f"path {path!r} is not readable inside the sandbox")
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ConfigError(f"{path} is larger than max_bytes={max_bytes}")
        return data
