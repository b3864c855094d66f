"""``agentfly/ScienceWorld-v0``: ScienceWorld's 30 science tasks as an async Gymnasium text env.

Each episode takes a :class:`~.simulator.ScienceWorldSimulator` (one JVM) from the resource
manager's pool for the spec :meth:`ScienceWorldEnv.simulator_spec` builds; the JVM is reset
and reused by later episodes (a new task is loaded on the same JVM) and replaced if it dies.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar

from ...errors import ConfigError
from ...limits import check_int
from ...resources.inprocess import ObjectProxy, forward
from ...resources.protocol import Manager
from ...resources.scope import RolloutScope
from ...resources.spec import InProcessSpec
from ..base import AgentFlyEnv, StepResult
from ..prompting import AgentPrompt
from .simulator import FACTORY, ScienceWorldSimulator
from .tasks import (
    SPLITS,
    check_simplification,
    check_variation_in_split,
    format_task_id,
    parse_task_id,
    resolve_task_name,
    task_names,
)

__all__ = ["SCIENCEWORLD_PROMPT", "ScienceWorldEnv"]

SCIENCEWORLD_PROMPT = AgentPrompt(system=(
    "You are an agent in ScienceWorld, a text-based simulation of elementary science experiments "
    "(boiling, melting, electrical circuits, growing plants, genetics, ...). Each observation describes "
    "what you see; the first one starts with your task. Act with one text command per turn, for example:\n"
    "  look around | look at OBJ | look in OBJ | inventory | task\n"
    "  go to LOC | teleport to LOC | open OBJ | close OBJ | open door to kitchen\n"
    "  pick up OBJ | put down OBJ | move OBJ to OBJ | pour OBJ in OBJ | dunk OBJ in OBJ | mix OBJ\n"
    "  activate OBJ | deactivate OBJ | use OBJ on OBJ | connect OBJ to OBJ | disconnect OBJ\n"
    "  read OBJ | eat OBJ | flush OBJ | wait | wait1 | focus on OBJ\n"
    "'focus on OBJ' tells the simulator which object your task is about: focusing on a wrong object "
    "fails the task, so focus only when the task asks for it. When the simulator answers 'Ambiguous "
    "request', reply with the number of the option you mean. The episode ends when the task is completed "
    "or failed.\n"
    "Think briefly, then end your reply with one line 'Action: <command>', e.g. 'Action: open door to kitchen'."
))

_RESET_OPTIONS = MappingProxyType({
    "task_name": "a task name or number (see task_names())",
    "task_id": "'<task name>:<variation>' (instead of task_name and variation)",
    "variation": "the variation (int >= 0) in the split",
    "split": "'train', 'dev' (or 'validation') or 'test'",
    "simplification": "simplifications string, e.g. 'easy'",
    "with_admissible_actions": "bool: list valid actions in info",
    "expert": "bool: plan the gold path at load",
})


class ScienceWorldProxy(ObjectProxy):
    """The async, typed face of a pooled :class:`ScienceWorldSimulator` (one JVM)."""

    split_variations = forward(ScienceWorldSimulator.split_variations)
    load = forward(ScienceWorldSimulator.load)
    step = forward(ScienceWorldSimulator.step)
    gold_actions = forward(ScienceWorldSimulator.gold_actions)
    inventory = forward(ScienceWorldSimulator.inventory)
    look = forward(ScienceWorldSimulator.look)


class ScienceWorldEnv(AgentFlyEnv):
    """ScienceWorld (Wang et al. 2022, PyPI ``scienceworld`` 1.2.3) as a text environment.

    Observation: text; on reset the task description, a blank line and the output of ``look
    around``; on step the simulator's answer.  Action: one command (str), e.g. ``"open door to
    kitchen"``; an unknown or empty command yields "No known action matches that input." and
    reward 0, never an exception.

    Reward: ``(score_t - score_{t-1}) / 100`` with the simulator's task score in -100..100
    (``round(100 * getScore())``) and ``score_0 = 0``, so the return equals the final score / 100
    (1.0 for a completed task, -1.0 for a failed one).  ``terminated`` when the task is completed
    or failed (score < 0); ``info["won"]`` is completed with score 100; ``info["score"]`` is the
    raw score (int).  Other info keys: ``moves`` (the simulator's move count), ``task_name``,
    ``variation``, ``simplification``, and ``admissible_actions`` (list[str]) when
    ``with_admissible_actions`` is on (it costs 5-300 ms per step, so it is off by default).

    Args:
        task_name: default task (name, task id like ``"1-1"`` or index 0..29); ``None`` draws one
            uniformly with ``self.np_random`` at each reset.
        variation: default variation (int); ``None`` draws one from ``split``.
        split: ``"train"``, ``"dev"`` (also named ``"validation"``) or ``"test"``: the simulator's own variation splits
            (``getVariationsTrain/Dev/Test``) from which variations are drawn; an explicit
            ``variation`` (or ``task_id``) must belong to it (ConfigError otherwise).
        simplification: comma-separated simplifications; default ``"easy"`` (teleport actions,
            open doors and containers, self-watering pots, no electrical actions except in the
            electrical tasks), the setting most LM-agent work uses.  The raw package's default
            (``ScienceWorldEnv.load(..., simplificationStr="")``) is ``""``, no simplification: pass
            ``simplification=""`` to run the package's own setting.  The two are different
            environments: under ``"easy"`` doors start open (so a task can start with points, e.g.
            8), ``teleport to LOC`` exists, and valid-action lists have no ``connect`` actions outside
            the electrical tasks; compare results only at the same setting.  Gold paths are as long
            under both except where plants must be watered by hand under ``""`` (grow-fruit and
            mendelian-genetics: up to 15 steps longer; ``benchmarks/results/scienceworld_gold_paths.json``).
        with_admissible_actions: add ``info["admissible_actions"]`` on reset and every step.
        max_instances: the most ScienceWorld JVMs the manager runs for envs with these settings;
            further episodes wait for a free one.  With the default heap a JVM holds ~120 MB at its
            first reset and 185-510 MB resident while episodes run (mean ~330 MB: its heap grows
            towards ``-Xmx400m`` and is partly given back after collections; 4 JVMs over 80
            episodes, ``benchmarks/bench_memory_growth.py``): budget ~500 MB per JVM.
        java_heap: the JVM's ``-Xmx`` (``"400m"``); ``None`` for the JVM default (~1.2 GB RSS).
        max_idle_time: seconds a JVM the pool keeps idle (after an episode or a closed env) waits for
            the next episode before it is stopped (default 300, as containers); ``None`` keeps idle JVMs
            until the manager closes (for the default manager of sync envs: process exit).
        manager, step_timeout, reset_timeout, max_episode_steps, render_mode: see
            :class:`~agentfly_gym.envs.base.AgentFlyEnv`; here ``step_timeout`` defaults to 60 seconds,
            ``reset_timeout`` includes waiting for a free JVM, and ``max_episode_steps`` defaults to 1000 (gold
            paths reach 770 steps, e.g. inclined-plane-friction-named-surfaces:1086, in the sampled census of
            ``benchmarks/results/scienceworld_gold_paths.json``; a replay can take a few steps more or fewer
            than planned).

    Reset options (override the defaults above for one episode): ``task_name``, ``task_id``
    (``"<task_name>:<variation>"``, as ``info["task_id"]``), ``variation``, ``split``,
    ``simplification``, ``with_admissible_actions``, ``expert`` (bool: plan the gold path at load,
    ~1 s more, instead of on the first :meth:`expert_action`).

    Raises:
        ConfigError: bad arguments or options (unknown task names the valid ones; a variation out
            of range names the valid range and splits).
    """

    env_name: ClassVar[str] = "ScienceWorld"
    agent_prompt: ClassVar[AgentPrompt] = SCIENCEWORLD_PROMPT
    reset_options = _RESET_OPTIONS

    def __init__(self, *, task_name: str | int | None = None, variation: int | None = None, split: str = "train",
                 simplification: str = "easy", with_admissible_actions: bool = False, max_instances: int = 4,
                 java_heap: str | None = "400m", max_idle_time: float | None = 300.0,
                 manager: Manager | None = None,
                 step_timeout: float | None = 60.0, reset_timeout: float | None = 900.0,
                 max_episode_steps: int | None = 1000, render_mode: str | None = None) -> None:
        super().__init__(manager=manager, step_timeout=step_timeout, reset_timeout=reset_timeout,
                         max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.default_task_name = None if task_name is None else resolve_task_name(task_name)
        self.default_variation = self._check_variation(variation)
        self.default_split = self._check_split(split)
        self.default_simplification = check_simplification(simplification, self.default_task_name)
        self.with_admissible_actions = bool(with_admissible_actions)
        check_int("max_instances", max_instances)
        self.resource_spec = self.simulator_spec(max_instances=max_instances, java_heap=java_heap,
                                                 max_idle_time=max_idle_time)
        self._sim: ScienceWorldProxy | None = None
        self._admissible = self.with_admissible_actions
        self._gold: list[str] | None = None

    def episode_resource_specs(self) -> list:
        """Every episode holds one JVM of :attr:`resource_spec`."""
        return [self.resource_spec]

    @staticmethod
    def simulator_spec(*, max_instances: int = 4, java_heap: str | None = "400m",
                       max_idle_time: float | None = 300.0) -> InProcessSpec:
        """The pool spec of the simulators: envs with equal settings share one pool of JVMs.

        Raises:
            ConfigError: ``max_idle_time`` is not ``None`` or a number of seconds > 0.
        """
        return InProcessSpec(factory=FACTORY, kwargs={"java_heap": java_heap}, max_instances=max_instances,
                             max_idle_time=max_idle_time, start_timeout=120.0, close_timeout=30.0,
                             name="scienceworld")

    # ------------------------------------------------------------------ episode
    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        variation = self._check_variation(options.get("variation", self.default_variation))
        if options.get("task_id") is not None:
            if "task_name" in options or "variation" in options:
                raise ConfigError("give either task_id or task_name/variation, not both")
            task, variation = parse_task_id(options["task_id"])
        elif options.get("task_name") is not None:
            task = resolve_task_name(options["task_name"])
        elif self.default_task_name is not None:
            task = self.default_task_name
        else:
            names = task_names()
            task = names[int(self.np_random.integers(len(names)))]
        split = self._check_split(options.get("split", self.default_split))
        simplification = check_simplification(options.get("simplification", self.default_simplification), task)
        self._admissible = bool(options.get("with_admissible_actions", self.with_admissible_actions))
        expert = bool(options.get("expert", False))
        self._gold = None

        self._sim = sim = ScienceWorldProxy(await scope.acquire(self.resource_spec))
        splits = await sim.split_variations(task)
        if variation is None:
            pool = splits[split]
            variation = int(pool[int(self.np_random.integers(len(pool)))])
        else:
            check_variation_in_split(task, variation, split, splits)
        obs, info = await sim.load(task, variation, simplification, gold=expert, admissible=self._admissible)
        self._task_id = format_task_id(task, variation)
        if expert:
            self._gold = await sim.gold_actions()
        info.update(task_name=task, variation=variation, simplification=simplification)
        info.pop("completed", None)
        return obs, info

    async def _step_episode(self, action: str) -> StepResult:
        sim = self._sim
        assert sim is not None
        obs, reward, terminated, truncated, info = await sim.step(action, admissible=self._admissible)
        info.pop("completed", None)
        return obs, reward, terminated, truncated, info

    async def _end_of_episode(self) -> None:
        self._sim = None
        self._gold = None

    # ------------------------------------------------------------------ expert
    async def expert_action(self) -> str:
        """The gold action for the current step: ``gold[t]`` after ``t`` steps.

        The gold path is planned once per episode: at load with the ``expert`` reset option,
        else on the first call (the task is reloaded with the gold path and the episode's
        actions so far are replayed, ~1 s plus 16-100 ms per step taken).  Past the end of the
        gold path (the agent deviated) it returns ``"look around"``.

        Raises:
            ResetNeeded: no episode is running.
        """
        _ = self.scope  # raises ResetNeeded outside an episode
        if self._gold is None:
            assert self._sim is not None
            self._gold = await self._sim.gold_actions()
        return self._gold[self._steps] if self._steps < len(self._gold) else "look around"

    async def inventory(self) -> str:
        """The agent's inventory now (a free action: no simulated time passes).

        Raises:
            ResetNeeded: no episode is running.
        """
        _ = self.scope  # raises ResetNeeded outside an episode
        assert self._sim is not None
        return await self._sim.inventory()

    # ------------------------------------------------------------------ validation
    @staticmethod
    def _check_split(split: Any) -> str:
        if split == "validation":
            return "dev"
        if split not in SPLITS:
            raise ConfigError(f"split={split!r} is not one of {list(SPLITS)} (or 'validation', the same as 'dev')")
        return split

    async def atask_ids(self, split: str | None = None) -> list[str]:
        """The task ids ``"<task_name>:<variation>"`` of ``split`` (None: the env's split) for the env's task
        (all 30 when it has none), in task then variation order.

        Starts a simulator from the env's pool and loads each task once (0.3-1 s each, then cached per
        process).

        Raises:
            ConfigError: an unknown split.
        """
        split = self._check_split(self.default_split if split is None else split)
        names = [self.default_task_name] if self.default_task_name is not None else list(task_names())
        async with self.manager.scope(f"{self.env_name}-task-ids") as scope:
            sim = ScienceWorldProxy(await scope.acquire(self.resource_spec))
            out = []
            for name in names:
                out += [format_task_id(name, v) for v in (await sim.split_variations(name))[split]]
        return out

    @staticmethod
    def _check_variation(variation: Any) -> int | None:
        if variation is None:
            return None
        check_int("variation", variation, minimum=0, optional=True)
        return variation
