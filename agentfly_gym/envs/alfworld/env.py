"""``agentfly/ALFWorld-v0``: ALFWorld's text household tasks as an agentfly-gym environment."""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any, ClassVar

from ...errors import ConfigError, ResetNeeded
from ...resources.inprocess import ObjectProxy, forward
from ...resources.protocol import Manager
from ...resources.scope import RolloutScope
from ...resources.spec import InProcessSpec, parse_bytes
from ..base import AgentFlyEnv, StepResult
from ..prompting import AgentPrompt
from .games import GameIndex, GameRecord, load_index, resolve_alfworld_root
from .planner import ExpertPlanError, compute_plan
from .simulator import ALFWorldSimulator

__all__ = ["SIMULATOR_FACTORY", "ALFWorldEnv"]

SIMULATOR_FACTORY = "agentfly_gym.envs.alfworld.simulator:ALFWorldSimulator"


class ALFWorldProxy(ObjectProxy):
    """The async, typed face of a pooled :class:`ALFWorldSimulator`."""

    load = forward(ALFWorldSimulator.load)
    step = forward(ALFWorldSimulator.step)

_SYSTEM_TEMPLATE = """\
You are an agent in a household (ALFWorld, the text version of the ALFRED benchmark). The first \
observation describes the room and ends with "Your task is to: ...". Act with one text command per turn. \
Commands: go to <receptacle>, open <receptacle>, close <receptacle>, take <object> from <receptacle>, \
{put}, clean <object> with <receptacle>, heat <object> with <receptacle>, \
cool <object> with <receptacle>, use <object>, examine <object or receptacle>, look, inventory{help}. \
Name things exactly as the observations do, with their number (e.g. "take apple 1 from countertop 2"). \
A command that cannot be done gives "Nothing happens.". \
Think briefly, then end each reply with one line: Action: <command>"""
# alfworld 0.4 (game files 2.1.2, the default) and game files played as stored (2.1.1 wording).
_SYSTEM_PROMPT = _SYSTEM_TEMPLATE.format(put="move <object> to <receptacle>", help=", help")
_SYSTEM_PROMPT_2_1_1 = _SYSTEM_TEMPLATE.format(put="put <object> in/on <receptacle>", help="")


class ALFWorldEnv(AgentFlyEnv):
    """ALFWorld's text household tasks (Shridhar et al., 2021), the TextWorld/PDDL version.

    Observation and action are text.  ``reset`` picks a solvable game of the split (uniformly
    with ``self.np_random``, or ``options={"task_id": ...}``) and returns the engine's intro,
    which ends with ``"Your task is to: <goal>."``; each step applies one command such as
    ``"go to countertop 1"``.  A command that is not admissible (also an empty or overlong one, or
    one in other letter case) changes nothing and gives ``"Nothing happens."``.

    Observations, admissible commands (sorted, as TextWorld gives them), reward and the end of the
    episode are those of alfworld 0.4.2's ``AlfredTWEnv`` (``alfred_tw_env.py``; checked side by
    side by ``tests/test_alfworld_fidelity.py`` and ``benchmarks/fidelity_alfworld.py``).  ALFWorld
    0.4 plays game files of release 2.1.2; a json_2.1.1 file (as older downloads hold) is upgraded
    to it in memory (:mod:`~agentfly_gym.envs.alfworld.logic`), so walking answers ``"You arrive at
    drawer 1. ..."``, objects are put down with ``move <object> to <receptacle>`` and ``help`` is a
    command.  ``upgrade_games=False`` plays the files as stored (2.1.1: ``"You arrive at loc 6.
    ..."``, ``put <object> in/on <receptacle>``, as alfworld <= 0.3 and prompts written for it).

    Reward: 1.0 on the step that wins the game, else 0.0 (ALFWorld's score); ``terminated`` when
    won.  Episodes are truncated after ``max_episode_steps`` (50, ALFWorld's evaluation budget;
    ``AlfredTWEnv`` reports such a step as done with its ``Limit`` wrapper).

    Info keys besides the standard ones: ``admissible_actions`` (sorted list[str]),
    ``task_type`` (str), ``goal`` (str, reset only), ``applied`` (bool, step only: whether the
    command was admissible).  ``score`` is 1.0 when won, else 0.0.

    The simulator (:class:`~agentfly_gym.envs.alfworld.simulator.ALFWorldSimulator`) comes from the
    resource manager as ``InProcessSpec(factory=SIMULATOR_FACTORY, max_instances=max_instances,
    max_uses=max_uses)``; environments with equal settings share one pool, and a simulator
    that served an episode is reset before it serves another.

    Args:
        data_dir: the ALFWorld data root (holding ``json_2.1.1/``); default: ``$ALFWORLD_DATA``,
            ``$AGENTFLY_GYM_DATA/alfworld`` or ``~/.cache/alfworld``.
        split: ``"train"`` (folder ``train`` or ``valid_train``), ``"valid_seen"`` (140 games),
            ``"valid_unseen"`` (134 games), or ALFWorld's ``"eval_in_distribution"`` /
            ``"eval_out_of_distribution"``; the names common to every env work too: ``"validation"``
            (``valid_seen``) and ``"test"`` (``valid_unseen``).
        task_types: ``None`` for all six, or ids (1-6) / names of
            :data:`~agentfly_gym.envs.alfworld.games.TASK_TYPES`.
        max_instances: most simulators alive at once in the shared pool (~100-200 MB each).
        max_uses: recycle a simulator after this many episodes (``None``: never).
        max_rss_growth: bytes (or ``"1g"``) of process memory growth after which a simulator is
            replaced (see ``ALFWorldSimulator``); ``None`` disables the watch.
        planner_timeout: seconds the expert planner may take for one plan.
        plan_cache: keep expert plans on disk (``$AGENTFLY_GYM_CACHE/alfworld/plans``).
        upgrade_games: play json_2.1.1 game files as alfworld 0.4.2 plays its own download
            (release 2.1.2); ``False``: play every game file as stored.
        normalize_actions: when an action is not admissible as given, retry it lower-cased with
            runs of whitespace collapsed (``"Go to  Desk 1"`` -> ``"go to desk 1"``).  Off by
            default: ALFWorld answers such a command with ``"Nothing happens."``.
        manager, step_timeout, reset_timeout, max_episode_steps, render_mode: see
            :class:`~agentfly_gym.envs.base.AgentFlyEnv`.

    Raises:
        DataNotFoundError: the ALFWorld data is not found (the message says to run ``alfworld-download``).
        ConfigError: a bad split, task type or setting.
    """

    env_name: ClassVar[str] = "ALFWorld"
    agent_prompt: ClassVar[AgentPrompt] = AgentPrompt(system=_SYSTEM_PROMPT)
    reset_options = MappingProxyType({"task_id": "a game's task id (see the games property)"})
    max_observation_length: ClassVar[int] = 1 << 16
    max_action_length: ClassVar[int] = 1 << 12

    def __init__(self, *, data_dir: str | os.PathLike | None = None, split: str = "train",
                 task_types: int | str | Iterable[int | str] | None = None, max_instances: int = 32,
                 max_uses: int | None = 500, max_rss_growth: int | str | None = "2g",
                 planner_timeout: float | None = 300.0, plan_cache: bool = True, upgrade_games: bool = True,
                 normalize_actions: bool = False,
                 manager: Manager | None = None, step_timeout: float | None = 60.0,
                 reset_timeout: float | None = 900.0, max_episode_steps: int | None = 50,
                 render_mode: str | None = None) -> None:
        super().__init__(manager=manager, step_timeout=step_timeout, reset_timeout=reset_timeout,
                         max_episode_steps=max_episode_steps, render_mode=render_mode)
        if planner_timeout is not None and planner_timeout <= 0:
            raise ConfigError(f"planner_timeout={planner_timeout!r} must be None or > 0 seconds")
        self.data_root = resolve_alfworld_root(data_dir)
        self.index: GameIndex = load_index(self.data_root, split, task_types)
        self._task_types = task_types
        rss = parse_bytes(max_rss_growth, field="max_rss_growth")
        self.upgrade_games = bool(upgrade_games)
        if not self.upgrade_games:
            self.agent_prompt = AgentPrompt(system=_SYSTEM_PROMPT_2_1_1)
        self.simulator_spec = InProcessSpec(factory=SIMULATOR_FACTORY,
                                            kwargs={"max_rss_growth": rss, "upgrade_games": self.upgrade_games},
                                            max_instances=max_instances, max_uses=max_uses, start_timeout=120.0,
                                            name="alfworld-simulator")
        self.planner_timeout = planner_timeout
        self.plan_cache = bool(plan_cache)
        self.normalize_actions = bool(normalize_actions)
        self._sim: ALFWorldProxy | None = None
        self._game: GameRecord | None = None
        self._admissible: list[str] = []
        self._history: list[str] = []
        self._plan: list[str] | None = None
        self._plan_base: list[str] = []
        self._won = False

    @property
    def games(self) -> tuple[GameRecord, ...]:
        """The solvable games this env draws from (split and task-type filter applied)."""
        return self.index.games

    async def atask_ids(self, split: str | None = None) -> list[str]:
        """The task ids of the solvable games of ``split`` (None: the env's split; the env's task-type filter
        applies), in the index's stable order.  Resetting with one needs an env of that split.

        Raises:
            ConfigError: an unknown or missing split.
        """
        index = self.index if split is None else load_index(self.data_root, split, self._task_types)
        return [g.task_id for g in index.games]

    # ------------------------------------------------------------------ episode
    def episode_resource_specs(self) -> list:
        """Every episode holds one simulator of :attr:`simulator_spec`."""
        return [self.simulator_spec]

    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "task_id" in options:
            game = self.index.by_task_id(options["task_id"])
        else:
            game = self.index.games[int(self.np_random.integers(len(self.index.games)))]
        self._sim = None
        self._game = game
        self._task_id = game.task_id
        self._history, self._plan, self._plan_base, self._won = [], None, [], False
        sim = ALFWorldProxy(await scope.acquire(self.simulator_spec))
        obs, info = await sim.load(str(game.game_file))
        self._sim = sim
        self._admissible = info["admissible_actions"]
        self._won = bool(info["won"])
        return obs, {"admissible_actions": list(self._admissible), "won": self._won, "score": float(self._won),
                     "task_type": game.task_type, "goal": info["goal"]}

    async def _step_episode(self, action: str) -> StepResult:
        sim = self._sim
        if sim is None or self._game is None:
            raise ResetNeeded("ALFWorld: no episode is running; call reset() first")
        command = action.strip()
        if self.normalize_actions and command not in self._admissible:
            normalized = " ".join(command.split()).lower()
            if normalized in self._admissible:
                command = normalized
        obs, won, admissible, applied = await sim.step(command)
        if applied:
            self._history.append(command)
        self._admissible = admissible
        self._won = bool(won)
        reward = 1.0 if won else 0.0
        info = {"admissible_actions": list(admissible), "won": self._won, "score": reward,
                "task_type": self._game.task_type, "applied": bool(applied)}
        return obs, reward, self._won, False, info

    async def _end_of_episode(self) -> None:
        self._sim = None

    # ------------------------------------------------------------------ expert
    async def expert_action(self) -> str:
        """The expert's next command for the current episode.

        The plan (Fast Downward's plan for the game's PDDL, ALFWorld's planner expert) is computed
        once per episode in a child process with ``planner_timeout`` and cached on disk; while the
        agent follows it, later calls cost nothing.  After the agent deviates, the next call plans
        again from the current state (also cached).

        Raises:
            ResetNeeded: no episode is running.
            ExpertPlanTimeout: the planner took longer than ``planner_timeout`` seconds.
            ExpertPlanError: the planner found no plan or failed (the message says why).
        """
        if self._scope is None or self._game is None or self._sim is None:
            raise ResetNeeded("ALFWorld: no episode is running; call reset() first")
        if self._won:
            raise ExpertPlanError(f"ALFWorld expert: game {self._task_id} is already won; no action is left")
        k = len(self._plan_base)
        done = self._history[k:]
        if (self._plan is None or self._history[:k] != self._plan_base or done != self._plan[:len(done)]
                or len(done) >= len(self._plan)):
            base = list(self._history)
            plan = await compute_plan(self._game.game_file, base, timeout=self.planner_timeout,
                                      use_cache=self.plan_cache, upgrade=self.upgrade_games)
            if not plan:
                raise ExpertPlanError(f"ALFWorld expert: the planner returned an empty plan for {self._task_id} "
                                      "although the game is not won")
            self._plan, self._plan_base, done = plan, base, []
        return self._plan[len(done)]
