"""The daemon-less sandbox container backend: bubblewrap over a read-only root file system.

Modules, one concern each: :mod:`.container` (the :class:`SandboxContainer` resource and its
isolation model), :mod:`.mounts` (its mount plan), :mod:`.files` (``put_files`` / ``get_file``),
:mod:`.argv` (an exec's command line), :mod:`.bwrap` (the ``bwrap`` program, its options, the seccomp filter),
:mod:`.rootfs` (which folder an image means), :mod:`.cgroups` (memory, pids and CPU limits),
:mod:`.volume` (the disk limit).  Reaping what dead managers left is in :mod:`..reaper`.
"""

from .bwrap import find_bwrap, seccomp_filter_bpf
from .cgroups import SANDBOX_LIMITS_ENV, detect_limit_mode
from .container import SANDBOX_DIR_ENV, SandboxContainer, create, sandbox_root
from .files import SandboxPathError
from .rootfs import resolve_rootfs

__all__ = [
    "SANDBOX_DIR_ENV", "SANDBOX_LIMITS_ENV", "SandboxContainer", "SandboxPathError", "create",
    "detect_limit_mode", "find_bwrap", "resolve_rootfs", "sandbox_root", "seccomp_filter_bpf",
]
