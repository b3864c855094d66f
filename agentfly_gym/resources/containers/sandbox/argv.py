"""The command line of one sandbox exec, as a pure function of the instance's layout.

:func:`exec_argv` turns a :class:`SandboxLayout` (what :class:`~.container.SandboxContainer` planned
from its spec and paths: read-only binds, symlinks, masked secrets, writable state folders, spec
mounts) plus the exec's command, working folder, environment and user ids into the ``argv`` to run:
``bwrap`` with its options, wrapped (when the manager is root) in ``setpriv`` to drop to the
instance's host user, in ``unshare -m`` + ``/bin/sh`` to stage bind sources that user cannot reach,
and in ``/bin/sh`` to join the instance's cgroups and set the file-size limit.  It runs nothing,
touches no file and creates no descriptor: every fact it needs about the host (where ``bwrap``,
``setpriv`` and ``unshare`` are, whether a folder must be staged, the seccomp descriptor) is an
argument, so the security-relevant options are unit-testable without a sandbox.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ....errors import ConfigError

__all__ = ["DEFAULT_PATH", "STAGE", "SandboxLayout", "exec_argv"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STAGE = "/run"
"""Where an exec's private mount namespace stages bind sources its host user cannot reach."""


@dataclass
class SandboxLayout:
    """What the sandbox's file system is made of (container paths are absolute, inside the sandbox).

    Attributes:
        ro: (container path, host path) read-only binds of the system folders, made first.
        links: container path -> symlink target (top-level symlinks of the rootfs).
        masks: (container path, is a folder) hidden from the sandbox (an empty read-only tmpfs for a
            folder, ``/dev/null`` for a file).
        writable: (container path, host state folder) read-write binds of the private state.
        late_ro: (container path, host path) read-only binds made over the writable ones (the running
            interpreter outside ``/usr``).
        mounts: (container path, host path, writable) from ``spec.mounts``.
        path_prefix: prepended to :data:`DEFAULT_PATH` (e.g. ``"/opt/py/bin:"``).
    """

    ro: list[tuple[str, str]] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)
    masks: list[tuple[str, bool]] = field(default_factory=list)
    writable: list[tuple[str, str]] = field(default_factory=list)
    late_ro: list[tuple[str, str]] = field(default_factory=list)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    path_prefix: str = ""


def exec_argv(layout: SandboxLayout, cmd: list[str], *, workdir: str, env: Mapping[str, str],
              uid: int, gid: int, home: str, bwrap: str = "bwrap", network: bool = False,
              disable_userns: bool = True, seccomp_fd: int | None = None,
              drop_to: tuple[str, int, int] | None = None, stage_point: Callable[[str], str | None] | None = None,
              is_dir: Callable[[str], bool] | None = None, unshare: str | Callable[[], str] = "unshare",
              cgroup_dirs: list[str] | tuple[str, ...] = (), file_blocks: int | None = None,
              user_net_fds: tuple[int, int] | None = None,
              hide_options: Callable[[list[str]], list[str]] | None = None) -> list[str]:
    """The ``argv`` of one exec.

    Args:
        layout: the instance's file-system layout.
        cmd: the command to run inside (``argv`` list).
        workdir: absolute working folder inside.
        env: the whole environment inside besides ``PATH``/``HOME``/``LANG`` defaults (spec env, then
            the exec's own, already merged; it wins over the defaults); bwrap clears every other variable.
        uid, gid, home: the user inside (0, 0, ``"/root"`` for root).
        bwrap: the ``bwrap`` executable.
        network: give the sandbox a network: with ``user_net_fds`` its own namespace that a user-mode network
            (slirp4netns) is attached to; without, the host's network namespace (``--share-net``).
            ``False``: its own namespace with loopback only.
        disable_userns: pass ``--disable-userns`` (bubblewrap >= 0.8).
        seccomp_fd: a descriptor holding the seccomp BPF program (``--seccomp``), or None.
        drop_to: ``(setpriv executable, host uid, host gid)``: the manager is root and bwrap runs as that
            unprivileged host user; None: bwrap runs as the caller.
        stage_point: with ``drop_to``: for a host source path, the folder to stage (bind onto
            ``/run/<i>`` in a private mount namespace) because the host user cannot reach it, or None.
        is_dir: with staging: whether a staged folder is a folder (else a file).
        unshare: the ``unshare`` executable, or a function returning it (called only when a source is staged).
        cgroup_dirs: cgroup folders the exec joins first (its pid written to their ``cgroup.procs``).
        file_blocks: ``ulimit -f`` in 512-byte blocks (a disk limit without a volume), or None.
        user_net_fds: ``(info_fd, block_fd)``: bwrap writes its child's pid to ``info_fd`` (``--info-fd``) and
            waits for a byte on ``block_fd`` (``--block-fd``) before it runs ``cmd``, so that the caller can
            attach a user-mode network to the new network namespace first.
        hide_options: called with bwrap's options (everything between the executable and ``--``), returns
            what stands for them on the command line (e.g. ``["--args", fd]`` after writing them to ``fd``),
            so that the sandbox's PID 1 (bwrap's reaper, which keeps bwrap's command line) shows no host path.

    Returns:
        the command line, outermost wrapper first.

    Raises:
        ConfigError: a bind source that must be staged lies below ``/run`` (where staging happens).
    """
    staged: list[str] = []

    def src(path: str | Path) -> str:
        path = str(path)
        point = stage_point(path) if (drop_to is not None and stage_point is not None) else None
        if point is None:
            return path
        if point == STAGE or point.startswith(STAGE + "/"):
            raise ConfigError(f"sandbox bind source {path!r} is below {STAGE}, where execs stage sources")
        if point not in staged:
            staged.append(point)
        return f"{STAGE}/{staged.index(point)}{path[len(point):]}"

    a = [bwrap, "--die-with-parent", "--new-session", "--unshare-all"]
    if network and user_net_fds is None:
        a.append("--share-net")
    if network and user_net_fds is not None:
        a += ["--info-fd", str(user_net_fds[0]), "--block-fd", str(user_net_fds[1])]
    a += ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL"]
    if disable_userns:
        a.append("--disable-userns")
    for c, h in layout.ro:
        a += ["--ro-bind", src(h), c]
    for c, target in layout.links.items():
        a += ["--symlink", target, c]
    a += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    for c, folder in layout.masks:
        a += ["--tmpfs", c, "--remount-ro", c] if folder else ["--ro-bind", "/dev/null", c]
    for c, h in layout.writable:
        a += ["--bind", src(h), c]
    for c, h in layout.late_ro:
        a += ["--ro-bind", src(h), c]
    for c, h, rw in layout.mounts:
        a += ["--bind" if rw else "--ro-bind", src(h), c]
    a += ["--remount-ro", "/"]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    full_env = {"PATH": layout.path_prefix + DEFAULT_PATH, "HOME": home, "LANG": "C.UTF-8"}
    full_env.update(env)
    a.append("--clearenv")
    for k, v in full_env.items():
        a += ["--setenv", k, v]
    a += ["--chdir", workdir]
    if hide_options is not None:
        a = [a[0], *hide_options(a[1:])]
    a.append("--")
    a += cmd
    # run as root only long enough to join the cgroups (and stage sources), then become the
    # instance's host user
    if drop_to is not None:
        setpriv, host_uid, host_gid = drop_to
        a = [setpriv, f"--reuid={host_uid}", f"--regid={host_gid}", "--clear-groups", "--", *a]
    if staged:
        q = shlex.quote
        stage = [f"mount -t tmpfs -o mode=0755,size=1m agentfly-stage {STAGE}"]
        for i, path in enumerate(staged):
            folder = is_dir(path) if is_dir is not None else True
            make = f"mkdir {STAGE}/{i}" if folder else f": > {STAGE}/{i}"
            stage.append(f"{make} && mount --rbind {q(path)} {STAGE}/{i}")  # with the disk volume below it
        a = [unshare if isinstance(unshare, str) else unshare(), "--mount", "--propagation", "private", "--",
             "/bin/sh", "-ec", "; ".join(stage) + '; exec "$@"', "sh", *a]
    steps = [f"echo $$ > {shlex.quote(str(Path(d, 'cgroup.procs')))}" for d in cgroup_dirs]
    if file_blocks is not None:
        steps.append(f"ulimit -f {file_blocks}")
    if steps:
        a = ["/bin/sh", "-ec", "; ".join(steps) + '; exec "$@"', "sh", *a]
    return a
