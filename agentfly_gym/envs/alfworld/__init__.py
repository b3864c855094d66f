"""ALFWorld (Shridhar et al., 2021, MIT licence) as ``agentfly/ALFWorld-v0``.

Pieces: :mod:`.games` (data location, splits, task types, the cached index of solvable
games), :mod:`.logic` (game-file releases 2.1.1/2.1.2 and the upgrade to what alfworld 0.4
plays), :mod:`.simulator` (the TextWorld PDDL engine with ALFWorld's demangler, run as an
in-process resource), :mod:`.planner` (the expert's plans, computed in a child process and
cached on disk) and :mod:`.env` (the Gymnasium environment).  Importing this package imports
neither ``alfworld`` nor ``textworld``; the simulator does when it is built.
"""

from typing import TYPE_CHECKING

from ...utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on
    # first use (agentfly_gym.utils.lazy), so `agentfly-gym envs` imports no engine or simulator module
    from .env import SIMULATOR_FACTORY, ALFWorldEnv
    from .games import (
        TASK_TYPES,
        GameIndex,
        GameRecord,
        load_index,
        parse_task_types,
        resolve_alfworld_root,
    )
    from .logic import game_version, upgrade_game
    from .planner import ExpertPlanError, ExpertPlanTimeout, compute_plan
    from .simulator import NOTHING_HAPPENS, ALFWorldSimulator

__getattr__, __dir__ = lazy_exports(__name__, {
    "ALFWorldEnv": "env",
    "ALFWorldSimulator": "simulator",
    "ExpertPlanError": "planner",
    "ExpertPlanTimeout": "planner",
    "GameIndex": "games",
    "GameRecord": "games",
    "NOTHING_HAPPENS": "simulator",
    "SIMULATOR_FACTORY": "env",
    "TASK_TYPES": "games",
    "compute_plan": "planner",
    "game_version": "logic",
    "load_index": "games",
    "parse_task_types": "games",
    "resolve_alfworld_root": "games",
    "upgrade_game": "logic",
})

__all__ = [
    "NOTHING_HAPPENS",
    "SIMULATOR_FACTORY",
    "TASK_TYPES",
    "ALFWorldEnv",
    "ALFWorldSimulator",
    "ExpertPlanError",
    "ExpertPlanTimeout",
    "GameIndex",
    "GameRecord",
    "compute_plan",
    "game_version",
    "load_index",
    "parse_task_types",
    "resolve_alfworld_root",
    "upgrade_game",
]
