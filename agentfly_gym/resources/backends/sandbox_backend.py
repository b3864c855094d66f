"""The daemon-less sandbox container backend: bubblewrap over a read-only root filesystem.

A :class:`SandboxContainer` is the embedded default of the container kind: it needs no
daemon, only the ``bwrap`` program (Debian/Ubuntu package ``bubblewrap``).  It implements
the :class:`~agentfly_gym.resources.container.ContainerResource` API, so tools and
environments (e.g. R2E-Gym) run unchanged on it or on Docker.

Model of an instance:

* **Root filesystem, read-only.**  ``ContainerSpec.image`` is either ``"host"`` (the host's
  own ``/usr``, ``/bin``, ``/lib*``, ``/sbin``, ``/etc`` plus the running Python's prefix, so
  ``python3`` with this interpreter's packages, e.g. pytest, is available), an absolute path
  to a rootfs folder, or an image name mapped to a rootfs folder (see :func:`resolve_rootfs`).
  Each top-level entry of the rootfs is bound read-only over a fresh root, which is then
  remounted read-only.
* **Private writable state.**  Every instance owns a folder
  ``<sandbox root>/sbx-<hex>/state/`` holding one directory per writable path
  (``/tmp``, ``/root`` and ``spec.workdir`` when it is not ``/``).  For a rootfs image the
  rootfs's own content of those paths is copied in at start.  Read-write ``spec.mounts``
  are shared host folders, not private state; the sandbox writes them as its unprivileged
  host uid, so they must be writable to it (e.g. mode 1777).
* **Root inside is an unprivileged host user.**  Every exec runs in a new user namespace in
  which root (or ``spec.user``) is mapped onto one unprivileged host uid of the instance
  (:data:`SANDBOX_UID_BASE` plus a random offset when the manager runs as root; the manager's
  own uid otherwise).  All capabilities are dropped (``--cap-drop ALL``), nested user
  namespaces are disabled (``--disable-userns``), ``/proc/sys`` is bound read-only, and a
  seccomp filter (:func:`seccomp_filter_bpf`, built with libseccomp through ``pyseccomp``)
  refuses mount, namespace, keyring, module, kexec, bpf and similar calls with ``EPERM``.  The
  host folders that user cannot reach (e.g. below ``/root``) are first bound by root in a
  private mount namespace of the exec (see ``SandboxContainer._argv``).  With ``image="host"`` every
  entry of ``/etc`` that is not world-readable (``shadow``, ``gshadow``, ``sudoers``, ssh host
  keys, ...) is masked, and no home folder is bound (``/root`` is private state).
* **Disk limit** (``spec.disk``).  When the manager runs as root, the private state lives on
  an ext4 file system of ``spec.disk`` bytes in a sparse image file, loop-mounted at
  ``<sandbox root>/sbx-<hex>/vol`` (writes past it fail with ``ENOSPC``;
  ``limits_enforced["disk"]`` is ``True``).  Elsewhere only ``RLIMIT_FSIZE`` holds (no single
  file past ``spec.disk``).
* **One process tree per exec.**  Each :meth:`SandboxContainer.exec` starts a new ``bwrap``
  (``--unshare-all``: new user, pid, ipc, uts, cgroup and network namespaces;
  ``--share-net`` only when ``spec.network``; ``--die-with-parent``; ``--new-session``;
  private ``/proc`` and ``/dev``; a cleared environment with ``spec.env``).  Files persist in
  the private state between execs; **processes do not**: when an exec's command exits, its
  pid namespace ends and every process it left behind is killed.
* **Limits** (``spec.memory``, ``spec.pids``, ``spec.cpus``), best available mode, chosen
  at start (see :func:`detect_limit_mode`) and reported by ``describe()["limits"]``:

  - ``"cgroup2"``: a cgroup v2 per instance under ``/sys/fs/cgroup/agentfly-gym/`` with
    ``memory.max``, ``pids.max`` and ``cpu.max`` (quota ``cpus * 100000`` per 100000 us);
  - ``"cgroup1"``: the same with the v1 memory, pids and cpu controllers
    (``memory.limit_in_bytes``, ``pids.max``, ``cpu.cfs_quota_us``), nested under the
    calling process's own cgroup of each controller;
  - ``"rlimit"``: ``RLIMIT_AS`` (virtual memory) and ``RLIMIT_NPROC``; no CPU limit.
    ``RLIMIT_NPROC`` counts all processes of the host user and is **not enforced for root**,
    so under root in this mode the pid limit is not enforced (``describe()`` says so).

  In the cgroup modes every exec is moved into the instance's cgroup before ``bwrap``
  starts (a ``/bin/sh`` wrapper writes its pid to ``cgroup.procs`` and then execs ``bwrap``),
  so limits hold for the instance as a whole, over concurrent execs, like a Docker container.
  The pid count includes the two ``bwrap`` processes of each running exec.

Orphans: an instance's folder holds ``agentfly-sandbox.json`` with the labels (the manager
id as ``agentfly.manager``), the owner process id and its start time, and the cgroup
folders, so :func:`reap_sandbox_orphans` (``agentfly-gym resources gc``) can kill its
processes and remove its cgroups, its loop mount and its folder after a manager that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import posixpath
import re
import resource as _rlimit
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, ResourceDied, ResourceStartError, ResourceUnavailable
from ..base import ResourceStatus
from ..container import DEFAULT_MAX_OUTPUT, ContainerResource, ExecResult
from ..spec import ContainerSpec

if TYPE_CHECKING:
    from ..manager import ResourceManager

__all__ = [
    "SANDBOX_DIR_ENV",
    "SANDBOX_LIMITS_ENV",
    "SandboxContainer",
    "SandboxPathError",
    "create_sandbox",
    "detect_limit_mode",
    "find_bwrap",
    "reap_sandbox_orphans",
    "resolve_rootfs",
    "sandbox_root",
    "seccomp_filter_bpf",
]

log = logging.getLogger(__name__)

SANDBOX_DIR_ENV = "AGENTFLY_GYM_SANDBOX_DIR"
"""Environment variable: the folder holding every instance's private folder
(default ``<system temp>/agentfly-gym-sandbox``)."""

SANDBOX_LIMITS_ENV = "AGENTFLY_GYM_SANDBOX_LIMITS"
"""Environment variable: force a limit mode (``cgroup2``, ``cgroup1``, ``rlimit``); default ``auto``."""

MARKER_NAME = "agentfly-sandbox.json"
CGROUP_PARENT = "agentfly-gym"
BASE_WRITABLE = ("/tmp", "/root")
HOST_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SKIP_ROOTFS = {"proc", "dev", "sys", "tmp", "root", "run", "mnt", "media", "lost+found"}
_CGROUP_FS = Path("/sys/fs/cgroup")
_LIMIT_MODES = ("cgroup2", "cgroup1", "rlimit")
_STAGE = "/run"  # where an exec's private mount namespace stages bind sources its host user cannot reach

SANDBOX_UID_BASE = 1_600_000_000
"""First host uid (and gid) of the range sandboxes run as when the manager is root: each
instance draws ``SANDBOX_UID_BASE + randbelow(2**24)``, an id no account uses."""

#: Calls the seccomp filter refuses with EPERM: mounting, namespaces, keyrings, kernel modules,
#: kexec, eBPF, perf, userfaultfd, handle-based opens, swap, clock and accounting changes,
#: raw port I/O.  (After Docker's default profile, which allows them only with capabilities
#: that the sandbox never has.)
SECCOMP_DENY = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "mount_setattr", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "bpf", "perf_event_open", "userfaultfd", "open_by_handle_at",
    "name_to_handle_at", "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl",
    "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "lookup_dcookie", "vhangup", "nfsservctl",
)
#: clone flags that create namespaces (``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER |
#: NEWPID | NEWNET``); ``clone`` with any of them is refused, ``clone3`` answers ENOSYS so that
#: the C library falls back to ``clone`` where the flags can be inspected (as Docker does).
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_seccomp_cache: list[bytes | None] = []


class SandboxPathError(ConfigError):
    """A container path given to ``put_files``/``get_file`` is relative, outside the writable
    paths of the sandbox (for writes), or not reachable from the host (e.g. ``/proc``)."""


# ---------------------------------------------------------------------------- discovery
def find_bwrap() -> str:
    """The ``bwrap`` executable found on ``PATH``.

    Raises:
        ResourceUnavailable: bubblewrap is not installed.
    """
    path = shutil.which("bwrap")
    if path is None:
        raise ResourceUnavailable(
            "the sandbox container backend needs bubblewrap: 'bwrap' was not found on PATH; "
            "install the system package 'bubblewrap' (apt-get install bubblewrap) or use backend='docker'")
    return path


def seccomp_filter_bpf() -> bytes | None:
    """The sandbox's seccomp filter as a raw BPF program (for ``bwrap --seccomp FD``), or ``None``.

    Built once per process with libseccomp (the ``pyseccomp`` bindings, package
    ``agentfly-gym[sandbox]``, over the system's ``libseccomp.so.2``): allow by default, refuse
    :data:`SECCOMP_DENY` and namespace-creating ``clone`` with ``EPERM``, ``clone3`` with ``ENOSYS``;
    calls of a foreign architecture (e.g. 32-bit ``int 0x80`` on x86-64) kill the process.
    ``None`` (logged once) when the bindings or the library are missing; the sandbox then still
    runs unprivileged, without capabilities and without nested user namespaces.
    """
    if _seccomp_cache:
        return _seccomp_cache[0]
    bpf: bytes | None = None
    try:
        import errno as _errno

        import pyseccomp as seccomp

        f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        for name in SECCOMP_DENY:
            with contextlib.suppress(Exception):  # a call this architecture or libseccomp lacks
                f.add_rule(seccomp.ERRNO(_errno.EPERM), name)
        for bit in range(32):  # one rule per namespace flag: libseccomp matches a masked equality
            flag = 1 << bit
            if _CLONE_NS_FLAGS & flag:
                f.add_rule(seccomp.ERRNO(_errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        with contextlib.suppress(Exception):
            f.add_rule(seccomp.ERRNO(_errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            bpf = tmp.read()
    except Exception as e:  # ImportError, or OSError when libseccomp.so.2 is missing
        log.warning("sandbox: no seccomp filter (%s); install agentfly-gym[sandbox] (pyseccomp) and libseccomp2", e)
        bpf = None
    _seccomp_cache.append(bpf)
    return bpf


def sandbox_root() -> Path:
    """``$AGENTFLY_GYM_SANDBOX_DIR`` or ``<system temp>/agentfly-gym-sandbox`` (not created)."""
    env = os.environ.get(SANDBOX_DIR_ENV)
    return Path(env) if env else Path(tempfile.gettempdir()) / "agentfly-gym-sandbox"


def resolve_rootfs(image: str) -> Path | None:
    """The rootfs folder of ``image``; ``None`` for ``"host"``.

    Order: ``"host"``; an absolute path to a folder; ``agentfly_gym.images.rootfs_dir(image)``
    when that module provides it; the Debian base image ``agentfly/base`` (``:latest``, no tag
    or its content-hash tag) maps to :func:`agentfly_gym.images.base_rootfs_dir` once built
    (``agentfly-gym images build base``); else ``cache_dir("images", <name>)`` or its
    ``rootfs/`` subfolder, where ``<name>`` is the image name with ``/`` and ``:`` replaced by ``_``
    (e.g. a ``docker export`` of a recipe image unpacked there).

    Raises:
        ResourceUnavailable: no rootfs folder exists for ``image``.
    """
    if image == "host":
        return None
    if image.startswith("/"):
        p = Path(image)
        if p.is_dir():
            return p
        raise ResourceUnavailable(f"image={image!r}: no rootfs folder at that path")
    tried: list[str] = []
    try:
        images = importlib.import_module("agentfly_gym.images")
    except ImportError:
        images = None
    fn = getattr(images, "rootfs_dir", None) if images is not None else None
    if callable(fn):
        try:
            p = fn(image)
        except Exception as e:  # the images module says why (not built, unknown name)
            raise ResourceUnavailable(f"image={image!r}: {e}") from e
        if p is not None and Path(p).is_dir():
            return Path(p)
        tried.append(f"agentfly_gym.images.rootfs_dir -> {p}")
    base_fn = getattr(images, "base_rootfs_dir", None) if images is not None else None
    repo, _, tag = image.partition(":")
    if callable(base_fn) and repo == getattr(images, "BASE_IMAGE", None):
        p = Path(base_fn())
        if (tag in ("", "latest") or image == images.base_image_tag()) and (p / ".agentfly-rootfs.json").is_file():
            return p
        tried.append(str(p))
    from ...data import cache_dir

    safe = re.sub(r"[/:]", "_", image)
    for c in (cache_dir("images", safe, "rootfs"), cache_dir("images", safe)):
        tried.append(str(c))
        if c.is_dir() and any(c.iterdir()):
            return c
    raise ResourceUnavailable(
        f"image={image!r} has no rootfs folder for the sandbox backend (searched: {', '.join(tried)}); "
        "build or export the image into one of these folders, pass an absolute rootfs path, "
        "or use image='host'")


_bwrap_help: list[str] = []


def _bwrap_has(option: str) -> bool:
    """Whether the installed bwrap knows ``option`` (its ``--help``, read once per process)."""
    if not _bwrap_help:
        try:
            r = subprocess.run([find_bwrap(), "--help"], capture_output=True, text=True, timeout=30, check=False)
            _bwrap_help.append(r.stdout + r.stderr)
        except (OSError, subprocess.SubprocessError):
            _bwrap_help.append("")
    return option in _bwrap_help[0]


def _setpriv() -> str:
    """The ``setpriv`` program (util-linux) that drops the exec to the instance's host user.

    Raises:
        ResourceUnavailable: not installed.
    """
    path = shutil.which("setpriv")
    if path is None:
        raise ResourceUnavailable("the sandbox backend run as root needs 'setpriv' (util-linux) to run "
                                  "sandboxes as an unprivileged host user; install util-linux")
    return path


def _unshare() -> str:
    path = shutil.which("unshare")
    if path is None:
        raise ResourceUnavailable("the sandbox backend run as root needs 'unshare' (util-linux); install util-linux")
    return path


def _host_secrets(etc: str = "/etc") -> list[tuple[str, bool]]:
    """Entries of the host's ``/etc`` (two levels) that are not world-readable: ``(path, is_dir)``.

    ``image="host"`` masks them (an empty file or folder), so the sandbox never shows e.g.
    ``/etc/shadow``, ``/etc/gshadow``, ``/etc/sudoers`` or ssh host keys, whatever the host holds.
    """
    found: list[tuple[str, bool]] = []

    def scan(d: str, depth: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not st.st_mode & (stat.S_IXOTH if is_dir else stat.S_IROTH) or (is_dir and not st.st_mode & stat.S_IROTH):
                found.append((e.path, is_dir))
            elif is_dir and depth < 2:
                scan(e.path, depth + 1)

    scan(etc, 1)
    return sorted(found)


def _cgroup2_usable() -> bool:
    return (_CGROUP_FS / "cgroup.controllers").is_file() and os.access(_CGROUP_FS, os.W_OK)


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


def _cgroup1_dir(controller: str) -> Path | None:
    own = _own_cgroup_v1(controller)
    mount = _CGROUP_FS / controller
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
        if forced not in _LIMIT_MODES:
            raise ConfigError(f"{SANDBOX_LIMITS_ENV}={forced!r} is not one of 'auto', {', '.join(map(repr, _LIMIT_MODES))}")
        return forced
    if _cgroup2_usable():
        return "cgroup2"
    if _cgroup1_dir("memory") is not None and _cgroup1_dir("pids") is not None:
        return "cgroup1"
    return "rlimit"


# ---------------------------------------------------------------------------- cgroups
def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _cgroup_pids(dirs: list[str]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
    return pids


def _kill_cgroups(dirs: list[str], *, tries: int = 50) -> bool:
    """SIGKILL every process in the cgroups ``dirs`` until they are empty; True when empty."""
    for d in dirs:  # cgroup v2 >= 5.14 kills the whole subtree atomically
        kill_file = Path(d, "cgroup.kill")
        if kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
    for _ in range(tries):
        pids = _cgroup_pids(dirs)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return not _cgroup_pids(dirs)


def _remove_cgroups(dirs: list[str]) -> None:
    if not dirs:
        return
    _kill_cgroups(dirs)
    for d in dirs:
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the last killed process is reaped
                time.sleep(0.02)


def _make_cgroups(mode: str, name: str, spec: ContainerSpec) -> tuple[list[str], dict[str, bool]]:
    """Create the instance's cgroup(s) and write the limits; returns (dirs, enforced).

    Raises:
        OSError: the cgroup cannot be made here (the caller falls back).
    """
    dirs: list[str] = []
    enforced = {"memory": False, "pids": False, "cpu": False}
    try:
        if mode == "cgroup2":
            parent = _CGROUP_FS / CGROUP_PARENT
            parent.mkdir(exist_ok=True)
            for ctl in ("memory", "pids", "cpu"):
                for d in (_CGROUP_FS, parent):
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
                base = _cgroup1_dir(ctl)
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
        _remove_cgroups(dirs)
        raise
    return dirs, enforced


# ---------------------------------------------------------------------------- output
class _OutputCollector:
    """Keeps the first and last ``max_output`` bytes of a stream (bytes >= characters)."""

    def __init__(self, max_output: int) -> None:
        self.max = max_output
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.max - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.max:
                del self.tail[: len(self.tail) - self.max]

    def result(self) -> tuple[str, bool]:
        """(text of at most ``max_output`` characters, truncated?)."""
        if not self.tail:
            text = self.head.decode("utf-8", "replace")
            if len(text) <= self.max:
                return text, False
            head_text, tail_text = text, text
        else:
            head_text = self.head.decode("utf-8", "replace")
            tail_text = self.tail.decode("utf-8", "replace")
        marker = f"\n[... output truncated: {self.total} bytes in all, the middle omitted ...]\n"
        budget = self.max - len(marker)
        if budget < 2:
            return head_text[: self.max], True
        h = budget // 2
        t = budget - h
        return head_text[:h] + marker + tail_text[-t:], True


# ---------------------------------------------------------------------------- the resource
def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), to tell pid reuse apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class SandboxContainer(ContainerResource):
    """A bubblewrap sandbox built from a :class:`~agentfly_gym.resources.spec.ContainerSpec`.

    See the module docstring for the isolation and limit model.  ``spec.command`` (the
    keep-alive command of Docker containers) is not used: nothing runs between execs.
    ``spec.user`` / ``exec(user=...)``: ``""``, ``"root"`` or ``"0"`` run as root inside; a
    number ``"uid[:gid]"`` or a user name of the rootfs's ``/etc/passwd`` runs as that user
    (a user namespace maps it, like root, onto the instance's unprivileged host uid
    :attr:`host_uid`).

    Args:
        spec: the container spec (``backend`` may be anything; this class is the sandbox).
        labels: metadata kept in the instance's marker file (``agentfly.manager`` is the
            manager id that :func:`reap_sandbox_orphans` matches).
        root: folder holding the private folders (default :func:`sandbox_root`).
        limits: ``"auto"`` (best available), ``"cgroup2"``, ``"cgroup1"`` or ``"rlimit"``.

    Timing (measured on a shared 2-core VM): start 0.04 s (host image) to 0.12 s (Debian
    base rootfs), plus about 0.15-0.3 s for the disk volume (mkfs.ext4 + loop mount) and
    0.1-0.2 s more at release (unmount); exec overhead about 0.03-0.05 s, plus about 0.05 s
    under load when a bind source must be staged (see ``_argv``); reset 0.007 s for an empty state and
    about 0.65 s when the snapshot holds 2000 files: reset restores the private state by
    copying the snapshot taken at start (``cp -a``), so it grows with the state's size, while
    a start also copies the image's content of the writable paths.
    """

    backend_name = "sandbox"

    def __init__(self, spec: ContainerSpec, *, labels: dict[str, str] | None = None,
                 root: str | os.PathLike | None = None, limits: str = "auto") -> None:
        if not isinstance(spec, ContainerSpec):
            raise ConfigError(f"the sandbox backend needs a ContainerSpec, got {type(spec).__name__}")
        if limits != "auto" and limits not in _LIMIT_MODES:
            raise ConfigError(f"limits={limits!r} is not one of 'auto', {', '.join(map(repr, _LIMIT_MODES))}")
        super().__init__(spec, labels={"agentfly.backend": "sandbox", **(labels or {})})
        self._root = Path(root) if root is not None else None
        self._limits_wanted = limits
        self.limit_mode: str | None = None
        self.limits_enforced: dict[str, bool] = {}
        self.name = f"sbx-{uuid.uuid4().hex[:12]}"
        self.dir: Path | None = None
        self._cgroups: list[str] = []
        self._bwrap: str | None = None
        self._rootfs: Path | None = None
        self._ro: list[tuple[str, str]] = []        # (container path, host path), read-only binds
        self._late_ro: list[tuple[str, str]] = []   # read-only binds made over the writable ones
        self._links: dict[str, str] = {}            # container path -> symlink target (top level)
        self._writable: list[str] = []              # container paths of the private state
        self._mounts: list[tuple[str, str, bool]] = []  # (container, host, writable) from spec.mounts
        self._extra_path = ""
        self._masks: list[tuple[str, bool]] = []    # (container path, is a folder) hidden from the sandbox
        root_host = os.geteuid() == 0
        #: the host uid/gid that root (or spec.user) inside is mapped onto
        self.host_uid = SANDBOX_UID_BASE + secrets.randbelow(1 << 24) if root_host else os.geteuid()
        self.host_gid = self.host_uid if root_host else os.getegid()
        self._volume: Path | None = None            # the loop-mounted file system of the disk limit
        self._reach_cache: dict[str, str | None] = {}
        self._procs: set[asyncio.subprocess.Process] = set()
        self._released = False
        self.start_time: float | None = None
        self.last_reset_time: float | None = None

    # ------------------------------------------------------------------ layout
    @property
    def state_dir(self) -> Path:
        assert self.dir is not None
        return (self._volume or self.dir) / "state"

    @staticmethod
    def _state_name(cpath: str) -> str:
        return cpath.strip("/").replace("/", "__") or "_root"

    def _host_of_writable(self, cpath: str) -> Path:
        return self.state_dir / self._state_name(cpath)

    def _plan_mounts(self) -> None:
        spec = self.spec
        wd = posixpath.normpath(spec.workdir or "/")
        if not wd.startswith("/"):
            raise ConfigError(f"workdir={spec.workdir!r} must be an absolute path")
        self._rootfs = resolve_rootfs(spec.image)
        writable = list(BASE_WRITABLE)
        ids = self._lookup_user(spec.user)
        for extra in (wd, ids[2] if ids is not None else "/"):  # the workdir, the spec user's home
            extra = posixpath.normpath(extra)
            if extra != "/" and not any(extra == w or extra.startswith(w + "/") for w in writable):
                writable.append(extra)
        self._writable = writable
        top_writable = {w.strip("/") for w in writable if w.count("/") == 1}
        if self._rootfs is None:  # the host's own system folders
            src_root = Path("/")
            names = [n for n in HOST_ENTRIES if os.path.lexists(f"/{n}")]
        else:
            src_root = self._rootfs
            names = sorted(n for n in os.listdir(src_root)
                           if n not in _SKIP_ROOTFS and n not in top_writable and not n.startswith("."))
        for n in names:
            p = src_root / n
            if p.is_symlink():
                self._links[f"/{n}"] = os.readlink(p)
            else:
                self._ro.append((f"/{n}", str(p)))
        if self._rootfs is None:
            self._masks = _host_secrets()
            # the running interpreter (e.g. a pyenv or venv Python outside /usr) with its packages
            for prefix in dict.fromkeys([sys.base_prefix, sys.prefix]):
                if prefix and not prefix.startswith("/usr/") and os.path.isdir(prefix):
                    self._late_ro.append((prefix, prefix))
            bindir = os.path.dirname(sys.executable)
            if not bindir.startswith("/usr/"):
                self._extra_path = bindir + ":"
        for m in spec.mounts:
            if not m.target.startswith("/") or not os.path.exists(m.source):
                raise ConfigError(f"mount {m!r}: source must exist on the host and target must be absolute")
            self._mounts.append((posixpath.normpath(m.target), os.path.abspath(m.source), not m.read_only))

    def _mount_table(self) -> list[tuple[str, str, bool]]:
        """(container path, host path, writable), longest container path first."""
        table = [(c, h, False) for c, h in self._ro + self._late_ro]
        table += [(w, str(self._host_of_writable(w)), True) for w in self._writable]
        table += self._mounts
        return sorted(table, key=lambda t: len(t[0]), reverse=True)

    # ------------------------------------------------------------------ argv
    def _lookup_user(self, user: str) -> tuple[int, int, str] | None:
        """(uid, gid, home) for ``user``; ``None`` for root.

        Raises:
            ConfigError: the user is unknown in the rootfs's /etc/passwd.
        """
        if user in ("", "root", "0", "0:0"):
            return None
        m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
        if m:
            uid = int(m.group(1))
            return uid, int(m.group(2) or uid), "/tmp"
        passwd = (self._rootfs or Path("/")) / "etc" / "passwd"
        with contextlib.suppress(OSError):
            for line in passwd.read_text().splitlines():
                f = line.split(":")
                if len(f) >= 6 and f[0] == user:
                    return int(f[2]), int(f[3]), f[5] or "/tmp"
        raise ConfigError(f"user={user!r} is unknown: not a number 'uid[:gid]' and not in {passwd}")

    def _argv(self, cmd: list[str], workdir: str, env: dict[str, str], user: str,
              fds: list[int]) -> list[str]:
        """The command line of one exec; the descriptors it passes are appended to ``fds``
        (the caller closes them once the process has started).

        bwrap runs as the instance's unprivileged host user, so it can only bind host folders
        that user may reach.  A source below a folder closed to others (e.g. a Python or a
        rootfs under ``/root``, a sandbox root under a private temp folder) is first bound by
        root onto ``/run/<i>`` in a private mount namespace of this exec (``unshare -m``), and
        bwrap binds it from there; nothing of it outlives the exec.
        """
        spec = self.spec
        staged: list[str] = []
        unprivileged = os.geteuid() == 0

        def src(path: str | Path) -> str:
            path = str(path)
            point = self._stage_point(path) if unprivileged else None
            if point is None:
                return path
            if point == _STAGE or point.startswith(_STAGE + "/"):
                raise ConfigError(f"sandbox bind source {path!r} is below {_STAGE}, where execs stage sources")
            if point not in staged:
                staged.append(point)
            return f"{_STAGE}/{staged.index(point)}{path[len(point):]}"

        a = [self._bwrap or "bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
        if spec.network:
            a.append("--share-net")
        ids = self._lookup_user(user)
        uid, gid = (ids[0], ids[1]) if ids is not None else (0, 0)
        a += ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL"]
        if _bwrap_has("--disable-userns"):  # bubblewrap >= 0.8; the seccomp filter refuses CLONE_NEWUSER anyway
            a.append("--disable-userns")
        for c, h in self._ro:
            a += ["--ro-bind", src(h), c]
        for c, target in self._links.items():
            a += ["--symlink", target, c]
        a += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
        for c, is_dir in self._masks:
            a += ["--tmpfs", c, "--remount-ro", c] if is_dir else ["--ro-bind", "/dev/null", c]
        for w in self._writable:
            a += ["--bind", src(self._host_of_writable(w)), w]
        for c, h in self._late_ro:
            a += ["--ro-bind", src(h), c]
        for c, h, rw in self._mounts:
            a += ["--bind" if rw else "--ro-bind", src(h), c]
        a += ["--remount-ro", "/"]
        bpf = seccomp_filter_bpf()
        if bpf is not None:
            mfd = os.memfd_create("agentfly-seccomp", os.MFD_CLOEXEC)
            fds.append(mfd)
            os.write(mfd, bpf)
            os.lseek(mfd, 0, os.SEEK_SET)
            a += ["--seccomp", str(mfd)]
        home = ids[2] if ids is not None else "/root"
        full_env = {"PATH": self._extra_path + DEFAULT_PATH, "HOME": home, "LANG": "C.UTF-8"}
        full_env.update({str(k): str(v) for k, v in (spec.env or ())})
        full_env.update(env)
        a.append("--clearenv")
        for k, v in full_env.items():
            a += ["--setenv", k, v]
        a += ["--chdir", workdir, "--"]
        a += cmd
        # run as root only long enough to join the cgroups (and stage sources), then become the
        # instance's host user
        if unprivileged:
            a = [_setpriv(), f"--reuid={self.host_uid}", f"--regid={self.host_gid}", "--clear-groups", "--", *a]
        if staged:
            q = shlex.quote
            stage = [f"mount -t tmpfs -o mode=0755,size=1m agentfly-stage {_STAGE}"]
            for i, path in enumerate(staged):
                make = f"mkdir {_STAGE}/{i}" if os.path.isdir(path) else f": > {_STAGE}/{i}"
                stage.append(f"{make} && mount --rbind {q(path)} {_STAGE}/{i}")  # with the disk volume below it
            a = [_unshare(), "--mount", "--propagation", "private", "--",
                 "/bin/sh", "-ec", "; ".join(stage) + '; exec "$@"', "sh", *a]
        steps = []
        if self.limit_mode in ("cgroup1", "cgroup2") and self._cgroups:
            steps += [f"echo $$ > {shlex.quote(str(Path(d, 'cgroup.procs')))}" for d in self._cgroups]
        if spec.disk and self._volume is None:  # no file system of its own: at least no file past the limit
            steps.append(f"ulimit -f {max(1, spec.disk // 512)}")
        if steps:
            a = ["/bin/sh", "-ec", "; ".join(steps) + '; exec "$@"', "sh", *a]
        return a

    def _stage_point(self, path: str) -> str | None:
        """``None`` when the instance's host user may search every folder above ``path``; else the
        folder to stage for it: the child, on the way to ``path``, of the deepest folder closed to
        that user (one staged folder serves every source below it, e.g. a whole rootfs).  Cached."""
        if path in self._reach_cache:
            return self._reach_cache[path]
        point: str | None = None
        p = Path(path)
        chain = [*reversed(p.parents), p]  # "/", ..., path
        for i, folder in enumerate(chain[:-1]):
            try:
                st = os.stat(folder)
            except OSError:
                continue
            if not (st.st_mode & stat.S_IXOTH or (st.st_uid == self.host_uid and st.st_mode & stat.S_IXUSR)):
                point = str(chain[i + 1])
        self._reach_cache[path] = point
        return point

    def _preexec(self) -> None:  # pragma: no cover - runs in the child between fork and exec
        if self.spec.memory:
            _rlimit.setrlimit(_rlimit.RLIMIT_AS, (self.spec.memory, self.spec.memory))
        _rlimit.setrlimit(_rlimit.RLIMIT_NPROC, (self.spec.pids, self.spec.pids))

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Plan the mounts, make the private folder and the limits, check with one exec, snapshot.

        Raises:
            ResourceUnavailable: no ``bwrap``, or no rootfs for ``spec.image``.
            ConfigError: a bad workdir, mount or user in the spec.
            ResourceStartError: the sandbox does not run (the message carries bwrap's output).
        """
        t0 = time.monotonic()
        self._status = ResourceStatus.STARTING
        self._bwrap = find_bwrap()
        self._plan_mounts()
        root = self._root or sandbox_root()
        try:
            await asyncio.to_thread(self._make_private_folder, root)
            res = await self.exec(["/bin/sh", "-c", "true"], timeout=60.0, workdir="/")
            if not res.ok:
                hint = ""
                if "namespace" in res.output:
                    hint = (" (the sandbox runs model code as an unprivileged user in a user namespace: enable "
                            "unprivileged user namespaces, e.g. sysctl user.max_user_namespaces=15000 and, on "
                            "Ubuntu, kernel.apparmor_restrict_unprivileged_userns=0, or use backend='docker')")
                raise ResourceStartError(
                    f"sandbox for image={self.spec.image!r} does not run (exit {res.exit_code}): "
                    f"{res.output.strip()[:2000]}{hint}")
            await asyncio.to_thread(self._copy_tree, self.state_dir, self.dir / "snapshot")
        except BaseException:  # a failed or cancelled start leaves no folder, mount or cgroup behind
            self._status = ResourceStatus.UNHEALTHY
            await asyncio.shield(asyncio.to_thread(self._teardown))
            raise
        self._status = ResourceStatus.READY
        self.start_time = time.monotonic() - t0

    def _make_private_folder(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        # the sandboxes' host users pass through (never list) on the way to their state, so that bwrap
        # reaches it without staging (see _argv)
        with contextlib.suppress(OSError):
            st = root.stat()
            if st.st_uid == os.geteuid() and not st.st_mode & stat.S_IXOTH:
                os.chmod(root, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        self.dir = root / self.name
        self.dir.mkdir()
        os.chmod(self.dir, 0o711)
        self._write_marker()  # first, so that gc finds whatever a start that dies midway leaves
        if self.spec.disk and os.geteuid() == 0:
            self._volume = self._mount_volume(self.dir, self.spec.disk, self.host_uid, self.host_gid)
            self._write_marker()
        self.state_dir.mkdir()
        owner = f"{self.host_uid}:{self.host_gid}"
        for w in self._writable:
            host = self._host_of_writable(w)
            src = self._rootfs / w.lstrip("/") if self._rootfs is not None else None
            if src is not None and src.is_dir() and not src.is_symlink():
                try:
                    self._copy_tree(src, host)
                except ResourceStartError as e:
                    if self._volume is not None and "No space left" in str(e):
                        raise ResourceStartError(
                            f"image {self.spec.image!r}: its {w} does not fit in disk={self.spec.disk} bytes") from e
                    raise
            else:
                host.mkdir(parents=True)
            if w == "/tmp":
                host.chmod(0o1777)
        # the private state belongs to the instance's host user: a user namespace maps the exec's
        # user (root or spec.user) onto it
        subprocess.run(["chown", "-R", "--no-dereference", owner, str(self.state_dir)], capture_output=True, check=False)
        mode = self._limits_wanted if self._limits_wanted != "auto" else detect_limit_mode()
        for m in _LIMIT_MODES[_LIMIT_MODES.index(mode):]:
            if m == "rlimit":
                self.limit_mode = "rlimit"  # RLIMIT_NPROC holds for any host user but root
                self.limits_enforced = {"memory": bool(self.spec.memory), "pids": self.host_uid != 0, "cpu": False}
                break
            try:
                self._cgroups, self.limits_enforced = _make_cgroups(m, self.name, self.spec)
                self.limit_mode = m
                break
            except OSError as e:
                log.info("sandbox %s: %s limits unavailable (%s); trying the next mode", self.name, m, e)
        # True: a file system of spec.disk bytes; False: none (no limit, or RLIMIT_FSIZE per file only)
        self.limits_enforced["disk"] = self._volume is not None
        self._write_marker()

    @staticmethod
    def _mount_volume(d: Path, size: int, uid: int, gid: int) -> Path | None:
        """A fresh ext4 file system of ``size`` bytes (sparse image ``d/disk.img``) mounted at ``d/vol``.

        ``None`` (logged) when it cannot be made here (no loop devices, no mkfs.ext4, a mount refused).
        """
        img, vol = d / "disk.img", d / "vol"
        mkfs = shutil.which("mkfs.ext4") or shutil.which("mke2fs")
        if mkfs is None:
            log.info("sandbox: no mkfs.ext4; the disk limit holds per file only")
            return None
        try:
            with open(os.open(img, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.truncate(size)
            vol.mkdir()
            subprocess.run([mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-O", "^has_journal",
                            "-E", f"lazy_itable_init=1,root_owner={uid}:{gid}", str(img)],
                           check=True, capture_output=True, text=True, timeout=120)
            subprocess.run(["mount", "-o", "loop,nosuid,nodev", str(img), str(vol)],
                           check=True, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", "") or e
            log.info("sandbox: no loop-mounted disk (%s); the disk limit holds per file only", str(detail).strip())
            with contextlib.suppress(OSError):
                vol.rmdir()
            with contextlib.suppress(OSError):
                img.unlink()
            return None
        return vol

    def _write_marker(self) -> None:
        assert self.dir is not None
        data = {"name": self.name, "labels": self.labels, "owner_pid": os.getpid(),
                "owner_start": _proc_start_time(os.getpid()), "cgroups": self._cgroups,
                "volume": str(self._volume) if self._volume else None, "host_uid": self.host_uid,
                "image": self.spec.image, "pool": self.spec.key, "created": time.time()}
        tmp = self.dir / (MARKER_NAME + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.dir / MARKER_NAME)

    @staticmethod
    def _copy_tree(src: Path, dst: Path) -> None:
        """``cp -a src/. dst`` (keeps modes, owners, links, timestamps)."""
        dst.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["cp", "-a", "--", f"{src}/.", str(dst)], check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise ResourceStartError(f"copying {src} to {dst} failed: {r.stderr.strip()}")

    def _kill_all(self) -> None:
        """SIGKILL every running exec (its process group; its pid namespace dies with it) and the cgroup."""
        for p in list(self._procs):
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        if self._cgroups:
            _kill_cgroups(self._cgroups)

    async def reset(self) -> None:
        """Kill stray processes and restore the private state to the snapshot taken at start.

        Raises:
            ResourceDied: the instance was released or its private folder is gone.
        """
        self._check_alive()
        t0 = time.monotonic()
        self._kill_all()
        await asyncio.to_thread(self._restore)
        self.last_reset_time = time.monotonic() - t0

    async def park(self) -> None:
        """The pool keeps this instance idle: kill any exec still running (e.g. one whose caller
        gave up without cancelling it), so nothing of the last rollout runs while idle.  Never raises."""
        if not self._released and (self._procs or self._cgroups):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._kill_all)

    def _restore(self) -> None:
        assert self.dir is not None
        trash = self.state_dir.parent / f"trash-{uuid.uuid4().hex[:6]}"
        if self.state_dir.exists():
            self.state_dir.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)  # first: on a disk-limited volume the copy needs the room
        self._copy_tree(self.dir / "snapshot", self.state_dir)

    async def status(self) -> ResourceStatus:
        """``READY`` while started and the private folder exists; ``STOPPED`` after release;
        ``UNHEALTHY`` when the private folder vanished."""
        if self._released:
            return ResourceStatus.STOPPED
        if self._status == ResourceStatus.READY and (self.dir is None or not self.state_dir.is_dir()):
            self._status = ResourceStatus.UNHEALTHY
        return self._status

    async def release(self) -> None:
        """Kill every process, remove the cgroup and the private folder; idempotent, never raises."""
        if self._released:
            return
        self._released = True
        self._status = ResourceStatus.STOPPED
        try:
            await asyncio.to_thread(self._teardown)
        except Exception:
            log.warning("release of sandbox %s failed", self.name, exc_info=True)

    def terminate_sync(self) -> None:
        """Synchronous teardown (interpreter exit): kill, remove cgroup and private folder."""
        self._released = True
        self._status = ResourceStatus.STOPPED
        with contextlib.suppress(Exception):
            self._teardown()

    def _teardown(self) -> None:
        self._kill_all()
        _remove_cgroups(self._cgroups)
        self._cgroups = []
        if self.dir is not None:
            _unmount_under(self.dir)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _check_alive(self) -> None:
        if self._released:
            raise ResourceDied(f"sandbox {self.name} was released")
        if self.dir is None or not self.state_dir.is_dir():
            raise ResourceDied(f"sandbox {self.name}: its private folder is gone" if self.dir else
                               f"sandbox {self.name} is not started")

    def describe(self) -> dict[str, Any]:
        """The base summary plus backend, image, limit mode, which limits hold, and the private folder."""
        d = super().describe()
        d.update(backend="sandbox", image=self.spec.image, name=self.name, limits=self.limit_mode,
                 limits_enforced=dict(self.limits_enforced), private_dir=str(self.dir) if self.dir else None,
                 writable=list(self._writable), network=self.spec.network, start_time=self.start_time,
                 host_uid=self.host_uid, seccomp=seccomp_filter_bpf() is not None, disk=self.spec.disk,
                 last_reset_time=self.last_reset_time)
        return d

    # ------------------------------------------------------------------ exec
    async def exec(self, cmd: str | list[str], *, timeout: float = 60.0, workdir: str | None = None,
                   env: dict[str, str] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                   user: str | None = None) -> ExecResult:
        """Run ``cmd`` in a new bwrap process over the private state; see
        :meth:`ContainerResource.exec`.

        The exit code is the command's; a command killed by signal N gives ``128 + N``
        (137 when the memory limit's OOM killer strikes), as in Docker.  On timeout the
        exec's process group is killed (its pid namespace, hence every process it started,
        dies with it), ``exit_code`` is -1 and ``timed_out`` is set.

        Raises:
            ConfigError: empty command, ``timeout <= 0`` or ``max_output < 1``.
            ResourceDied: the sandbox was released or its private folder is gone.
        """
        if self.dir is None or self._released or not self.state_dir.is_dir():
            self._check_alive()
        argv_cmd = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        if not argv_cmd or (isinstance(cmd, str) and not cmd.strip()):
            raise ConfigError("cmd must be a non-empty shell string or argv list")
        if timeout is None or timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} must be > 0 seconds")
        if max_output < 1:
            raise ConfigError(f"max_output={max_output!r} must be >= 1 characters")
        wd = workdir or self.spec.workdir or "/"
        fds: list[int] = []
        t0 = time.monotonic()
        try:
            argv = self._argv(argv_cmd, wd, dict(env or {}), self.spec.user if user is None else user, fds)
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, env={"PATH": os.environ.get("PATH", DEFAULT_PATH)}, pass_fds=fds,
                preexec_fn=self._preexec if self.limit_mode == "rlimit" else None)
        except FileNotFoundError as e:  # a bind source vanished under us (e.g. released meanwhile)
            self._check_alive()
            raise ResourceDied(f"sandbox {self.name}: {e}") from e
        finally:
            for fd in fds:
                os.close(fd)
        self._procs.add(proc)
        out = _OutputCollector(max_output)
        timed_out = False
        try:
            try:
                async with asyncio.timeout(timeout):
                    assert proc.stdout is not None
                    while chunk := await proc.stdout.read(65536):
                        out.feed(chunk)
                    rc = await proc.wait()
            except TimeoutError:
                timed_out = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5.0):
                        while chunk := await proc.stdout.read(65536):
                            out.feed(chunk)
                        await proc.wait()
                rc = -1
        except BaseException:  # cancelled: never leave the command running
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            self._procs.discard(proc)
        if rc is not None and rc < 0 and not timed_out:  # the wrapper itself died of a signal
            rc = 128 - rc
        text, truncated = out.result()
        return ExecResult(exit_code=rc, output=text, timed_out=timed_out, truncated=truncated,
                          duration=time.monotonic() - t0)

    # ------------------------------------------------------------------ files
    def _map(self, cpath: str) -> tuple[Path, bool] | None:
        for c, h, rw in self._mount_table():
            if cpath == c or cpath.startswith(c.rstrip("/") + "/"):
                rel = cpath[len(c):].lstrip("/")
                return (Path(h) / rel if rel else Path(h)), rw
        return None

    def _resolve(self, path: str) -> str:
        """``path`` with symlinks resolved as the sandbox sees them (container namespace).

        Raises:
            SandboxPathError: relative path, or a symlink loop.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise SandboxPathError(f"path {path!r} must be an absolute path inside the container")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        done: list[str] = []
        hops = 0
        while parts:
            p = parts.pop(0)
            if p == "..":
                if done:
                    done.pop()
                continue
            cand = "/" + "/".join(done + [p])
            target = self._links.get(cand)
            if target is None:
                mapped = self._map(cand)
                if mapped is not None and mapped[0].is_symlink():
                    target = os.readlink(mapped[0])
            if target is not None:
                hops += 1
                if hops > 40:
                    raise SandboxPathError(f"path {path!r}: too many levels of symbolic links")
                if target.startswith("/"):
                    done = []
                parts = [x for x in target.split("/") if x not in ("", ".")] + parts
                continue
            done.append(p)
        return "/" + "/".join(done)

    def _host_path(self, path: str, *, write: bool) -> Path:
        cpath = self._resolve(path)
        mapped = self._map(cpath)
        writable = sorted({*self._writable, *(c for c, _, rw in self._mounts if rw)})
        if mapped is None or (write and not mapped[1]):
            what = "written" if write else "read from the host"
            raise SandboxPathError(
                f"path {path!r} (resolved {cpath!r}) cannot be {what}: it is outside the sandbox's "
                f"{'writable paths' if write else 'filesystem'} {writable if write else ''}".rstrip())
        return mapped[0]

    async def put_files(self, files: dict[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write files into the private state (absolute container paths; parents created).

        Symlinks on the way are followed as the sandbox would follow them.  ``str`` content
        is written as UTF-8.

        Raises:
            SandboxPathError: a path is relative or outside the writable paths (``/tmp``,
                ``/root``, the workdir, read-write mounts); nothing is written then.
            ResourceDied: the sandbox was released or its private folder is gone.
        """
        self._check_alive()
        plan = [(self._host_path(p, write=True), data) for p, data in files.items()]
        await asyncio.to_thread(self._write_files, plan, mode, (self.host_uid, self.host_gid))

    @staticmethod
    def _write_files(plan: list[tuple[Path, bytes | str]], mode: int, owner: tuple[int, int]) -> None:
        for host, data in plan:
            missing = [p for p in [host.parent, *host.parent.parents] if not p.exists()]
            host.parent.mkdir(parents=True, exist_ok=True)
            for p in missing:  # new folders belong to the sandbox's user, like the files
                with contextlib.suppress(OSError):
                    os.chown(p, *owner, follow_symlinks=False)
            blob = data.encode() if isinstance(data, str) else bytes(data)
            fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                with contextlib.suppress(OSError):
                    os.fchown(f.fileno(), *owner)
            os.chmod(host, mode)

    async def get_file(self, path: str, *, max_bytes: int = 10_000_000) -> bytes:
        """Read one file visible in the sandbox (private state, mounts or the read-only root).

        Raises:
            FileNotFoundError: no such file (or it is a directory).
            SandboxPathError: a relative path, one not reachable from the host (``/proc``, ``/dev``),
                or one the sandbox's user may not read (e.g. a masked host secret).
            ConfigError: the file is larger than ``max_bytes``.
            ResourceDied: the sandbox was released or its private folder is gone.
        """
        self._check_alive()
        cpath = self._resolve(path)
        if any(cpath == c or cpath.startswith(c + "/") for c, _ in self._masks):
            raise SandboxPathError(f"path {path!r} is hidden from the sandbox")
        host = self._host_path(path, write=False)
        return await asyncio.to_thread(self._read_file, path, host, max_bytes, self.host_uid)

    @staticmethod
    def _read_file(path: str, host: Path, max_bytes: int, uid: int) -> bytes:
        try:
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"no such file in the sandbox: {path}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(f"not a regular file in the sandbox: {path}")
            if st.st_uid != uid and not st.st_mode & stat.S_IROTH:  # what the sandbox's user could read
                raise SandboxPathError(f"path {path!r} is not readable inside the sandbox")
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ConfigError(f"{path} is larger than max_bytes={max_bytes}")
        return data


# ---------------------------------------------------------------------------- entry points
def create_sandbox(spec: ContainerSpec, manager: ResourceManager | None) -> SandboxContainer:
    """An unstarted :class:`SandboxContainer` for ``spec``, labelled with the manager id.

    Called by the container backend dispatcher for ``backend="sandbox"`` (and ``"auto"``
    without a Docker engine).  The private folder lives under :func:`sandbox_root`.

    Raises:
        ResourceUnavailable: ``bwrap`` is not installed, or ``spec.ports`` is set (see :func:`_refuse_ports`).
    """
    _refuse_ports(spec)
    find_bwrap()
    labels = {"agentfly.pool": spec.key}
    if manager is not None:
        labels["agentfly.manager"] = manager.id
    return SandboxContainer(spec, labels=labels)


def _refuse_ports(spec: ContainerSpec) -> None:
    """The sandbox backend cannot publish ``spec.ports``; say why and what to use instead.

    A sandbox either has its own network namespace (``network=False``: loopback only, which the
    host cannot reach, and bubblewrap has no port forwarding) or shares the host's
    (``--share-net``: a server inside would bind the host's own port, so two pooled instances
    collide on it and it is open to every local process, with no engine to pick a free port).

    Raises:
        ResourceUnavailable: ``spec.ports`` is not empty.
    """
    if spec.ports:
        raise ResourceUnavailable(
            f"the 'sandbox' container backend cannot publish ports={spec.ports!r}: its network namespace is "
            "either private (unreachable from the host) or the host's own (pooled servers would collide on "
            "one port); use backend='docker' (ports published on 127.0.0.1 at engine-chosen host ports)")


def _unmount_under(d: Path) -> None:
    """Unmount every mount at or below ``d`` (deepest first; lazily if busy).  The loop device of
    a ``-o loop`` mount is freed with it."""
    prefix = str(d).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = []
    for line in lines:
        parts = line.split()
        if len(parts) > 1:
            mp = parts[1].encode().decode("unicode_escape")  # /proc/mounts octal-escapes spaces
            if mp.startswith(prefix) or mp == str(d):
                points.append(mp)
    for mp in sorted(points, key=len, reverse=True):
        r = subprocess.run(["umount", mp], capture_output=True, check=False)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)


def _kill_host_user(uid: Any) -> None:
    """SIGKILL every process of a sandbox's own host uid (never root or an ordinary account)."""
    if not isinstance(uid, int) or uid < SANDBOX_UID_BASE:
        return
    for _ in range(3):
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if d.stat().st_uid == uid:
                    os.kill(int(d.name), signal.SIGKILL)


def _owner_alive(marker: dict[str, Any]) -> bool:
    pid = marker.get("owner_pid")
    if not isinstance(pid, int):
        return False
    start = _proc_start_time(pid)
    return start is not None and start == marker.get("owner_start")


def reap_sandbox_orphans(manager_id: str | None = None, *, root: str | os.PathLike | None = None,
                         older_than: float = 0, dry_run: bool = False) -> list[str]:
    """Remove sandboxes left behind: kill their processes, remove their cgroups, unmount their
    disk volume and remove their folders.

    Args:
        manager_id: reap every sandbox labelled with this manager id (do not pass a live
            manager's id); ``None`` reaps those whose owner process is gone.
        root: the sandbox root (default :func:`sandbox_root`).
        older_than: only sandboxes created at least this many seconds ago.
        dry_run: list what would be removed without removing anything.

    Returns:
        The names (``sbx-<hex>``) of the sandboxes removed.  Empty ``agentfly-gym`` cgroups
        whose sandbox folder is gone are removed too.
    """
    base = Path(root) if root is not None else sandbox_root()
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
                if time.time() - d.stat().st_mtime > max(600, older_than):
                    reaped.append(d.name)
                    if dry_run:
                        continue
                    _unmount_under(d)
                    shutil.rmtree(d, ignore_errors=True)
                continue
            if manager_id is not None:
                if marker.get("labels", {}).get("agentfly.manager") != manager_id:
                    continue
            elif _owner_alive(marker):
                continue
            if older_than and time.time() - float(marker.get("created") or 0) < older_than:
                continue
            if dry_run:
                reaped.append(d.name)
                continue
            cgroups = [c for c in marker.get("cgroups", []) if CGROUP_PARENT in c]
            _kill_cgroups(cgroups)
            _kill_host_user(marker.get("host_uid"))
            _remove_cgroups(cgroups)
            _unmount_under(d)
            shutil.rmtree(d, ignore_errors=True)
            reaped.append(d.name)
    if dry_run:
        return reaped
    # stray cgroups of sandboxes whose folder is gone (only empty ones: they may belong to another root)
    parents = [_CGROUP_FS / CGROUP_PARENT] + [b / CGROUP_PARENT for b in
                                              (_cgroup1_dir(c) for c in ("memory", "pids", "cpu")) if b is not None]
    for parent in parents:
        if not parent.is_dir():
            continue
        for cg in parent.iterdir():
            if cg.is_dir() and cg.name.startswith("sbx-") and not (base / cg.name).exists() \
                    and not _cgroup_pids([str(cg)]):
                with contextlib.suppress(OSError):
                    os.rmdir(cg)
    return reaped
