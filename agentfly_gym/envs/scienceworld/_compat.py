"""Workarounds for the scienceworld package (1.2.x) and py4j (0.10.9.x), version-guarded.

:func:`jvm_in_own_process_group`: the package starts its JVM with ``py4j.java_gateway.launch_gateway`` in the
caller's process group, so a terminal's Ctrl-C (SIGINT to the whole foreground group) kills every JVM at once,
and each rollout's py4j client then prints "Answer from Java side is empty" tracebacks while the run is being
stopped in order.  The package does not pass py4j's ``create_new_process_group`` (and that option runs
``os.setpgrp`` as a ``preexec_fn``, unsafe in a threaded process), so while the package launches a JVM, the
``Popen`` that ``launch_gateway`` calls gets ``process_group=0`` (Python 3.11+: set in the child without running
Python code there).  The JVM still dies with this process (py4j's ``die_on_exit``: its stdin closes), and the
rollout stops it itself on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import subprocess
import sys
from collections.abc import Iterator

log = logging.getLogger(__name__)

#: py4j versions whose ``launch_gateway`` calls the module-level ``Popen`` (checked: 0.10.9.x).
_PY4J_CHECKED = ("0.10.9",)


def _applies() -> bool:
    try:
        version = importlib.metadata.version("py4j")
    except importlib.metadata.PackageNotFoundError:
        return False
    return sys.version_info >= (3, 11) and version.startswith(_PY4J_CHECKED)


@contextlib.contextmanager
def jvm_in_own_process_group() -> Iterator[None]:
    """While the block runs, JVMs launched by py4j start in a process group of their own (see the module
    docstring).  Not thread-safe by itself: hold the simulator's launch lock around it.  A no-op for py4j
    versions not checked."""
    if not _applies():
        yield
        return
    import py4j.java_gateway as gateway

    original = gateway.Popen
    if original is not subprocess.Popen:  # someone else patched it: leave it alone
        yield
        return
    gateway.Popen = functools.partial(subprocess.Popen, process_group=0)
    try:
        yield
    finally:
        gateway.Popen = original
