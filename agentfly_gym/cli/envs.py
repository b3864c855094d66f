"""``agentfly-gym envs``: the registered environments, where their data comes from and how many tasks."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

__all__ = ["add_envs_parser", "cmd_envs"]


def add_envs_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``envs`` subcommand to ``sub`` (an ``add_subparsers()`` result)."""
    e = sub.add_parser("envs", help="list registered environments, the data each one reads and how many tasks")
    e.set_defaults(func=cmd_envs)
    return e


#: env id -> the python package it needs
_ENV_PACKAGE = {"agentfly/Chess-v0": "chess", "agentfly/ScienceWorld-v0": "scienceworld",
                "agentfly/ALFWorld-v0": "alfworld", "agentfly/WebShop-v0": "spacy", "agentfly/R2EGym-v0": "docker",
                "agentfly/CodeInterpreter-v0": "transformers", "agentfly/Retrieval-v0": "bm25s"}


def cmd_envs(args: argparse.Namespace) -> int:
    import gymnasium
    from ..utils.console import console
    from rich.table import Table

    import agentfly_gym  # noqa: F401

    from ..data.sources import env_data_source

    table = Table(title="agentfly-gym environments (full data sets: agentfly-gym data status)")
    table.add_column("id", no_wrap=True)
    for col in ("package", "data source", "tasks"):
        table.add_column(col, overflow="fold")
    for env_id, _spec in sorted(gymnasium.registry.items()):
        if not env_id.startswith("agentfly/"):
            continue
        pkg = _ENV_PACKAGE.get(env_id)
        pkg_ok = "yes" if pkg is None or importlib.util.find_spec(pkg) is not None else f"missing ({pkg})"
        table.add_row(env_id, pkg_ok, *env_data_source(env_id))
    from ..registration import MULTIAGENT_ENVS

    for name in sorted(MULTIAGENT_ENVS):  # PettingZoo envs (make_multiagent)
        pkg_ok = "yes" if importlib.util.find_spec("pettingzoo") is not None else "missing (pettingzoo)"
        table.add_row(f"agentfly/{name} (multi-agent)", pkg_ok, "none needed", "games from the start or a FEN")
    console().print(table)
    return 0
