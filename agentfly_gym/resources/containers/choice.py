"""Backend entry for ``ContainerSpec``: picks Docker or the daemon-less sandbox.

``spec.backend`` decides: ``"docker"`` -> :class:`~.docker_backend.DockerContainer`,
``"sandbox"`` -> ``agentfly_gym.resources.backends.sandbox_backend.create_sandbox`` (bubblewrap),
``"auto"`` -> Docker when an engine answers a ping (probed once per process and cached) and the
image is not a folder on disk (a folder is a sandbox root file system), else the sandbox.
Both backends are imported only when used.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import TYPE_CHECKING

from ...errors import ConfigError, ResourceUnavailable

if TYPE_CHECKING:
    from .api import ContainerResource
    from ..manager import ResourceManager
    from ..spec import ContainerSpec

__all__ = ["create", "resolve_backend"]

log = logging.getLogger(__name__)

_SANDBOX = "agentfly_gym.resources.containers.sandbox.container:create_sandbox"
_DOCKER = "agentfly_gym.resources.containers.docker:create_docker"
_auto_lock = threading.Lock()
_auto_choice: str | None = None


def _auto() -> str:
    """``"docker"`` if an engine answers, else ``"sandbox"``; decided once per process, logged."""
    global _auto_choice
    with _auto_lock:
        if _auto_choice is None:
            from .docker import docker_available

            _auto_choice = "docker" if docker_available() else "sandbox"
            log.info("container backend 'auto' -> %r (%s)", _auto_choice,
                     "a Docker engine answers" if _auto_choice == "docker" else "no Docker engine answers")
        return _auto_choice


def resolve_backend(spec: ContainerSpec) -> str:
    """The backend that will run ``spec``: ``"docker"`` or ``"sandbox"``.

    ``"auto"`` resolves to ``"sandbox"`` when ``spec.image`` names an existing folder (a root file
    system), else to ``"docker"`` when a Docker engine answers (probed once, blocking up to ~3 s),
    else to ``"sandbox"``.
    """
    if spec.backend in ("docker", "sandbox"):
        return spec.backend
    if spec.backend != "auto":
        raise ConfigError(f"backend={spec.backend!r} is not one of 'auto', 'docker', 'sandbox'")
    if os.path.isdir(spec.image):
        return "sandbox"
    return _auto()


def create(spec: ContainerSpec, manager: ResourceManager) -> ContainerResource:
    """An unstarted container resource for ``spec`` on the backend :func:`resolve_backend` picks.

    Raises:
        ResourceUnavailable: that backend cannot run here (docker-py or the sandbox module missing).
    """
    backend = resolve_backend(spec)
    path = _DOCKER if backend == "docker" else _SANDBOX
    mod_name, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise ResourceUnavailable(f"the {backend!r} container backend is not available: {e}") from e
    return getattr(mod, attr)(spec, manager)
