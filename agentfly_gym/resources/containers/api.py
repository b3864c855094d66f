"""The container API shared by every container backend (Docker, the daemon-less sandbox).

Tools and environments talk to a :class:`ContainerResource` only through this API, so a
task runs unchanged on either backend; the backend is chosen by ``ContainerSpec.backend``.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from typing import Any

from ..base import Resource
from ...errors import ConfigError, ResourceDied

__all__ = ["ContainerResource", "ExecResult", "DEFAULT_MAX_OUTPUT", "mount_sources"]

DEFAULT_MAX_OUTPUT = 100_000  # characters of combined stdout+stderr kept per exec


@dataclasses.dataclass
class ExecResult:
    """The outcome of one command run in a container.

    Attributes:
        exit_code: the command's exit status; -1 when it was killed on timeout.
        output: stdout and stderr interleaved as text (UTF-8, invalid bytes replaced), at most
            ``max_output`` characters (the head and tail are kept, with a marker in between).
        timed_out: the command ran past its timeout and was killed (not merely abandoned).
        truncated: output was cut to ``max_output``.
        duration: seconds, wall clock.
    """

    exit_code: int
    output: str
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class ContainerResource(Resource, abc.ABC):
    """A live container (or sandbox) built from a :class:`~agentfly_gym.resources.spec.ContainerSpec`.

    ``backend_name`` is ``"docker"`` or ``"sandbox"``.  ``reset()`` restores the state the
    container had right after start (see the backend for how) and kills stray processes.

    Reset contract, the same on every backend: after ``reset()`` the instance is as it was right
    after ``start()``:

    * every process started after ``start()`` (by ``exec`` or its children) is gone;
    * the whole writable file system is restored, whatever was written where (``/root``, ``/etc``,
      ``/usr/local``, site-packages, ``/tmp``, the workdir): Docker restarts the container with its
      writable layer emptied, or replaces it with a fresh one of the same image; the sandbox, whose only writable places are its private state,
      restores that state from the snapshot taken at start.  Read-write ``spec.mounts`` are shared
      host folders and are not restored.

    Pools also call ``park()`` when an instance goes idle, so no process of the last rollout keeps
    running (or burning a core) while it waits for the next.
    """

    backend_name: str = "abstract"
    published_ports: dict[int, tuple[str, int]]
    """``spec.ports`` -> ``(host address, host port)`` of the live container (empty until started)."""

    def endpoint(self, port: int) -> tuple[str, int]:
        """Where the host reaches container port ``port`` (one of ``spec.ports``): ``(host, port)``.

        The answer changes when ``reset()`` replaces the container; ask again after each acquire.

        Raises:
            ConfigError: ``port`` is not in ``spec.ports``.
            ResourceDied: the container is not running (no published port now).
        """
        ports = getattr(self.spec, "ports", ())
        if port not in ports:
            raise ConfigError(f"port {port!r} is not published; spec.ports={ports!r}")
        found = getattr(self, "published_ports", {}).get(port)
        if found is None:
            raise ResourceDied(f"{self.id}: container port {port} is not published now (not running)")
        return found

    @abc.abstractmethod
    async def exec(self, cmd: str | list[str], *, timeout: float = 60.0, workdir: str | None = None,
                   env: dict[str, str] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                   user: str | None = None) -> ExecResult:
        """Run ``cmd`` (a shell string run by ``/bin/sh -c``, or an argv list) and wait for it.

        Args:
            timeout: seconds; past it the command (its whole process group) is killed and
                ``timed_out`` is set.
            workdir: working directory (default ``spec.workdir``).
            env: extra environment variables.
            max_output: characters of output kept.
            user: run as this user instead of the spec's.

        Raises:
            ResourceDied: the container is gone.
        """

    @abc.abstractmethod
    async def put_files(self, files: dict[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write files (absolute paths inside the container; parents created).

        Raises:
            ResourceDied: the container is gone.
        """

    @abc.abstractmethod
    async def get_file(self, path: str, *, max_bytes: int = 10_000_000) -> bytes:
        """Read one file from the container.

        Raises:
            FileNotFoundError: no such file.
            ResourceDied: the container is gone.
        """


def mount_sources(spec: Any) -> list[str]:
    """The absolute host source of each of ``spec.mounts`` (a ContainerSpec); both backends check with it.

    Raises:
        ConfigError: a source does not exist on the host, or a target is not an absolute path.
    """
    out = []
    for m in spec.mounts:
        if not m.target.startswith("/"):
            raise ConfigError(f"mount {m!r}: the target must be an absolute path in the container")
        if not os.path.exists(m.source):
            raise ConfigError(f"mount {m!r}: the source {m.source!r} does not exist on the host (it is not created)")
        out.append(os.path.abspath(m.source))
    return out
