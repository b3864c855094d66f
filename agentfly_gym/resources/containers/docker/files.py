"""Files in and out of a Docker container: one tar upload (``put_archive``) or download (``get_archive``)."""

from __future__ import annotations

import io
import os
import tarfile
import time

from ....errors import ConfigError, ResourceDied, ResourceError
from .engine import docker_module

__all__ = ["DockerFiles"]


class DockerFiles:
    """The file access of :class:`~.container.DockerContainer` (a mixin of it).

    It uses the container's ``id``, ``engine`` and ``_in_thread()`` (its manager's Docker engine), ``_owner``
    (uid, gid of the spec's user), ``_fresh`` (cleared: the container's state changed), ``_require_cid()``, ``_state_sync()`` and ``_exec_async()`` (to create
    parent folders as the spec's user).
    """

    async def put_files(self, files: dict[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write files into the container with one tar upload (see :meth:`ContainerResource.put_files`).

        Files are owned by the spec's user (root when ``spec.user`` is empty).  Missing parent
        folders are created by that user where it may (one extra ``exec`` when ``spec.user`` is
        set), else by the engine (owned by root, mode 755).

        Raises:
            ConfigError: a path is not absolute or contains ``..``.
            ResourceDied: the container is gone.
            ResourceError: the engine refused the upload (e.g. a read-only mount).
        """
        data = io.BytesIO()
        now = time.time()
        with tarfile.open(fileobj=data, mode="w") as tar:
            for path, content in files.items():
                if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
                    raise ConfigError(f"file path {path!r} must be absolute and must not contain '..'")
                raw = content.encode() if isinstance(content, str) else bytes(content)
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode, info.mtime = len(raw), mode, now
                info.uid, info.gid = self._owner
                tar.addfile(info, io.BytesIO(raw))
        if self._owner != (0, 0):
            parents = sorted({p.rsplit("/", 1)[0] or "/" for p in files})
            await self._exec_async(["/bin/sh", "-c", 'mkdir -p -- "$@" 2>/dev/null; exit 0', "sh", *parents],
                                   timeout=30, workdir="/", env=None, user=None, max_output=1000, use_timeout=False)
        await self._in_thread(self._put_sync, data.getvalue())

    def _put_sync(self, payload: bytes) -> None:
        docker = docker_module()
        cid = self._require_cid()
        self._fresh = False
        try:
            self.engine.client().api.put_archive(cid, "/", payload)
        except docker.errors.NotFound as e:
            raise ResourceDied(f"{self.id}: the container is gone") from e
        except docker.errors.APIError as e:
            raise ResourceError(f"{self.id}: writing files failed: {e.explanation or e}") from e

    async def get_file(self, path: str, *, max_bytes: int = 10_000_000) -> bytes:
        """Read one file (symbolic links followed) from the container.

        Raises:
            FileNotFoundError: no such file.
            IsADirectoryError: ``path`` is a folder.
            ResourceError: the file is larger than ``max_bytes``.
            ResourceDied: the container is gone.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"file path {path!r} must be absolute")
        return await self._in_thread(self._get_sync, path, max_bytes)

    def _get_sync(self, path: str, max_bytes: int, depth: int = 0) -> bytes:
        docker = docker_module()
        cid = self._require_cid()
        api = self.engine.client().api
        try:
            stream, stat = api.get_archive(cid, path)
        except docker.errors.NotFound as e:
            if self._state_sync() is None:
                raise ResourceDied(f"{self.id}: the container is gone") from e
            raise FileNotFoundError(f"{path}: no such file in container {self.id}") from None
        except docker.errors.APIError as e:
            raise ResourceError(f"{self.id}: reading {path} failed: {e.explanation or e}") from e
        link = stat.get("linkTarget") or ""
        if link and depth < 8:
            for _ in stream:
                pass
            target = link if link.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(path), link))
            return self._get_sync(target, max_bytes, depth + 1)
        if stat.get("mode", 0) & (1 << 31):  # Go's os.ModeDir
            for _ in stream:
                pass
            raise IsADirectoryError(f"{path} is a folder in container {self.id}")
        if stat.get("size", 0) > max_bytes:
            for _ in stream:
                pass
            raise ResourceError(f"{path} is {stat['size']} bytes, more than max_bytes={max_bytes}")
        raw = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    assert f is not None
                    return f.read()
        raise FileNotFoundError(f"{path}: not a regular file in container {self.id}")
