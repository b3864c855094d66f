"""ScienceWorld (``agentfly/ScienceWorld-v0``): 30 elementary-science tasks in a text simulator.

``ScienceWorldEnv`` is the Gymnasium env; ``ScienceWorldSimulator`` is the JVM-backed
simulator it obtains from the resource manager; ``tasks`` holds the task catalogue.
Importing this package starts nothing.
"""

from typing import TYPE_CHECKING

from ...utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on
    # first use (agentfly_gym.utils.lazy), so `agentfly-gym envs` imports no engine or simulator module
    from .env import SCIENCEWORLD_PROMPT, ScienceWorldEnv
    from .simulator import FACTORY, ScienceWorldSimulator
    from .tasks import SIMPLIFICATIONS, SPLITS, parse_task_id, resolve_task_name, task_names

__getattr__, __dir__ = lazy_exports(__name__, {
    "FACTORY": "simulator",
    "SCIENCEWORLD_PROMPT": "env",
    "SIMPLIFICATIONS": "tasks",
    "SPLITS": "tasks",
    "ScienceWorldEnv": "env",
    "ScienceWorldSimulator": "simulator",
    "parse_task_id": "tasks",
    "resolve_task_name": "tasks",
    "task_names": "tasks",
})

__all__ = [
           "FACTORY",
           "SCIENCEWORLD_PROMPT",
           "SIMPLIFICATIONS",
           "SPLITS",
           "ScienceWorldEnv",
           "ScienceWorldSimulator",
           "parse_task_id",
           "resolve_task_name",
           "task_names",
]
