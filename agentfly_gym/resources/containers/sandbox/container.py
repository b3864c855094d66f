"""The daemon-less sandbox container backend: bubblewrap over a read-only root filesystem.

A :class:`SandboxContainer` is the embedded default of the container kind: it needs no
daemon, only the ``bwrap`` program (Debian/Ubuntu package ``bubblewrap``).  It implements
the :class:`~agentfly_gym.resources.containers.api.ContainerResource` API, so tools and
environments (e.g. R2E-Gym) run unchanged on it or on Docker.

Model of an instance:

* **Root filesystem, read-only.**  ``ContainerSpec.sandbox_image`` (else ``image``) is either ``"host"`` (the host's
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
  (``--unshare-all``: new user, pid, ipc, uts, cgroup and network namespaces; with ``spec.network``
  the network namespace gets outbound-only user-mode networking from ``slirp4netns``, never the
  host's network or loopback (see :mod:`.usernet`); ``--die-with-parent``; ``--new-session``;
  private ``/proc`` and ``/dev``; a cleared environment with ``spec.env``).  bwrap's options, with
  the host paths of the layout, are passed through a descriptor (``--args``) and bwrap itself runs
  with a minimal environment, so that the sandbox's PID 1 (bwrap's reaper) shows neither.  Files persist in
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
folders, so :func:`..reaper.reap_sandbox_orphans` (``agentfly-gym resources gc``) can kill its
processes and remove its cgroups, its loop mount and its folder after a manager that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource as _rlimit
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ....errors import ConfigError, ResourceDied, ResourceStartError, ResourceUnavailable
from ...base import ResourceStatus
from ..api import DEFAULT_MAX_OUTPUT, ContainerResource, ExecResult
from ..output import OutputBuffer
from ..ownership import proc_start
from ...spec import SANDBOX_PORTS_REFUSAL, ContainerSpec
from .argv import DEFAULT_PATH, SandboxLayout, exec_argv
from .bwrap import bwrap_has, find_bwrap, seccomp_filter_bpf, setpriv, unshare
from .cgroups import LIMIT_MODES, detect_limit_mode, kill_cgroups, make_cgroups, remove_cgroups
from .files import SandboxFiles
from .mounts import SandboxMounts
from .usernet import UserNetwork, find_slirp4netns
from .volume import mount_volume, unmount_under

__all__ = ["MARKER_NAME", "SANDBOX_DIR_ENV", "SANDBOX_UID_BASE", "SandboxContainer", "create", "sandbox_root"]

log = logging.getLogger(__name__)

SANDBOX_DIR_ENV = "AGENTFLY_GYM_SANDBOX_DIR"
"""Environment variable: the folder holding every instance's private folder
(default ``<system temp>/agentfly-gym-sandbox``)."""

MARKER_NAME = "agentfly-sandbox.json"

SANDBOX_UID_BASE = 1_600_000_000
"""First host uid (and gid) of the range sandboxes run as when the manager is root: each
instance draws ``SANDBOX_UID_BASE + randbelow(2**24)``, an id no account uses."""


def sandbox_root() -> Path:
    """``$AGENTFLY_GYM_SANDBOX_DIR`` or ``<system temp>/agentfly-gym-sandbox`` (not created)."""
    env = os.environ.get(SANDBOX_DIR_ENV)
    return Path(env) if env else Path(tempfile.gettempdir()) / "agentfly-gym-sandbox"


class SandboxContainer(SandboxFiles, SandboxMounts, ContainerResource):
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
        if limits != "auto" and limits not in LIMIT_MODES:
            raise ConfigError(f"limits={limits!r} is not one of 'auto', {', '.join(map(repr, LIMIT_MODES))}")
        super().__init__(spec, labels={"agentfly.backend": "sandbox", **(labels or {})})
        #: the root file system this instance runs: ``spec.sandbox_image`` or else ``spec.image``
        self.image = spec.sandbox_image or spec.image
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

    # ------------------------------------------------------------------ argv (the mount plan: SandboxMounts)
    def _argv(self, cmd: list[str], workdir: str, env: dict[str, str], user: str,
              fds: list[int], ours: list[int] | None = None) -> list[str]:
        """The command line of one exec (built by :func:`.argv.exec_argv` from this instance's
        layout); the descriptors it passes are appended to ``fds`` (the caller closes them once the
        process has started).  With ``spec.network``, ``ours`` receives the caller's ends of the
        user-mode network handshake (bwrap's info pipe, read end; its block pipe, write end).

        bwrap's options (with every host path of the layout) go through a descriptor (``--args``),
        so that the command line of the sandbox's PID 1, bwrap's reaper, shows none of them.

        bwrap runs as the instance's unprivileged host user, so it can only bind host folders
        that user may reach.  A source below a folder closed to others (e.g. a Python or a
        rootfs under ``/root``, a sandbox root under a private temp folder) is first bound by
        root onto ``/run/<i>`` in a private mount namespace of this exec (``unshare -m``), and
        bwrap binds it from there; nothing of it outlives the exec.
        """
        spec = self.spec
        unprivileged = os.geteuid() == 0
        ids = self._lookup_user(user)
        uid, gid, home = ids if ids is not None else (0, 0, "/root")
        layout = SandboxLayout(ro=self._ro, links=self._links, masks=self._masks,
                               writable=[(w, str(self._host_of_writable(w))) for w in self._writable],
                               late_ro=self._late_ro, mounts=self._mounts, path_prefix=self._extra_path)
        seccomp_fd = None
        bpf = seccomp_filter_bpf()
        if bpf is not None:
            seccomp_fd = os.memfd_create("agentfly-seccomp", os.MFD_CLOEXEC)
            fds.append(seccomp_fd)
            os.write(seccomp_fd, bpf)
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
        full_env = {str(k): str(v) for k, v in (spec.env or ())}
        full_env.update(env)
        cgroups = self._cgroups if self.limit_mode in ("cgroup1", "cgroup2") else []
        file_blocks = max(1, spec.disk // 512) if spec.disk and self._volume is None else None
        net_fds = None
        if spec.network:
            info_r, info_w = os.pipe2(os.O_CLOEXEC)
            block_r, block_w = os.pipe2(os.O_CLOEXEC)
            fds += [info_w, block_r]
            if ours is not None:
                ours += [info_r, block_w]
            net_fds = (info_w, block_r)

        def hide(options: list[str]) -> list[str]:
            fd = os.memfd_create("agentfly-bwrap-args", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, b"".join(o.encode() + b"\0" for o in options))
            os.lseek(fd, 0, os.SEEK_SET)
            return ["--args", str(fd)]

        return exec_argv(layout, cmd, workdir=workdir, env=full_env, uid=uid, gid=gid, home=home,
                         bwrap=self._bwrap or "bwrap", network=bool(spec.network),
                         disable_userns=bwrap_has("--disable-userns"),  # bubblewrap >= 0.8; seccomp refuses it too
                         seccomp_fd=seccomp_fd,
                         drop_to=(setpriv(), self.host_uid, self.host_gid) if unprivileged else None,
                         stage_point=self._stage_point, is_dir=os.path.isdir,
                         unshare=unshare, cgroup_dirs=cgroups,
                         file_blocks=file_blocks, user_net_fds=net_fds, hide_options=hide)

    def _preexec(self) -> None:  # pragma: no cover - runs in the child between fork and exec
        if self.spec.memory:
            _rlimit.setrlimit(_rlimit.RLIMIT_AS, (self.spec.memory, self.spec.memory))
        _rlimit.setrlimit(_rlimit.RLIMIT_NPROC, (self.spec.pids, self.spec.pids))

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Plan the mounts, make the private folder and the limits, check with one exec, snapshot.

        Raises:
            ResourceUnavailable: no ``bwrap``, or no rootfs for the image.
            ConfigError: a bad workdir, mount or user in the spec.
            ResourceStartError: the sandbox does not run (the message carries bwrap's output).
        """
        t0 = time.monotonic()
        self._status = ResourceStatus.STARTING
        self._bwrap = find_bwrap()
        if self.spec.network:
            find_slirp4netns()
        self._plan_mounts()
        root = self._root or sandbox_root()
        # the start's work in threads: a cancelled await does not stop a thread, so the teardown below waits
        # for it first (else a folder or cgroup it makes after the teardown is left until `resources gc`)
        threads: list[asyncio.Future] = []

        def in_thread(fn: Any, *args: Any) -> Any:
            threads.append(asyncio.ensure_future(asyncio.to_thread(fn, *args)))
            return asyncio.shield(threads[-1])

        async def settle_and_teardown() -> None:
            await asyncio.gather(*threads, return_exceptions=True)
            await asyncio.to_thread(self._teardown)

        try:
            await in_thread(self._make_private_folder, root)
            res = await self.exec(["/bin/sh", "-c", "true"], timeout=60.0, workdir="/")
            if not res.ok:
                hint = ""
                if "namespace" in res.output:
                    hint = (" (the sandbox runs model code as an unprivileged user in a user namespace: enable "
                            "unprivileged user namespaces, e.g. sysctl user.max_user_namespaces=15000 and, on "
                            "Ubuntu, kernel.apparmor_restrict_unprivileged_userns=0, or use backend='docker')")
                raise ResourceStartError(
                    f"sandbox for image={self.image!r} does not run (exit {res.exit_code}): "
                    f"{res.output.strip()[:2000]}{hint}")
            await in_thread(self._copy_tree, self.state_dir, self.dir / "snapshot")
        except BaseException:  # a failed or cancelled start leaves no folder, mount or cgroup behind
            self._status = ResourceStatus.UNHEALTHY
            await asyncio.shield(settle_and_teardown())
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
            self._volume = mount_volume(self.dir, self.spec.disk, self.host_uid, self.host_gid)
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
                            f"image {self.image!r}: its {w} does not fit in disk={self.spec.disk} bytes") from e
                    raise
            else:
                host.mkdir(parents=True)
            if w == "/tmp":
                host.chmod(0o1777)
        # the private state belongs to the instance's host user: a user namespace maps the exec's
        # user (root or spec.user) onto it
        subprocess.run(["chown", "-R", "--no-dereference", owner, str(self.state_dir)], capture_output=True, check=False)
        mode = self._limits_wanted if self._limits_wanted != "auto" else detect_limit_mode()
        for m in LIMIT_MODES[LIMIT_MODES.index(mode):]:
            if m == "rlimit":
                self.limit_mode = "rlimit"  # RLIMIT_NPROC holds for any host user but root
                self.limits_enforced = {"memory": bool(self.spec.memory), "pids": self.host_uid != 0, "cpu": False}
                break
            try:
                self._cgroups, self.limits_enforced = make_cgroups(m, self.name, self.spec)
                self.limit_mode = m
                break
            except OSError as e:
                log.info("sandbox %s: %s limits unavailable (%s); trying the next mode", self.name, m, e)
        # True: a file system of spec.disk bytes; False: none (no limit, or RLIMIT_FSIZE per file only)
        self.limits_enforced["disk"] = self._volume is not None
        self._write_marker()

    def _write_marker(self) -> None:
        assert self.dir is not None
        data = {"name": self.name, "labels": self.labels, "owner_pid": os.getpid(),
                "owner_start": proc_start(os.getpid()), "cgroups": self._cgroups,
                "volume": str(self._volume) if self._volume else None, "host_uid": self.host_uid,
                "image": self.image, "pool": self.spec.key, "created": time.time()}
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
            kill_cgroups(self._cgroups)

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

    async def adestroy(self) -> None:
        """Kill every process, remove the cgroup and the private folder; idempotent, never raises."""
        if self._released:
            return
        self._released = True
        self._status = ResourceStatus.STOPPED
        try:
            await asyncio.to_thread(self._teardown)
        except Exception:
            log.warning("release of sandbox %s failed", self.name, exc_info=True)

    def destroy(self) -> None:
        """Synchronous teardown (interpreter exit): kill, remove cgroup and private folder."""
        self._released = True
        self._status = ResourceStatus.STOPPED
        with contextlib.suppress(Exception):
            self._teardown()

    def _teardown(self) -> None:
        self._kill_all()
        cgroups_gone = remove_cgroups(self._cgroups)
        self._cgroups = []
        if self.dir is not None:
            unmount_under(self.dir)
            if cgroups_gone:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:  # the marker stays, naming the cgroups: `agentfly-gym gc` removes them once this process is gone
                log.warning("sandbox %s: a cgroup is still busy; its marker is kept for gc", self.name)
                for p in self.dir.iterdir():
                    if p.name != MARKER_NAME:
                        if p.is_dir() and not p.is_symlink():
                            shutil.rmtree(p, ignore_errors=True)
                        else:
                            with contextlib.suppress(OSError):
                                p.unlink()

    def _check_alive(self) -> None:
        if self._released:
            raise ResourceDied(f"sandbox {self.name} was released")
        if self.dir is None or not self.state_dir.is_dir():
            raise ResourceDied(f"sandbox {self.name}: its private folder is gone" if self.dir else
                               f"sandbox {self.name} is not started")

    def describe(self) -> dict[str, Any]:
        """The base summary plus backend, image, limit mode, which limits hold, and the private folder."""
        d = super().describe()
        d.update(backend="sandbox", image=self.image, name=self.name, limits=self.limit_mode,
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
        ours: list[int] = []
        t0 = time.monotonic()
        try:
            argv = self._argv(argv_cmd, wd, dict(env or {}), self.spec.user if user is None else user, fds, ours)
            # a minimal environment: bwrap's reaper (the sandbox's PID 1) keeps it, and the sandbox can read it
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, env={"PATH": DEFAULT_PATH}, pass_fds=fds, cwd="/",
                preexec_fn=self._preexec if self.limit_mode == "rlimit" else None)
        except FileNotFoundError as e:  # a bind source vanished under us (e.g. released meanwhile)
            for fd in ours:
                os.close(fd)
            self._check_alive()
            raise ResourceDied(f"sandbox {self.name}: {e}") from e
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self._procs.add(proc)
        out = OutputBuffer(max_output)
        timed_out = False
        net: UserNetwork | None = None
        try:
            try:
                async with asyncio.timeout(timeout):
                    assert proc.stdout is not None
                    if ours:
                        info_r, block_w = ours
                        ours.clear()  # attach() closes them
                        net = await UserNetwork.attach(info_r, block_w)
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
            if net is not None:
                await net.close()
            elif ours:
                for fd in ours:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        if rc is not None and rc < 0 and not timed_out:  # the wrapper itself died of a signal
            rc = 128 - rc
        text, truncated = out.text(max_output)
        return ExecResult(exit_code=rc, output=text, timed_out=timed_out, truncated=truncated,
                          duration=time.monotonic() - t0)

# ---------------------------------------------------------------------------- entry points
def create(spec: ContainerSpec, labels: dict[str, str]) -> SandboxContainer:
    """The ``("container", "sandbox")`` backend: an unstarted :class:`SandboxContainer` for ``spec``
    whose marker file will carry ``labels`` (see :mod:`..ownership`).  The private folder lives
    under :func:`sandbox_root`.

    Raises:
        ResourceUnavailable: ``bwrap`` is not installed, ``spec.ports`` is set (see :func:`_refuse_ports`),
            ``spec.runtime`` is set (a Docker option), or ``spec.network`` without ``slirp4netns``.
    """
    _refuse_ports(spec)
    if spec.runtime is not None:  # backend="auto" resolved to the sandbox; "sandbox" is refused by the spec
        raise ResourceUnavailable(f"runtime={spec.runtime!r} is a Docker option: the sandbox backend cannot run it "
                                  "(a Docker engine is needed; use backend='docker')")
    find_bwrap()
    if spec.network:
        find_slirp4netns()
    return SandboxContainer(spec, labels=labels)


def _refuse_ports(spec: ContainerSpec) -> None:
    """The sandbox backend cannot publish ``spec.ports``; say why and what to use instead.

    A sandbox has its own network namespace (``network=False``: loopback only; ``network=True``: an
    outbound-only user-mode network), which the host cannot connect into, and bubblewrap has no port
    forwarding (nor an engine to pick a free host port).

    Raises:
        ResourceUnavailable: ``spec.ports`` is not empty.
    """
    if spec.ports:  # reached with backend="auto" resolved here; backend="sandbox" is refused by the spec itself
        raise ResourceUnavailable(SANDBOX_PORTS_REFUSAL.format(ports=spec.ports))
