"""Which container backend runs a ``ContainerSpec(backend="auto")``: the resolver registered for the
``"container"`` kind in :mod:`agentfly_gym.resources.backends`.

``"auto"`` -> ``"sandbox"`` when the spec's image only makes sense there (``"host"`` or a rootfs
folder), else ``"docker"`` when a Docker engine answers a ping (probed once per process, cached,
logged), else ``"sandbox"``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ...errors import ConfigError

if TYPE_CHECKING:
    from ..spec import ContainerSpec

__all__ = ["resolve_backend"]

log = logging.getLogger(__name__)

def _auto() -> str:
    """``"docker"`` if an engine answers (the probe is cached per process), else ``"sandbox"``."""
    from .docker import docker_available

    choice = "docker" if docker_available() else "sandbox"
    log.debug("container backend 'auto' -> %r (%s)", choice,
              "a Docker engine answers" if choice == "docker" else "no Docker engine answers")
    return choice


def resolve_backend(spec: ContainerSpec) -> str:
    """The backend that will run ``spec``: ``spec.backend`` unless it is ``"auto"``; then
    ``"sandbox"`` when ``spec.image`` is ``"host"`` or an existing folder (a root file system),
    else ``"docker"`` when a Docker engine answers (probed once, blocking up to ~3 s), else
    ``"sandbox"``.

    Raises:
        ConfigError: ``spec.backend`` is not a string.
    """
    if not isinstance(spec.backend, str):
        raise ConfigError(f"backend={spec.backend!r} must be a backend name or 'auto'")
    if spec.backend != "auto":
        return spec.backend
    if spec.image == "host" or os.path.isdir(spec.image):
        return "sandbox"
    return _auto()
