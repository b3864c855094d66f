"""ScienceWorld (``agentfly/ScienceWorld-v0``): 30 elementary-science tasks in a text simulator.

``ScienceWorldEnv`` is the Gymnasium env; ``ScienceWorldSimulator`` is the JVM-backed
simulator it obtains from the resource manager; ``tasks`` holds the task catalogue.
Importing this package starts nothing.
"""

from .env import SCIENCEWORLD_PROMPT, ScienceWorldEnv
from .simulator import FACTORY, ScienceWorldSimulator
from .tasks import SIMPLIFICATIONS, SPLITS, parse_task_id, resolve_task_name, task_names

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
