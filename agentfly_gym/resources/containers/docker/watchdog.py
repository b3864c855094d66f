"""The Docker backend's disk watchdog, for engines whose storage driver cannot limit a container's
disk (``storage_opt size``): a host thread sums each watched container's writable layer every
:data:`DISK_POLL` seconds and kills the container once it exceeds ``spec.disk``.

One :class:`DiskWatchdog` per :class:`~.engine.DockerEngine` (so per resource manager); its thread
starts with the first container it watches and stops when the engine closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .container import DockerContainer
    from .engine import DockerEngine

__all__ = ["DISK_POLL", "DiskWatchdog"]

log = logging.getLogger(__name__)

DISK_POLL = 1.0
"""Seconds between two measurements of a container's writable layer by the disk watchdog."""


def _tree_bytes(root: str, stop_at: int) -> int:
    """Bytes allocated below ``root`` (``st_blocks * 512``, hard links once), stopping past ``stop_at``."""
    total, seen = 0, set()
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
        if total > stop_at:
            break
    return total


class DiskWatchdog:
    """Holds the disk limit of the containers it watches (engines without ``storage_opt size``).

    Args:
        engine: the Docker engine access whose client kills a container past its limit.
    """

    def __init__(self, engine: DockerEngine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._watched: dict[str, DockerContainer] = {}  # container id -> instance whose disk limit is held here
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, box: DockerContainer) -> None:
        """Hold ``box``'s disk limit from the host until its container is replaced or removed."""
        with self._lock:
            if self._stop.is_set():
                return
            if box.container_id:
                self._watched[box.container_id] = box
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="afg-docker-disk", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the thread (within one :data:`DISK_POLL`); idempotent."""
        self._stop.set()
        with self._lock:
            self._watched.clear()

    def _loop(self) -> None:
        while not self._stop.wait(DISK_POLL):
            with self._lock:
                items = list(self._watched.items())
            for cid, box in items:
                if box.container_id != cid or box.upper_dir is None or box.spec.disk is None:
                    with self._lock:
                        self._watched.pop(cid, None)
                    continue
                used = _tree_bytes(box.upper_dir, box.spec.disk)
                if used > box.spec.disk:
                    reason = (f"its disk limit of {box.spec.disk} bytes was exceeded "
                              f"(writable layer at {used} bytes or more)")
                    box.mark_dead(reason)
                    log.warning("%s: %s; killing the container", box.id, reason)
                    with contextlib.suppress(Exception):
                        self._engine.client().api.kill(cid)
                    with self._lock:
                        self._watched.pop(cid, None)
