"""``agentfly-gym r2e build-tasks``: build the local R2E-Gym task set (:mod:`agentfly_gym.envs.r2egym.local_tasks`)."""

from __future__ import annotations

import argparse
import sys

from ..envs.r2egym.local_tasks import LOCAL_BUGS, TaskBuildError, build_local_tasks, default_tasks_dir
from ..errors import ConfigError

__all__ = ["build_tasks_main"]


def build_tasks_main(args: list[str] | None = None) -> int:
    """CLI entry of ``agentfly-gym r2e build-tasks [--out DIR] [--force] [--only ID ...]``.  Returns the exit status."""
    ap = argparse.ArgumentParser(prog="agentfly-gym r2e build-tasks",
                                 description="Build the local R2E-Gym task set from pinned PyPI sdists.")
    ap.add_argument("--out", default=None, help=f"output folder (default: {default_tasks_dir()})")
    ap.add_argument("--force", action="store_true", help="rebuild tasks that are already built")
    ap.add_argument("--only", nargs="*", default=None, help="task ids to build (default: all)")
    ns = ap.parse_args(args)
    bugs = LOCAL_BUGS
    if ns.only:
        known = {b.task_id: b for b in LOCAL_BUGS}
        unknown = [i for i in ns.only if i not in known]
        if unknown:
            print(f"unknown task ids {unknown}; known: {sorted(known)}", file=sys.stderr)
            return 2
        bugs = tuple(known[i] for i in ns.only)
    try:
        build_local_tasks(ns.out, bugs=bugs, force=ns.force)
    except (TaskBuildError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
