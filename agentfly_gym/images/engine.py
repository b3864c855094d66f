"""What building any image needs: the Docker engine's client, running a build step with its output logged,
tagging, and the error a failed build raises."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from typing import Any

from ..errors import AgentFlyError, ResourceUnavailable

__all__ = ["ImageBuildError", "Progress", "docker_client", "image_exists", "run_logged", "say", "tag_latest"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class ImageBuildError(AgentFlyError):
    """An image could not be built; the message names the step and ends with the tail of its log."""


def say(progress: Progress | None, msg: str) -> None:
    """Pass ``msg`` to ``progress``, or log it at INFO when there is none."""
    if progress is not None:
        progress(msg)
    else:
        log.info("%s", msg)


def docker_client() -> Any:
    """A docker-py client of the local engine (10-minute timeout for builds).

    Raises:
        ResourceUnavailable: docker-py is not installed or no engine answers.
    """
    try:
        import docker
    except ImportError as e:  # pragma: no cover - depends on installation
        raise ResourceUnavailable("building images needs docker-py: pip install 'agentfly-gym[docker]'") from e
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:
        raise ResourceUnavailable(
            f"no Docker engine answers ({type(e).__name__}: {e}); start one (scripts/docker-engine.sh)") from e
    return client


def image_exists(name: str, client: Any = None) -> bool:
    """Whether the local engine has image ``name`` (``repo:tag`` or id)."""
    import docker

    client = client or docker_client()
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def run_logged(cmd: list[str], progress: Progress | None, what: str, **kw: Any) -> None:
    """Run ``cmd``, forwarding its output lines to ``progress``; raise ImageBuildError on failure."""
    tail: list[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", **kw)
    except OSError as e:
        raise ImageBuildError(f"{what}: cannot run {cmd[0]!r}: {e}") from e
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-30:]
            say(progress, f"  {line}")
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        raise ImageBuildError(f"{what} failed (exit {rc}):\n" + "\n".join(tail))


def tag_latest(client: Any, tag: str, repo: str) -> None:
    """Point ``<repo>:latest`` at ``tag`` (best effort: a failure is logged)."""
    try:
        client.images.get(tag).tag(repo, "latest")
    except Exception:  # pragma: no cover - best effort
        log.warning("could not tag %s as %s:latest", tag, repo, exc_info=True)
