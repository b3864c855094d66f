"""The bubblewrap side of the sandbox: finding ``bwrap``, its options, the seccomp filter, and the
util-linux helpers (``setpriv``, ``unshare``) an exec run by root needs.

The sandbox's isolation model is described in :mod:`.container`; this module only answers "what
can this host's bwrap do" and "what filter does it load".
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import tempfile

from ....errors import ResourceUnavailable

__all__ = ["SECCOMP_DENY", "bwrap_has", "find_bwrap", "seccomp_filter_bpf", "setpriv", "unshare"]

log = logging.getLogger(__name__)

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
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError when libseccomp.so.2 is missing
        log.warning("sandbox: no seccomp filter (%s); install agentfly-gym[sandbox] (pyseccomp) and libseccomp2", e)
        bpf = None
    _seccomp_cache.append(bpf)
    return bpf


_bwrap_help: list[str] = []


def bwrap_has(option: str) -> bool:
    """Whether the installed bwrap knows ``option`` (its ``--help``, read once per process)."""
    if not _bwrap_help:
        try:
            r = subprocess.run([find_bwrap(), "--help"], capture_output=True, text=True, timeout=30, check=False)
            _bwrap_help.append(r.stdout + r.stderr)
        except (OSError, subprocess.SubprocessError):
            _bwrap_help.append("")
    return option in _bwrap_help[0]


def setpriv() -> str:
    """The ``setpriv`` program (util-linux) that drops the exec to the instance's host user.

    Raises:
        ResourceUnavailable: not installed.
    """
    path = shutil.which("setpriv")
    if path is None:
        raise ResourceUnavailable("the sandbox backend run as root needs 'setpriv' (util-linux) to run "
                                  "sandboxes as an unprivileged host user; install util-linux")
    return path


def unshare() -> str:
    """The ``unshare`` program (util-linux) that gives an exec run by root a private mount namespace.

    Raises:
        ResourceUnavailable: not installed.
    """
    path = shutil.which("unshare")
    if path is None:
        raise ResourceUnavailable("the sandbox backend run as root needs 'unshare' (util-linux); install util-linux")
    return path
