"""The Docker backend's disk watchdog, for engines whose storage driver cannot limit a container's
disk (``storage_opt size``): a host thread sums each watched container's writable layer every
:data:`DISK_POLL` seconds and kills the container once it exceeds ``spec.disk``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from .engine import get_client

if TYPE_CHECKING:
    from .container import DockerContainer

__all__ = ["DISK_POLL", "watch"]

log = logging.getLogger(__name__)

DISK_POLL = 1.0
"""Seconds between two measurements of a container's writable layer by the disk watchdog."""

_watch_lock = threading.Lock()
_watched: dict[str, DockerContainer] = {}  # container id -> instance whose disk limit the watchdog holds
_watch_thread: threading.Thread | None = None


def _forget_parent_watch() -> None:
    """In a forked child: the parent's watchdog thread does not exist here and its containers are the parent's."""
    global _watch_lock, _watched, _watch_thread
    _watch_lock = threading.Lock()
    _watched = {}
    _watch_thread = None


os.register_at_fork(after_in_child=_forget_parent_watch)


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


def watch(box: DockerContainer) -> None:
    """Hold ``box``'s disk limit from the host (engines without ``storage_opt size``)."""
    global _watch_thread
    with _watch_lock:
        if box.container_id:
            _watched[box.container_id] = box
        if _watch_thread is None or not _watch_thread.is_alive():
            _watch_thread = threading.Thread(target=_watch_loop, name="afg-docker-disk", daemon=True)
            _watch_thread.start()


def _watch_loop() -> None:
    while True:
        time.sleep(DISK_POLL)
        with _watch_lock:
            items = list(_watched.items())
        for cid, box in items:
            if box.container_id != cid or box._upper_dir is None or box.spec.disk is None:
                with _watch_lock:
                    _watched.pop(cid, None)
                continue
            used = _tree_bytes(box._upper_dir, box.spec.disk)
            if used > box.spec.disk:
                box._death_reason = (f"its disk limit of {box.spec.disk} bytes was exceeded "
                                     f"(writable layer at {used} bytes or more)")
                log.warning("%s: %s; killing the container", box.id, box._death_reason)
                with contextlib.suppress(Exception):
                    get_client().api.kill(cid)
                with _watch_lock:
                    _watched.pop(cid, None)
