"""The ScienceWorld task catalogue, read from the installed ``scienceworld`` package without a JVM.

ScienceWorld has 30 task types (``"boil"``, ``"find-animal"``, ...), each with numbered
variations split by the simulator into train / dev / test sets (``getVariationsTrain`` etc.
on the Scala side).  Task names here are the simulator's own names, e.g. ``"boil"``; the
package's task ids (``"1-1"``), its paper names (``"Matter Changes of State (Boiling)"``)
and the long ids (``"task-1-boil"``) are accepted too, and so is an index into
:func:`task_names` (0..29).
"""

from __future__ import annotations

import functools
import re

from ...errors import ConfigError, ResourceUnavailable

__all__ = [
    "SIMPLIFICATIONS",
    "SPLITS",
    "check_simplification",
    "check_variation_in_split",
    "format_task_id",
    "parse_task_id",
    "resolve_task_name",
    "task_names",
]

#: The variation splits of the simulator, in the order the package defines them.
SPLITS = ("train", "dev", "test")

#: Simplifications the simulator knows (``getPossibleSimplifications``) plus the ``"easy"`` preset,
#: which turns all of them on.  Combine with commas, e.g. ``"teleportAction,openDoors"``.
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")


def _catalogue():
    try:
        from scienceworld.constants import NAME2ID, TASKS
        from scienceworld.utils import infer_task
    except ImportError as e:  # pragma: no cover - the package is a dependency
        raise ResourceUnavailable(
            f"the ScienceWorld environment needs the 'scienceworld' package (pip install scienceworld==1.2.3) "
            f"and Java 11+: {e}") from e
    return TASKS, NAME2ID, infer_task


@functools.cache
def task_names() -> tuple[str, ...]:
    """The 30 task names in the package's task order (task ids 1-1, 1-2, ..., 10-1)."""
    tasks, _, infer_task = _catalogue()
    return tuple(infer_task(t["task_id"]) for t in tasks)


def resolve_task_name(task: str | int) -> str:
    """The simulator's name for ``task``.

    Args:
        task: a task name (``"boil"``), task id (``"1-1"``), paper name, long id
            (``"task-1-boil"``) or an index into :func:`task_names` (int, 0..29).

    Raises:
        ConfigError: unknown task; the message lists the valid names.
    """
    names = task_names()
    if isinstance(task, bool) or not isinstance(task, (str, int)):
        raise ConfigError(f"task_name={task!r} must be a str (e.g. 'boil') or an int index in 0..{len(names) - 1}")
    if isinstance(task, int):
        if not 0 <= task < len(names):
            raise ConfigError(f"task_name index {task} is out of range 0..{len(names) - 1}; tasks: {list(names)}")
        return names[task]
    _, _, infer_task = _catalogue()
    name = infer_task(task.strip())
    if name not in names:
        raise ConfigError(f"unknown ScienceWorld task {task!r}; valid task names: {list(names)}")
    return name


def parse_task_id(task_id: str) -> tuple[str, int]:
    """Split a task id ``"<task_name>:<variation>"`` (as in ``info["task_id"]``) into its parts.

    Raises:
        ConfigError: the string does not have that form or names an unknown task.
    """
    m = re.fullmatch(r"\s*(.+?):(\d+)\s*", task_id) if isinstance(task_id, str) else None
    if m is None:
        raise ConfigError(f"task_id={task_id!r} must look like '<task_name>:<variation>', e.g. 'boil:3'")
    return resolve_task_name(m.group(1)), int(m.group(2))


def format_task_id(task_name: str, variation: int) -> str:
    """``"<task_name>:<variation>"``, the inverse of :func:`parse_task_id`."""
    return f"{task_name}:{variation}"


def check_simplification(simplification: str, task_name: str | None = None) -> str:
    """Validate a comma-separated simplification string; returns it without spaces.

    Raises:
        ConfigError: an unknown simplification, or ``noElectricalAction`` for a task that needs
            electrical actions (the ``power-component*`` and ``*conductivity*`` tasks).
    """
    if not isinstance(simplification, str):
        raise ConfigError(f"simplification={simplification!r} must be a comma-separated str, e.g. 'easy' or ''")
    parts = [p.strip() for p in simplification.split(",") if p.strip()]
    for p in parts:
        if p not in SIMPLIFICATIONS:
            raise ConfigError(f"unknown ScienceWorld simplification {p!r}; valid: {list(SIMPLIFICATIONS)} "
                              "(comma-separated; '' for none)")
    if task_name is not None and "noElectricalAction" in parts and (
            "power-component" in task_name or "conductivity" in task_name):
        raise ConfigError(f"simplification 'noElectricalAction' cannot be used with task {task_name!r}, "
                          "which needs electrical actions")
    return ",".join(parts)


def _describe(variations) -> str:
    """``"21-29"`` for a contiguous run of variations, else ``"12 variations in 0-40"``."""
    vs = sorted(variations)
    if not vs:
        return "none"
    if vs == list(range(vs[0], vs[-1] + 1)):
        return f"{vs[0]}-{vs[-1]}"
    return f"{len(vs)} variations in {vs[0]}-{vs[-1]}"


def check_variation_in_split(task_name: str, variation: int, split: str, splits: dict[str, tuple[int, ...]]) -> None:
    """Refuse an explicit ``variation`` that is not in ``split`` of ``task_name``.

    Args:
        splits: the task's ``{"train": (...), "dev": (...), "test": (...)}`` variation lists, as the
            simulator gives them (``getVariationsTrain/Dev/Test``).

    Raises:
        ConfigError: naming the variation, the split and the split's range, and the split the variation
            belongs to (or every split's range when it belongs to none).
    """
    if variation in splits.get(split, ()):
        return
    ranges = ", ".join(f"{s} {_describe(v)}" for s, v in splits.items())
    home = [s for s, v in splits.items() if variation in v]
    where = (f"it is a {home[0]} variation: pass split={home[0]!r} to use it" if home
             else f"the task's variations are 0..{max(max(v, default=0) for v in splits.values())} ({ranges})")
    raise ConfigError(f"variation={variation!r} of task {task_name!r} is not in the {split!r} split "
                      f"(variations {_describe(splits.get(split, ()))}); {where}")
