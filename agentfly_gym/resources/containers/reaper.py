"""Reaping what dead managers left behind on both container backends (``agentfly-gym resources gc``):
Docker containers labelled ``agentfly=1`` and sandbox folders, with their processes, cgroups and disk mounts.

Which owner is dead is :func:`.ownership.owner_dead`'s call.  This module sits above both backends (it
imports them); the backends import only :mod:`.ownership`, so neither imports the reaper.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

from ...errors import ResourceUnavailable
from .ownership import LABEL, owner_dead

__all__ = ["reap_all", "reap_docker_orphans", "reap_sandbox_orphans"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- Docker
def reap_docker_orphans(manager_id: str | None = None, *, older_than: float = 0, dry_run: bool = False) -> list[str]:
    """Remove containers labelled ``agentfly=1`` whose manager is gone (or is ``manager_id``).

    A container is an orphan when its owning process (label ``agentfly.pid``, else the pid embedded
    in a manager id ``"afg-<pid>-<hex>"``) no longer exists on this host or its pid now belongs to
    a process started later.  Containers of live processes, of other hosts sharing the engine, and
    of custom manager ids without a pid are left alone unless ``manager_id`` names them.

    Args:
        manager_id: remove this manager's containers (alive or not) instead of the dead ones.
        older_than: only containers created at least this many seconds ago.
        dry_run: list what would be removed without removing it.

    Returns:
        The 12-hex-digit ids of the containers removed (or that would be).

    Raises:
        ResourceUnavailable: no Docker engine answers.
    """
    from .docker.engine import DockerEngine, docker_module

    docker = docker_module()
    engine = DockerEngine()
    try:
        return _reap_docker_orphans(engine.client().api, docker, manager_id, older_than=older_than, dry_run=dry_run)
    except docker.errors.DockerException as e:
        raise ResourceUnavailable(f"no Docker engine answers: {e}") from e
    finally:
        engine.close()


def _reap_docker_orphans(api: Any, docker: Any, manager_id: str | None, *, older_than: float,
                         dry_run: bool) -> list[str]:
    found = api.containers(all=True, filters={"label": f"{LABEL}=1"})
    host = socket.gethostname()
    now = time.time()
    removed: list[str] = []
    for c in found:
        labels = c.get("Labels") or {}
        if older_than and now - float(c.get("Created", now)) < older_than:
            continue
        if manager_id is not None:
            if labels.get(f"{LABEL}.manager") != manager_id:
                continue
        elif not owner_dead(labels, host):
            continue
        cid = c["Id"][:12]
        if not dry_run:
            try:
                api.remove_container(c["Id"], force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                log.warning("removing orphan container %s failed: %s", cid, e)
                continue
        removed.append(cid)
    if removed:
        log.info("%s %d orphan container(s): %s", "would remove" if dry_run else "removed", len(removed), removed)
    return removed


# ------------------------------------------------------------------------------- the sandbox
def _marker_labels(marker: dict[str, Any]) -> dict[str, str]:
    """The ownership labels of a sandbox marker (its owner fields fill in labels it lacks)."""
    labels = {str(k): str(v) for k, v in (marker.get("labels") or {}).items()}
    if not labels.get(f"{LABEL}.pid") and isinstance(marker.get("owner_pid"), int):
        labels[f"{LABEL}.pid"] = str(marker["owner_pid"])
        labels[f"{LABEL}.pid_start"] = str(marker.get("owner_start") or "")
    return labels


def _kill_host_user(uid: Any) -> None:
    """SIGKILL every process of a sandbox's own host uid (never root or an ordinary account)."""
    from .sandbox.container import SANDBOX_UID_BASE

    if not isinstance(uid, int) or uid < SANDBOX_UID_BASE:
        return
    for _ in range(3):
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if d.stat().st_uid == uid:
                    os.kill(int(d.name), signal.SIGKILL)


def reap_sandbox_orphans(manager_id: str | None = None, *, root: str | os.PathLike | None = None,
                         older_than: float = 0, dry_run: bool = False) -> list[str]:
    """Remove sandboxes left behind: kill their processes, remove their cgroups, unmount their
    disk volume and remove their folders.

    Args:
        manager_id: reap every sandbox labelled with this manager id (do not pass a live
            manager's id); ``None`` reaps those whose owner is dead (:func:`owner_dead`), folders
            left without a marker by a start that died (after 10 minutes), with their cgroups.
        root: the sandbox root (default :func:`sandbox_root`).
        older_than: only sandboxes created at least this many seconds ago.
        dry_run: list what would be removed without removing anything.

    Returns:
        The names (``sbx-<hex>``) of the sandboxes removed.  An ``agentfly-gym`` cgroup whose
        folder is gone is left alone: it may belong to a live sandbox under another root (an idle
        sandbox's cgroup is empty between execs), which removing it would break.
    """
    from .sandbox.cgroups import CGROUP_PARENT, instance_cgroups, kill_cgroups, remove_cgroups
    from .sandbox.container import MARKER_NAME, sandbox_root
    from .sandbox.volume import unmount_under

    base = Path(root) if root is not None else sandbox_root()
    host = socket.gethostname()
    reaped: list[str] = []
    if base.is_dir():
        for d in sorted(base.iterdir()):
            marker_file = d / MARKER_NAME
            if not d.is_dir() or not d.name.startswith("sbx-"):
                continue
            try:
                marker = json.loads(marker_file.read_text())
            except (OSError, ValueError):
                # a folder whose start died before the marker was written; reap when old
                if manager_id is None and time.time() - d.stat().st_mtime > max(600, older_than):
                    if dry_run:
                        reaped.append(d.name)
                        continue
                    if not remove_cgroups(instance_cgroups(d.name)):
                        continue  # still busy: the folder stays, found again by name by the next gc
                    unmount_under(d)
                    shutil.rmtree(d, ignore_errors=True)
                    reaped.append(d.name)
                continue
            if manager_id is not None:
                if marker.get("labels", {}).get("agentfly.manager") != manager_id:
                    continue
            elif not owner_dead(_marker_labels(marker), host):
                continue
            if older_than and time.time() - float(marker.get("created") or 0) < older_than:
                continue
            if dry_run:
                reaped.append(d.name)
                continue
            cgroups = [c for c in marker.get("cgroups", []) if CGROUP_PARENT in c]
            cgroups += [c for c in instance_cgroups(d.name) if c not in cgroups]
            kill_cgroups(cgroups)
            _kill_host_user(marker.get("host_uid"))
            if not remove_cgroups(cgroups):  # still busy: the folder and its marker stay for the next gc
                log.warning("sandbox %s: a cgroup is still busy; left for the next gc", d.name)
                continue
            unmount_under(d)
            shutil.rmtree(d, ignore_errors=True)
            reaped.append(d.name)
    return reaped


# ------------------------------------------------------------------------------- both
def reap_all(manager_id: str | None = None, *, older_than: float = 0,
             dry_run: bool = False) -> tuple[list[str] | None, list[str]]:
    """Reap every backend's leftovers of dead managers (or of ``manager_id``).

    Docker: containers labelled ``agentfly=1`` whose owner process is gone
    (:func:`reap_docker_orphans`).  Sandbox: private folders whose owner process is
    gone, with their processes, cgroups and loop-mounted disk (:func:`reap_sandbox_orphans`).

    Returns:
        (Docker container ids, or ``None`` when no Docker engine answers; sandbox names).
    """
    containers: list[str] | None = None
    try:
        from .docker import docker_available

        if docker_available(refresh=True):
            containers = reap_docker_orphans(manager_id, older_than=older_than, dry_run=dry_run)
    except ResourceUnavailable:
        containers = None
    sandboxes = reap_sandbox_orphans(manager_id, older_than=older_than, dry_run=dry_run)
    return containers, sandboxes
