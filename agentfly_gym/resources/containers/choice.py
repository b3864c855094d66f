"""Backend entry for ``ContainerSpec``: picks Docker or the daemon-less sandbox.

``spec.backend`` decides: ``"docker"`` -> :class:`~.docker_backend.DockerContainer`,
``"sandbox"`` -> ``agentfly_gym.resources.backends.sandbox_backend.create_sandbox`` (bubblewrap),
``"auto"`` -> Docker when an engine answers a ping (probed once per process and cached) and the
image is not a folder on disk (a folder is a sandbox root file system), else the sandbox.
Both backends are imported only when used.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
import os
import threading
from typing import TYPE_CHECKING

from ...errors import ConfigError, ResourceUnavailable

if TYPE_CHECKING:
    from .api import ContainerResource
    from ..manager import ResourceManager
    from ..spec import ContainerSpec

__all__ = ["create", "gc_main", "reap_all", "resolve_backend"]

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


def reap_all(manager_id: str | None = None, *, older_than: float = 0,
             dry_run: bool = False) -> tuple[list[str] | None, list[str]]:
    """Reap every backend's leftovers of dead managers (or of ``manager_id``).

    Docker: containers labelled ``agentfly=1`` whose owner process is gone
    (:func:`~.docker_backend.reap_orphans`).  Sandbox: private folders whose owner process is
    gone, with their processes, cgroups and loop-mounted disk (:func:`~.sandbox_backend.reap_sandbox_orphans`).

    Returns:
        (Docker container ids, or ``None`` when no Docker engine answers; sandbox names).
    """
    from .sandbox.container import reap_sandbox_orphans

    containers: list[str] | None = None
    try:
        from .docker import docker_available, reap_orphans

        if docker_available(refresh=True):
            containers = reap_orphans(manager_id, older_than=older_than, dry_run=dry_run)
    except ResourceUnavailable:
        containers = None
    sandboxes = reap_sandbox_orphans(manager_id, older_than=older_than, dry_run=dry_run)
    return containers, sandboxes


def gc_main(args: Sequence[str] | None = None) -> int:
    """``agentfly-gym resources gc [--manager ID] [--older-than SECONDS] [--dry-run]``.

    Prints one removed Docker container id or sandbox name per line, then a summary on stderr.
    Returns 0 (a missing Docker engine is reported, not an error: sandboxes are still reaped).
    """
    parser = argparse.ArgumentParser(
        prog="agentfly-gym resources gc",
        description="Remove the containers and sandboxes (folders, processes, cgroups, disk mounts) of dead managers.")
    parser.add_argument("--manager", default=None, help="remove this manager id's resources, alive or not")
    parser.add_argument("--older-than", type=float, default=0.0, metavar="SECONDS",
                        help="only resources created at least this long ago")
    parser.add_argument("--dry-run", action="store_true", help="list, do not remove")
    ns = parser.parse_args(list(args) if args is not None else None)
    containers, sandboxes = reap_all(ns.manager, older_than=ns.older_than, dry_run=ns.dry_run)
    for name in [*(containers or []), *sandboxes]:
        print(name)
    verb = "would remove" if ns.dry_run else "removed"
    docker_part = f"{len(containers)} container(s)" if containers is not None else "no Docker engine answers"
    print(f"{verb} {docker_part} and {len(sandboxes)} sandbox(es)", file=sys.stderr)
    return 0
