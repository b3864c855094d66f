"""agentfly-gym's verl plugin (verl 0.9.1, agent-loop extension point).

Point verl at the agent loops with
``actor_rollout_ref.rollout.agent.agent_loop_config_path=<agentfly_gym_verl.config_path()>``
and build data sets with :func:`agentfly_gym_verl.dataset.build_dataset`.

Importing this package imports neither verl nor the environments; the names below are loaded
on first access.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["config_path", "AgentFlyAgentLoop", "VerlServerPolicy", "build_dataset", "dataset_main", "get_manager",
           "close", "aclose", "failure_metrics", "SelfPlayAgentLoop", "selfplay_rows",
           "gateway_outputs", "GatewayAgentLoop"]

_LAZY = {
    "AgentFlyAgentLoop": "agent_loop",
    "VerlServerPolicy": "policy",
    "build_dataset": "dataset",
    "dataset_main": "dataset",
    "get_manager": "runtime",
    "close": "runtime",
    "aclose": "runtime",
    "failure_metrics": "runtime",
    "SelfPlayAgentLoop": "selfplay",
    "selfplay_rows": "selfplay",
    "gateway_outputs": "gateway",
    "GatewayAgentLoop": "gateway_loop",
}


def config_path() -> Path:
    """The plugin's agent-loop YAML (entries ``agentfly_chain``, ``agentfly_step``, ``agentfly``,
    ``agentfly_selfplay``, ``agentfly_gateway``)."""
    return Path(__file__).with_name("agent_loops.yaml")


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'agentfly_gym_verl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
