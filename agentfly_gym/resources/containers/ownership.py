"""Ownership of containers and sandboxes: the labels that name their owner and whether that owner is
alive, for both backends.  Reaping what dead owners left behind is :mod:`.reaper`
(``agentfly-gym resources gc``).

Every resource a :class:`~agentfly_gym.resources.ResourceManager` builds gets the labels of
:func:`owner_labels` (computed once per manager) plus ``agentfly.pool=<spec key>``:

* ``agentfly=1``; ``agentfly.manager``: the manager id (``afg-<pid>-<hex>`` by default);
* ``agentfly.pid``, ``agentfly.pid_start`` (the owner process and its start time, so a reused pid
  is not taken for the owner) and ``agentfly.host`` (never judge a process of another host).

Docker stores them as container labels; the sandbox in the marker file of its private folder
(``agentfly-sandbox.json``).  :func:`owner_dead` reads them the same way for both, and
:func:`.reaper.reap_all` removes what :func:`owner_dead` (or a ``manager_id``) selects on both backends.
"""

from __future__ import annotations

import os
import re
import socket


__all__ = ["LABEL", "owner_dead", "owner_labels", "proc_start"]


LABEL = "agentfly"
"""Prefix of every ownership label; ``agentfly=1`` marks a resource of this library."""

_MANAGER_PID = re.compile(r"^afg-(\d+)-[0-9a-f]+$")


def proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
        return data.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_labels(manager_id: str) -> dict[str, str]:
    """The labels naming this process (and ``manager_id``) as the owner of a resource."""
    pid = os.getpid()
    return {
        LABEL: "1",
        f"{LABEL}.manager": manager_id,
        f"{LABEL}.pid": str(pid),
        f"{LABEL}.pid_start": proc_start(pid) or "",
        f"{LABEL}.host": socket.gethostname(),
    }


def owner_dead(labels: dict[str, str], host: str | None = None) -> bool:
    """Whether the process that labelled a resource is gone.

    The owner is ``agentfly.pid`` (else the pid in a manager id ``"afg-<pid>-<hex>"``); it is dead
    when no such process exists or the pid now belongs to a process started later than
    ``agentfly.pid_start``.  Never guesses: a resource of another host (``agentfly.host`` is not
    ``host``, default this host) or without any pid counts as alive.
    """
    host = host if host is not None else socket.gethostname()
    if labels.get(f"{LABEL}.host", host) != host:
        return False
    pid_s = labels.get(f"{LABEL}.pid")
    if not pid_s:
        m = _MANAGER_PID.match(labels.get(f"{LABEL}.manager", ""))
        if not m:
            return False  # a custom manager id with no pid: only reaped by manager_id
        pid_s = m.group(1)
    try:
        pid = int(pid_s)
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OSError):
        return False
    start = labels.get(f"{LABEL}.pid_start")
    return bool(start) and proc_start(pid) not in (None, start)  # the pid was reused by another process
