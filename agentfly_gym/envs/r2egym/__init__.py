"""R2E-Gym: repository-repair tasks in a container, with R2E-Gym's tools and test-based reward.

``gymnasium.make("agentfly/R2EGym-v0")`` gives :class:`R2EGymEnv`; the local task set is
built by :func:`build_local_tasks` (command line: ``agentfly-gym r2e build-tasks``).
"""

from typing import TYPE_CHECKING

from ...utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on
    # first use (agentfly_gym.utils.lazy), so `agentfly-gym envs` imports no engine or simulator module
    from .actions import ActionParseError, ToolCall, parse_action
    from .env import DOCKER_IMAGE, R2EAgentPrompt, R2EGymEnv
    from .grading import compare_test_maps, parse_log_pytest, reward_from_log
    from .local_tasks import (
        LOCAL_BUGS,
        BugSpec,
        TaskBuildError,
        build_local_tasks,
        default_tasks_dir,
    )
    from .tasks import R2ETask, load_tasks, task_from_row

__getattr__, __dir__ = lazy_exports(__name__, {
    "ActionParseError": "actions",
    "BugSpec": "local_tasks",
    "DOCKER_IMAGE": "env",
    "LOCAL_BUGS": "local_tasks",
    "R2EAgentPrompt": "env",
    "R2EGymEnv": "env",
    "R2ETask": "tasks",
    "TaskBuildError": "local_tasks",
    "ToolCall": "actions",
    "build_local_tasks": "local_tasks",
    "compare_test_maps": "grading",
    "default_tasks_dir": "local_tasks",
    "load_tasks": "tasks",
    "parse_action": "actions",
    "parse_log_pytest": "grading",
    "reward_from_log": "grading",
    "task_from_row": "tasks",
})

__all__ = [
    "DOCKER_IMAGE",
    "LOCAL_BUGS",
    "ActionParseError",
    "BugSpec",
    "R2EAgentPrompt",
    "R2EGymEnv",
    "R2ETask",
    "TaskBuildError",
    "ToolCall",
    "build_local_tasks",
    "compare_test_maps",
    "default_tasks_dir",
    "load_tasks",
    "parse_action",
    "parse_log_pytest",
    "reward_from_log",
    "task_from_row",
]
