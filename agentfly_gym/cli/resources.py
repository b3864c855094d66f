"""``agentfly-gym resources gc``: remove the containers and sandboxes of dead managers
(:mod:`agentfly_gym.resources.containers.reaper`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..resources.containers.reaper import reap_all

__all__ = ["gc_main"]


def gc_main(args: Sequence[str] | None = None) -> int:
    """``agentfly-gym resources gc [--manager ID] [--older-than SECONDS] [--dry-run]``.

    Prints one removed Docker container id or sandbox name per line, then a summary on stderr.
    Returns 0 (a missing Docker engine is reported, not an error: sandboxes are still reaped).
    """
    parser = argparse.ArgumentParser(
        prog="agentfly-gym resources gc",
        description="Remove the containers and sandboxes (folders, processes, cgroups, disk mounts) of dead managers.")
    parser.add_argument("--manager", default=None, help="remove this manager id's resources, alive or not")
    parser.add_argument("--older-than", type=float, default=0.0, metavar="SECONDS",
                        help="only resources created at least this long ago")
    parser.add_argument("--dry-run", action="store_true", help="list, do not remove")
    ns = parser.parse_args(list(args) if args is not None else None)
    containers, sandboxes = reap_all(ns.manager, older_than=ns.older_than, dry_run=ns.dry_run)
    for name in [*(containers or []), *sandboxes]:
        print(name)
    verb = "would remove" if ns.dry_run else "removed"
    docker_part = f"{len(containers)} container(s)" if containers is not None else "no Docker engine answers"
    print(f"{verb} {docker_part} and {len(sandboxes)} sandbox(es)", file=sys.stderr)
    return 0
