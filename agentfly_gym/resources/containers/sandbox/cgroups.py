"""The sandbox's resource limits: one cgroup (v2, or v1 per controller) per instance, or rlimits.

:func:`detect_limit_mode` picks the best mode here; :func:`make_cgroups` creates an instance's
cgroup(s) with ``spec.memory``, ``spec.pids`` and ``spec.cpus``; :func:`kill_cgroups` and
:func:`remove_cgroups` end them (also for :mod:`..ownership`'s reaping).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ....errors import ConfigError

if TYPE_CHECKING:
    from ...spec import ContainerSpec

__all__ = [
    "CGROUP_FS", "CGROUP_PARENT", "LIMIT_MODES", "SANDBOX_LIMITS_ENV", "cgroup1_dir", "cgroup_pids",
    "detect_limit_mode", "instance_cgroups", "kill_cgroups", "make_cgroups", "remove_cgroups",
]

SANDBOX_LIMITS_ENV = "AGENTFLY_GYM_SANDBOX_LIMITS"
"""Environment variable: force a limit mode (``cgroup2``, ``cgroup1``, ``rlimit``); default ``auto``."""

CGROUP_PARENT = "agentfly-gym"
"""Name of the cgroup folder (in each hierarchy) that holds every instance's cgroup."""
CGROUP_FS = Path("/sys/fs/cgroup")
LIMIT_MODES = ("cgroup2", "cgroup1", "rlimit")


def _cgroup2_usable() -> bool:
    return (CGROUP_FS / "cgroup.controllers").is_file() and os.access(CGROUP_FS, os.W_OK)


def _own_cgroup_v1(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller`` (from /proc/self/cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            return parts[2]
    return None


def cgroup1_dir(controller: str) -> Path | None:
    own = _own_cgroup_v1(controller)
    mount = CGROUP_FS / controller
    if own is None or not (mount / "cgroup.procs").is_file():
        return None
    base = mount / own.lstrip("/")
    return base if base.is_dir() and os.access(base, os.W_OK) else None


def detect_limit_mode() -> str:
    """The best limit mode available here: ``"cgroup2"``, ``"cgroup1"`` or ``"rlimit"``.

    ``$AGENTFLY_GYM_SANDBOX_LIMITS`` forces one.  cgroup v2 needs a writable
    ``/sys/fs/cgroup`` with ``cgroup.controllers``; cgroup v1 needs writable memory and pids
    hierarchies.  The choice is confirmed when an instance starts: if its cgroup cannot be
    made, the instance falls back to the next mode.

    Raises:
        ConfigError: the environment variable names an unknown mode.
    """
    forced = os.environ.get(SANDBOX_LIMITS_ENV, "auto")
    if forced != "auto":
        if forced not in LIMIT_MODES:
            raise ConfigError(f"{SANDBOX_LIMITS_ENV}={forced!r} is not one of 'auto', {', '.join(map(repr, LIMIT_MODES))}")
        return forced
    if _cgroup2_usable():
        return "cgroup2"
    if cgroup1_dir("memory") is not None and cgroup1_dir("pids") is not None:
        return "cgroup1"
    return "rlimit"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def instance_cgroups(name: str) -> list[str]:
    """The existing cgroup folders of the instance ``name`` (``sbx-<hex>``), in every hierarchy.

    Found by name, so a start that died between :func:`make_cgroups` and writing its marker
    leaves nothing that the reaper misses.
    """
    parents = [CGROUP_FS / CGROUP_PARENT] + [b / CGROUP_PARENT for b in
                                              (cgroup1_dir(c) for c in ("memory", "pids", "cpu")) if b is not None]
    return [str(p / name) for p in parents if (p / name).is_dir()]


def cgroup_pids(dirs: list[str]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
    return pids


def kill_cgroups(dirs: list[str], *, tries: int = 50) -> bool:
    """SIGKILL every process in the cgroups ``dirs`` until they are empty; True when empty."""
    for d in dirs:  # cgroup v2 >= 5.14 kills the whole subtree atomically
        kill_file = Path(d, "cgroup.kill")
        if kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
    for _ in range(tries):
        pids = cgroup_pids(dirs)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return not cgroup_pids(dirs)


def remove_cgroups(dirs: list[str]) -> bool:
    """Kill the processes of the cgroups ``dirs`` and remove them; True when every one is gone (False: one was
    still busy after about a second, e.g. a process stuck in I/O; the caller keeps what finds it again)."""
    if not dirs:
        return True
    kill_cgroups(dirs)
    for d in dirs:
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the last killed process is reaped
                time.sleep(0.02)
    return not any(os.path.isdir(d) for d in dirs)


def make_cgroups(mode: str, name: str, spec: ContainerSpec) -> tuple[list[str], dict[str, bool]]:
    """Create the instance's cgroup(s) and write the limits; returns (dirs, enforced).

    Raises:
        OSError: the cgroup cannot be made here (the caller falls back).
    """
    dirs: list[str] = []
    enforced = {"memory": False, "pids": False, "cpu": False}
    try:
        if mode == "cgroup2":
            parent = CGROUP_FS / CGROUP_PARENT
            parent.mkdir(exist_ok=True)
            for ctl in ("memory", "pids", "cpu"):
                for d in (CGROUP_FS, parent):
                    with contextlib.suppress(OSError):
                        _write(d / "cgroup.subtree_control", f"+{ctl}")
            inst = parent / name
            inst.mkdir()
            dirs.append(str(inst))
            if not (inst / "memory.max").exists() or not (inst / "pids.max").exists():
                raise OSError("the memory and pids controllers are not enabled for agentfly-gym cgroups")
            if spec.memory:
                _write(inst / "memory.max", str(spec.memory))
                with contextlib.suppress(OSError):
                    _write(inst / "memory.swap.max", "0")
                enforced["memory"] = True
            _write(inst / "pids.max", str(spec.pids))
            enforced["pids"] = True
            if (inst / "cpu.max").exists():
                _write(inst / "cpu.max", f"{max(1000, int(spec.cpus * 100_000))} 100000")
                enforced["cpu"] = True
        elif mode == "cgroup1":
            for ctl in ("memory", "pids", "cpu"):
                base = cgroup1_dir(ctl)
                if base is None:
                    if ctl == "cpu":
                        continue
                    raise OSError(f"no writable cgroup v1 {ctl} hierarchy")
                parent = base / CGROUP_PARENT
                parent.mkdir(exist_ok=True)
                inst = parent / name
                inst.mkdir()
                dirs.append(str(inst))
                if ctl == "memory" and spec.memory:
                    _write(inst / "memory.limit_in_bytes", str(spec.memory))
                    with contextlib.suppress(OSError):
                        _write(inst / "memory.memsw.limit_in_bytes", str(spec.memory))
                    enforced["memory"] = True
                elif ctl == "pids":
                    _write(inst / "pids.max", str(spec.pids))
                    enforced["pids"] = True
                elif ctl == "cpu":
                    _write(inst / "cpu.cfs_period_us", "100000")
                    _write(inst / "cpu.cfs_quota_us", str(max(1000, int(spec.cpus * 100_000))))
                    enforced["cpu"] = True
        else:
            raise ValueError(mode)
    except BaseException:
        remove_cgroups(dirs)
        raise
    return dirs, enforced
