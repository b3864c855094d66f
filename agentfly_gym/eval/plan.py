"""Which tasks an evaluation plays: per environment, its split and its task ids.

``tasks`` is ``"all"`` (every task the split lists), a number N (the split's first N tasks in the env's order, as
lm-evaluation-harness's ``--limit`` takes the first N documents) or task ids.  The split is ``test`` by default
for an env whose constructor takes a ``split`` argument (:func:`~agentfly_gym.data.task_draw.takes_argument`),
else the env's own tasks.  An env that lists no tasks (Chess play mode, a user's env without ``atask_ids``)
plays N seeds instead: task ``seed=i`` resets with seed ``i``, for i in 0..N-1.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["EVAL_SPLIT", "SEED_PREFIX", "EnvTasks", "parse_tasks", "plan_tasks"]

log = logging.getLogger(__name__)

#: The split an evaluation plays when none is given, for envs with a ``split`` argument.
EVAL_SPLIT = "test"
#: The label of a task drawn from a seed (an env that lists no tasks): ``seed=<i>``.
SEED_PREFIX = "seed="


@dataclasses.dataclass(frozen=True)
class EnvTasks:
    """The tasks one env plays.

    Attributes:
        env_id: the registered env id (``agentfly/Chess-v0``).
        split: the split (None: the env has none, or its default).
        env_kwargs: the env's constructor arguments (``split`` included when set).
        tasks: task labels in play order: task ids, or ``seed=<i>`` for an env that lists no tasks.
        seeded: True when the labels are seeds (the env lists no tasks).
    """

    env_id: str
    split: str | None
    env_kwargs: dict[str, Any]
    tasks: list[str]
    seeded: bool = False

    def reset_of(self, task: str) -> tuple[str | None, int | None]:
        """``(task_id, seed)`` of a task label: a listed task's id and no seed, or no id and the label's seed."""
        if self.seeded:
            return None, int(task[len(SEED_PREFIX):])
        return task, None


def parse_tasks(text: str | int | Sequence[str] | None) -> str | int | list[str]:
    """``--tasks``: ``"all"``, a count (``"20"``) or comma-separated ids (``"a,b"``) -> ``"all"``, an int or a list.

    Raises:
        ConfigError: an empty value or a count < 1.
    """
    if text is None:
        return "all"
    if isinstance(text, bool):
        raise ConfigError(f"tasks={text!r} must be 'all', a count >= 1 or task ids")
    if isinstance(text, int):
        if text < 1:
            raise ConfigError(f"tasks={text!r}: a count must be >= 1")
        return text
    if not isinstance(text, str):
        ids = [str(t) for t in text]
        if not ids:
            raise ConfigError("tasks is an empty list; give 'all', a count or task ids")
        return list(dict.fromkeys(ids))
    text = text.strip()
    if text == "all":
        return "all"
    if text.isdigit():
        return parse_tasks(int(text))
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if not ids:
        raise ConfigError(f"--tasks {text!r}: give 'all', a count (e.g. 20) or task ids separated by commas")
    return list(dict.fromkeys(ids))


def plan_tasks(env_id: str, tasks: str | int | Sequence[str] | None = "all", *, split: str | None = None,
               env_kwargs: Mapping[str, Any] | None = None, default_split: str | None = EVAL_SPLIT) -> EnvTasks:
    """The tasks ``env_id`` plays (see the module docstring).  Makes the env once to list its tasks.

    ``default_split`` is the split of an env with splits when neither ``split`` nor ``env_kwargs`` name one
    (:data:`EVAL_SPLIT`; None: the env's own default, as ``agentfly-gym rollout`` has it).

    Raises:
        ConfigError: an unknown env or split, constructor arguments it does not take, ``tasks="all"`` (or ids) on
            an env that lists no tasks, an unknown task id, or a split with no task.
        DataNotFoundError: the env's data is missing.
    """
    from ..data.task_draw import check_env_kwargs, env_class, list_tasks, takes_argument
    from ..registration import normalize_env_id

    env_id = normalize_env_id(env_id)
    spec = parse_tasks(tasks)
    kwargs = dict(env_kwargs or {})
    cls = env_class(env_id)
    if split is not None and "split" in kwargs and kwargs["split"] != split:
        raise ConfigError(f"{env_id}: --split {split!r} and env_kwargs split={kwargs['split']!r} disagree")
    takes = takes_argument(cls, "split")
    if split is not None and takes is False:
        raise ConfigError(f"{env_id} has no task splits (its constructor takes no split argument), so "
                          f"--split {split!r} cannot be played: leave --split out")
    if split is None and "split" not in kwargs and takes is True:
        split = default_split
    if split is not None:
        kwargs["split"] = split
    check_env_kwargs(env_id, cls, kwargs)
    listed = list_tasks(env_id, kwargs)
    split = kwargs.get("split")
    if listed is None:
        if not isinstance(spec, int):
            raise ConfigError(f"{env_id} lists no tasks (no atask_ids), so --tasks {spec!r} cannot be played; give a "
                              "count N: seeds 0..N-1 are played as its tasks")
        return EnvTasks(env_id, split, kwargs, [f"{SEED_PREFIX}{i}" for i in range(spec)], seeded=True)
    if not listed:
        raise ConfigError(f"{env_id} split={split!r} lists no task here; pick another --split")
    if spec == "all":
        return EnvTasks(env_id, split, kwargs, list(listed))
    if isinstance(spec, int):
        if spec > len(listed):
            log.warning("%s split=%r lists %d tasks; --tasks %d plays all of them", env_id, split, len(listed), spec)
        return EnvTasks(env_id, split, kwargs, list(listed[:spec]))
    known = set(listed)
    unknown = [t for t in spec if t not in known]
    if unknown:
        raise ConfigError(f"{env_id} split={split!r}: no task {unknown[:5]} ({len(unknown)} unknown); its tasks are "
                          f"e.g. {listed[:5]} ({len(listed)} in all)")
    return EnvTasks(env_id, split, kwargs, list(spec))
