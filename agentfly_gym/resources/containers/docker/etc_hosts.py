"""The ``/etc/hosts`` of a Docker container without a network: a packaged file, bound read-only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ....data.paths import cache_dir
from ...spec import ContainerSpec
from .engine import docker_module

__all__ = ["HOSTS_FILE", "hosts_mount", "hosts_source"]

HOSTS_FILE = os.path.join(os.path.dirname(__file__), "hosts")
"""The ``/etc/hosts`` of a container without a network (bound read-only): the engine's own for ``--network none``
(``localhost`` and the IPv6 names).  Such a container is made with networking disabled, not on the ``none``
network: the same private network namespace holding only ``lo``, but no network sandbox for the engine to build,
which halved the engine's time per start (32 concurrent starts: 2.1 s against 3.7 s, run side by side); the engine
then leaves ``/etc/hosts`` empty, so ``localhost`` would not resolve."""


def hosts_source() -> str:
    """:data:`HOSTS_FILE`, or, where it is not readable by everyone (a checkout made under ``umask 077``), a copy
    that is, in the cache (``$AGENTFLY_GYM_CACHE/docker/``): a bound file keeps its host mode, and a container's
    non-root user must read it."""
    try:
        if os.stat(HOSTS_FILE).st_mode & 0o444 == 0o444:
            return HOSTS_FILE
        data = Path(HOSTS_FILE).read_bytes()
    except OSError:
        return HOSTS_FILE  # missing or unreadable: the engine's refusal says so
    copy = cache_dir("docker", f"hosts-{hashlib.sha256(data).hexdigest()[:16]}")
    try:
        if not copy.is_file() or copy.stat().st_mode & 0o444 != 0o444:
            copy.parent.mkdir(parents=True, exist_ok=True)
            tmp = copy.with_name(f"{copy.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            os.replace(tmp, copy)
    except OSError:
        return HOSTS_FILE
    return str(copy)


def hosts_mount(spec: ContainerSpec, source: str) -> list[Any]:
    """The read-only bind of ``source`` (:func:`hosts_source`) for a spec without a network that does not mount
    ``/etc/hosts``."""
    if spec.network or any(m.target.rstrip("/") == "/etc/hosts" for m in spec.mounts):
        return []
    return [docker_module().types.Mount(target="/etc/hosts", source=source, type="bind", read_only=True)]
