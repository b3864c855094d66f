"""One name per concept: the old names stay gone.

A pool's cap is ``max_instances`` and its idle time ``max_idle_time`` in every env, spec and benchmark;
where an in-process object runs is ``isolation="thread" | "process"``; a lease goes back with ``release``
while a resource instance is destroyed with ``adestroy`` (async) / ``destroy`` (sync, at exit); things close
with ``close`` (sync) / ``aclose`` (async).  The old names were removed, not aliased, so:

* the library, the plugins, the README and the benchmarks never mention them (a text scan; recorded benchmark
  results are history and are not scanned);
* no public class or function defines an old closing verb, and no resource defines ``release()`` (an AST scan);
* a user passing an old keyword gets Python's ``TypeError`` at once, before anything starts;
* the re-export shims are gone and nothing imports through them.

Fast (no resource is started); each part fails on the code before the renames.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".sh"}

#: old name -> the name that replaced it (for the failure message)
OLD_NAMES = {
    r"\bmax_engines\b": "max_instances", r"\bmax_simulators\b": "max_instances",
    r"\bmax_containers\b": "max_instances", r"\bmax_servers\b": "max_instances", r"\bmax_games\b": "max_instances",
    r"\bserver_idle_time\b": "max_idle_time",
    r"\bserver_mode\b": 'isolation="thread" | "process"',
    r"\bclose_sync\b": "close", r"\bterminate_sync\b": "destroy", r"\bashutdown\b": "aclose",
    r"\brelease_global\b": "destroy_global", r"(?<![\w])release_nowait\b": "release (or the private _release_nowait)",
    r"\bterminate_all\b": "destroy_all", r"\bclose_all_sync\b": "close_all",
    r"\bshutdown_background_loop\b": "close_background_loop",
    r"\bagentfly_gym_verl\.shutdown\b": "agentfly_gym_verl.close",
    r"\bStepTimeout\b": "(deleted: never raised)", r"\bon_background_loop\b": "(deleted: never called)",
    r"\breset_paths\b": "(deleted: ContainerSpec.reset() restores the whole file system)",
    r"\bagentfly_gym\.rollout\.(?:factory|policy|openai_policy|transformers_policy|vllm_policy)\b":
        "agentfly_gym.rollout.policies.<module>",
}

#: closing verbs no public class or function may define any more (a private helper may mirror a stdlib API)
OLD_VERBS = {"close_sync", "terminate", "terminate_sync", "shutdown", "ashutdown", "release_global",
             "release_nowait"}


def _scanned_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "benchmarks" / "README.md"]
    for top in ("agentfly_gym", "plugins", "benchmarks", "docs"):
        files += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES
                  and "results" not in p.relative_to(REPO).parts and "__pycache__" not in p.parts]
    return sorted(set(files))


def test_old_names_do_not_reappear():
    pattern = re.compile("|".join(f"(?:{k})" for k in OLD_NAMES))
    hits = []
    for path in _scanned_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = pattern.search(line)
            if m:
                new = next(v for k, v in OLD_NAMES.items() if re.search(k, m.group(0)))
                hits.append(f"{path.relative_to(REPO)}:{n}: {m.group(0)!r} (now: {new})")
    assert not hits, "old names found:\n" + "\n".join(hits)


def _defs(tree: ast.AST):
    """(qualified name, def node, enclosing class or None) of every function in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item, node
    for item in getattr(tree, "body", []):
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield item.name, item, None


def test_no_public_old_closing_verb_and_no_resource_release():
    bad = []
    for path in _scanned_files():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for qual, fn, cls in _defs(tree):
            if fn.name in OLD_VERBS and not (cls is not None and cls.name.startswith("_")):
                bad.append(f"{path.relative_to(REPO)}: def {qual}")
            # a Resource's own teardown is adestroy(); release() takes what is given back (a lease, a spec)
            if fn.name == "release" and len(fn.args.args) == 1 and not fn.args.kwonlyargs:
                bad.append(f"{path.relative_to(REPO)}: def {qual}(self) (destroying is adestroy)")
    assert not bad, "old verbs defined:\n" + "\n".join(bad)


def test_resource_contract_names():
    from agentfly_gym.resources import Resource, ResourceManager
    from agentfly_gym.resources.pool import ResourcePool

    assert {"adestroy", "destroy"} <= set(vars(Resource))
    assert not hasattr(Resource, "release")
    assert {"close", "aclose", "destroy_global"} <= set(vars(ResourceManager))
    assert {"aclose", "release"} <= set(vars(ResourcePool))
    assert not {"close", "terminate", "terminate_sync"} & set(vars(ResourcePool))


def _chess_env(**kw):
    from agentfly_gym.envs.chess.env import ChessEnv
    return ChessEnv(mode="play", **kw)


def _selfplay_env(**kw):
    from agentfly_gym.envs.chess.selfplay import ChessSelfPlayEnv
    return ChessSelfPlayEnv(**kw)


def _scienceworld_env(**kw):
    from agentfly_gym.envs.scienceworld.env import ScienceWorldEnv
    return ScienceWorldEnv(**kw)


def _scienceworld_spec(**kw):
    from agentfly_gym.envs.scienceworld.env import ScienceWorldEnv
    return ScienceWorldEnv.simulator_spec(**kw)


def _r2egym_env(**kw):
    from agentfly_gym.envs.r2egym.env import R2EGymEnv
    return R2EGymEnv(**kw)


def _webshop_env(**kw):
    from agentfly_gym.envs.webshop.env import WebShopEnv
    return WebShopEnv(**kw)


def _openenv_env(**kw):
    from agentfly_gym.bridges.openenv import OpenEnvEnv
    return OpenEnvEnv(image="agentfly/none:latest", **kw)


def _engine_spec(**kw):
    from agentfly_gym.envs.chess.engine import engine_spec
    return engine_spec("/bin/false", **kw)


def _board_spec(**kw):
    from agentfly_gym.envs.chess.selfplay import board_spec
    return board_spec(**kw)


def _container_spec(**kw):
    from agentfly_gym.resources import ContainerSpec
    return ContainerSpec(image="python:3.11-slim", **kw)


@pytest.mark.parametrize("make, old", [
    (_chess_env, {"max_engines": 1}), (_selfplay_env, {"max_games": 1}),
    (_scienceworld_env, {"max_simulators": 1}), (_scienceworld_spec, {"max_simulators": 1}),
    (_r2egym_env, {"max_containers": 1}), (_webshop_env, {"server_idle_time": 1.0}),
    (_webshop_env, {"server_mode": "process"}), (_openenv_env, {"max_servers": 1}),
    (_engine_spec, {"max_engines": 1}), (_board_spec, {"max_games": 1}),
    (_container_spec, {"reset_paths": ("/tmp",)}),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else v.__name__.strip("_"))
def test_old_keyword_is_a_type_error(make, old):
    with pytest.raises(TypeError, match=next(iter(old))):
        make(**old)


def test_shims_and_dead_code_are_gone():
    for mod in ("factory", "policy", "openai_policy", "transformers_policy", "vllm_policy"):
        assert not (REPO / "agentfly_gym" / "rollout" / f"{mod}.py").exists(), f"rollout/{mod}.py shim is back"
        importlib.import_module(f"agentfly_gym.rollout.policies.{'base' if mod == 'policy' else mod}")
    shim = REPO / "agentfly_gym" / "images.py"
    assert not (shim.exists() and "import *" in shim.read_text()), "agentfly_gym/images.py re-export shim is back"
    import agentfly_gym.errors as errors
    import agentfly_gym.utils.aio as aio

    assert not hasattr(errors, "StepTimeout")
    assert not hasattr(aio, "on_background_loop")


def test_verl_plugin_closes_with_close_and_aclose():
    import agentfly_gym_verl  # on sys.path through tests/conftest.py

    assert callable(agentfly_gym_verl.close)
    assert callable(agentfly_gym_verl.aclose)
    for old in ("shutdown", "ashutdown"):
        assert old not in agentfly_gym_verl.__all__
        with pytest.raises(AttributeError):
            getattr(agentfly_gym_verl, old)
