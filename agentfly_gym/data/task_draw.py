"""Which tasks a training or validation set plays: the draw shared by the verl plugin's data sets
(``agentfly-gym dataset``) and the TRL bridge's :func:`~agentfly_gym.bridges.trl.task_dataset`.

Without a task list, ``n`` tasks are drawn from the env's task list of a split (:func:`list_tasks`: the env's
``atask_ids()``), as a permutation by ``seed`` without repeats until the split's tasks are used up, leaving
out the task ids of ``excluded``; every row then names its concrete task.  The split names common to every
env are ``train`` (:data:`DEFAULT_SPLIT`), ``validation`` and ``test``; they never share a task.  An env that
lists no tasks (Chess play mode, a user's env without ``atask_ids``) draws each row's task from its seed, and
a warning says that such rows cannot be checked for overlap.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
import warnings
from collections.abc import Collection, Sequence
from typing import Any

from ..errors import ConfigError
from ..limits import check_int

__all__ = ["DEFAULT_SPLIT", "TaskDraw", "check_draw", "check_env_kwargs", "check_seed", "draw_tasks", "env_class",
           "list_tasks", "takes_argument"]

#: The split a data set draws its tasks from when none is given (for envs with a ``split`` argument).
DEFAULT_SPLIT = "train"


@dataclasses.dataclass(frozen=True)
class TaskDraw:
    """What :func:`draw_tasks` decided.

    Attributes:
        env_id: the registered env id.
        n: rows.
        task_ids: row ``i`` plays ``task_ids[i % len(task_ids)]``; None: each row's task comes from its seed.
        split: the split drawn from (None: the env's default, or it has no split).
        env_kwargs: the constructor arguments every row's env gets (``split`` included when set).
        drawn: True when the task ids were drawn from the env's list (not given).
    """

    env_id: str
    n: int
    task_ids: list[str] | None
    split: str | None
    env_kwargs: dict[str, Any]
    drawn: bool

    def task(self, i: int) -> str:
        """Row ``i``'s task id ("" when drawn from the row's seed)."""
        return self.task_ids[i % len(self.task_ids)] if self.task_ids else ""


def env_class(env_id: str) -> type:
    """The class (or creator) a registered env id makes.

    Raises:
        ConfigError: ``env_id`` is not registered.
    """
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error as e:
        raise ConfigError(f"unknown env {env_id!r}: {e}") from None
    ep = spec.entry_point
    return load_env_creator(ep) if isinstance(ep, str) else ep


def takes_argument(cls: Any, name: str) -> bool | None:
    """Whether ``cls``'s constructor takes the argument ``name``: True when a constructor on ``cls``'s way to
    :class:`object` names it (following ``**kwargs`` up the classes), False when none does, None when it cannot
    tell: a function, a signature that cannot be read, a ``functools.partial`` that binds ``name`` already (it
    follows a partial to its function otherwise), a ``**kwargs`` that goes no further up."""
    while isinstance(cls, functools.partial):  # e.g. a tool env's entry point
        if name in cls.keywords:
            return None
        cls = cls.func
    if not isinstance(cls, type):
        return None
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        try:
            params = inspect.signature(vars(klass)["__init__"]).parameters
        except (TypeError, ValueError):
            return None
        if name in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False
    return False


def check_env_kwargs(env_id: str, cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse constructor arguments ``cls`` does not take (unless it takes ``**kwargs``).

    Raises:
        ConfigError: an unknown argument (the message lists the valid keyword arguments).
    """
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        valid = sorted(k for k, p in params.items() if k != "self" and p.kind is p.KEYWORD_ONLY)
        raise ConfigError(f"{env_id} takes no constructor argument(s) {unknown}; valid: {valid}")


def list_tasks(env_id: str, env_kwargs: dict[str, Any] | None = None) -> list[str] | None:
    """The task ids an env made with ``env_kwargs`` lists (its ``atask_ids()``, for the split in its kwargs), or
    None when the env lists none (no ``atask_ids``, or it raises NotImplementedError, e.g. Chess play mode).

    Creates the env once (ScienceWorld loads each of its tasks once: ~15 s for all 30; WebShop starts its server).

    Raises:
        ConfigError: the env rejects the kwargs.
        DataNotFoundError: the env's data is missing.
    """
    import gymnasium

    from ..registration import normalize_env_id
    from ..resources import ResourceManager
    from ..utils.aio import run_sync

    env_id = normalize_env_id(env_id)

    async def run() -> list[str] | None:
        async with ResourceManager() as manager:
            try:
                env = gymnasium.make(env_id, manager=manager, **dict(env_kwargs or {})).unwrapped
            except TypeError as e:
                raise ConfigError(f"{env_id}: {e}") from None
            try:
                lister = getattr(env, "atask_ids", None)
                if lister is None:
                    return None
                try:
                    return [str(t) for t in await lister()]
                except NotImplementedError:  # e.g. Chess play mode
                    return None
            finally:
                await env.aclose()

    return run_sync(run())


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as a plain int: an integer in [0, 2**63) (a NumPy integer too; a bool is not one).

    Raises:
        ConfigError: ``seed`` is not such an integer (the message names ``name``).
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"{name}={seed!r} must be an integer in [0, 2**63), not a {type(seed).__name__}")
    if not 0 <= seed < 2**63:
        raise ConfigError(f"{name}={seed!r} must be an integer in [0, 2**63)")
    return int(seed)


def draw_tasks(env_id: str, tasks: Sequence[str | int] | None = None, n: int | None = None, *,
               split: str | None = None, seed: int = 0, env_kwargs: dict[str, Any] | None = None,
               excluded: Collection[str] = (), excluded_from: str = "the excluded tasks") -> TaskDraw:
    """Decide the tasks of ``n`` rows of ``env_id`` (see the module docstring).

    Args:
        env_id: a registered env id (normalised by the caller: ``agentfly/Chess-v0``).
        tasks: task ids, one row each (cycled up to ``n``); None: drawn from the env's list of ``split``.
        n: rows (default ``len(tasks)``; required without ``tasks``).
        split: the env's task split (its constructor argument ``split``); None: :data:`DEFAULT_SPLIT` for an
            env with a ``split`` argument when the tasks are drawn, else the env's default.
        seed: the permutation of the draw.
        env_kwargs: constructor arguments of the env (checked against its signature).
        excluded: task ids the draw leaves out; a listed task among them is refused.
        excluded_from: what ``excluded`` came from, for the error messages.

    Raises:
        ConfigError: an unknown env, an empty task list, a bad ``n`` or ``seed``, constructor arguments the env
            does not take, a listed task in ``excluded``, a split with no task (left).
        DataNotFoundError: the env's data is missing (when it lists its tasks).
    """
    seed = check_seed(seed)
    task_list = [str(t) for t in tasks] if tasks is not None else None
    if task_list is not None and not task_list:
        raise ConfigError("tasks is empty; give task ids or None (tasks drawn from seeds)")
    if n is None:
        if task_list is None:
            raise ConfigError("give n (rows) or a task list")
        n = len(task_list)
    check_int("n", n)
    if seed + n - 1 >= 2**63:  # row i resets with seed + i
        raise ConfigError(f"seed={seed} with n={n} rows: the last row's seed {seed + n - 1} is past 2**63 - 1")
    kwargs = dict(env_kwargs or {})
    cls = env_class(env_id)
    if split is not None and "split" in kwargs and kwargs["split"] != split:
        raise ConfigError(f"split={split!r} and env_kwargs split={kwargs['split']!r} disagree; give the split once "
                          "(split=)")
    if split is not None and takes_argument(cls, "split") is False:
        raise ConfigError(f"{env_id} has no task splits (its constructor takes no split argument), so split={split!r}"
                          f" cannot be drawn from: leave split out, or give task ids")
    if split is None and task_list is None and "split" not in kwargs and takes_argument(cls, "split") is True:
        split = DEFAULT_SPLIT
    if split is not None:
        kwargs["split"] = split
    check_env_kwargs(env_id, cls, kwargs)
    excluded = set(excluded)
    if task_list is not None:
        clash = sorted(set(task_list) & excluded)
        if clash:
            raise ConfigError(f"{len(clash)} listed task(s) are in {excluded_from}: {clash[:5]}")
        return TaskDraw(env_id, n, task_list, split, kwargs, drawn=False)
    listed = list_tasks(env_id, kwargs)
    if listed is None:
        warnings.warn(f"{env_id} lists no tasks (it has no atask_ids): the rows draw their tasks from seeds "
                      f"{seed}..{seed + n - 1} and record no task id, so their overlap with another data set "
                      "cannot be checked; give task ids (tasks=, --tasks-file) to make it checkable", stacklevel=3)
        return TaskDraw(env_id, n, None, split, kwargs, drawn=False)
    if not listed:
        raise ConfigError(f"{env_id} split={split!r} has no task left: the split lists none here (e.g. "
                          "WebShop's upstream train/validation goals need the full catalog); pick another split")
    pool = [t for t in listed if t not in excluded]
    if not pool:
        raise ConfigError(f"{env_id} split={split!r} has no task left: all {len(listed)} are in {excluded_from}")
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(pool))
    return TaskDraw(env_id, n, [pool[int(order[i % len(pool)])] for i in range(n)], split, kwargs, drawn=True)


def check_draw(draw: TaskDraw, seed: int, reset_options: dict[str, Any] | None = None) -> None:
    """Check that the env accepts the rows of ``draw``: reset it once per distinct listed task (once for tasks
    drawn from its own list, which checks the kwargs and options; once with ``seed`` when the rows draw their tasks
    from seeds) and end each episode at once.  The check of ``agentfly-gym dataset`` and
    :func:`~agentfly_gym.bridges.trl.task_dataset`; costs one episode start per distinct listed task (e.g. ~1 s
    per ScienceWorld task).  Runs on the library's background loop, so it also works from a running event loop.

    Raises:
        ConfigError: the env rejects a task id, the split or a reset option (or its constructor arguments).
        DataNotFoundError: the env's data is missing.
    """
    import gymnasium

    from ..errors import AgentFlyError
    from ..resources import ResourceManager
    from ..utils.aio import run_sync

    tasks = sorted(set(draw.task_ids)) if draw.task_ids else None
    if draw.drawn and tasks:
        tasks = tasks[:1]  # drawn from the env's own list: one reset checks kwargs and options
    options = dict(reset_options or {})

    async def run() -> None:
        async with ResourceManager() as manager:
            try:
                env = gymnasium.make(draw.env_id, manager=manager, **draw.env_kwargs).unwrapped
            except TypeError as e:
                raise ConfigError(f"{draw.env_id}: {e}") from None
            try:
                for task in tasks or [None]:
                    opts = dict(options, task_id=task) if task is not None else dict(options)
                    try:
                        await env.areset(seed=seed, options=opts or None)
                    except AgentFlyError as e:
                        what = f"task {task!r}" if task is not None else f"reset options {options}"
                        raise ConfigError(f"{draw.env_id} rejects {what}: {e}") from e
                    await env.aend_episode()
            finally:
                await env.aclose()

    run_sync(run())
