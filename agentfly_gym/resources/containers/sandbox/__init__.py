"""The daemon-less sandbox container backend: bubblewrap over a read-only root file system.

Modules, one concern each: :mod:`.container` (the :class:`SandboxContainer` resource and its
isolation model), :mod:`.bwrap` (the ``bwrap`` program, its options, the seccomp filter),
:mod:`.rootfs` (which folder an image means), :mod:`.cgroups` (memory, pids and CPU limits),
:mod:`.volume` (the disk limit).  Reaping what dead managers left is in :mod:`..ownership`.
"""

from .bwrap import find_bwrap, seccomp_filter_bpf
from .cgroups import SANDBOX_LIMITS_ENV, detect_limit_mode
from .container import SANDBOX_DIR_ENV, SandboxContainer, SandboxPathError, create, sandbox_root
from .rootfs import resolve_rootfs

__all__ = [
    "SANDBOX_DIR_ENV", "SANDBOX_LIMITS_ENV", "SandboxContainer", "SandboxPathError", "create",
    "detect_limit_mode", "find_bwrap", "resolve_rootfs", "sandbox_root", "seccomp_filter_bpf",
]
