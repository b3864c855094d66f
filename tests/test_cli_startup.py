"""A command starts quickly: ``agentfly-gym --help``, ``envs`` and ``data status`` import only what they use.

What was measured (``python -X importtime -m agentfly_gym envs``): every command imported the resource manager
and its pools (through ``agentfly_gym.resources``), and ``envs`` also imported python-chess with its attack tables
and the Stockfish engine module (through ``agentfly_gym.envs.chess``), the tools layer (for one folder name) and
every env package's env module, for a table that reads a few files.  The packages now import their public names
on first use (:mod:`agentfly_gym.utils.lazy`).  What a command imports is checked, not how long it takes (the
machine is shared and noisy): the modules below must stay out of ``sys.modules``.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Modules that no listed command needs: the manager, pools and backends, engines, simulators, the tools layer.
HEAVY = ("agentfly_gym.resources.manager", "agentfly_gym.resources.pool", "agentfly_gym.envs.base",
         "agentfly_gym.envs.chess.engine", "agentfly_gym.envs.chess.env", "agentfly_gym.tools", "chess",
         "agentfly_gym.envs.r2egym.env", "agentfly_gym.envs.alfworld.env", "agentfly_gym.envs.webshop.env")

PROBE = """
import contextlib, io, json, sys
from agentfly_gym.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def _imports(*argv: str) -> tuple[int, set[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["rc"], set(got["modules"])


@pytest.mark.parametrize("argv", [["--help"], ["envs"], ["data", "status"], ["rollout", "--help"]])
def test_a_command_imports_only_what_it_uses(argv):
    rc, modules = _imports(*argv)
    assert rc == 0
    loaded = sorted(m for m in HEAVY if m in modules)
    assert not loaded, f"agentfly-gym {' '.join(argv)} imported {loaded}, which it does not use"


def _lazy_packages() -> list[Path]:
    return sorted(p for p in (ROOT / "agentfly_gym").rglob("__init__.py") if "lazy_exports(" in p.read_text())


@pytest.mark.parametrize("init", _lazy_packages(), ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_lazy_exports_match_the_type_checking_imports(init):
    """Each lazy package's ``{name: submodule}`` map names what its ``if TYPE_CHECKING:`` block imports (what the
    API reference and type checkers read), and every name resolves to that submodule's object."""
    tree = ast.parse(init.read_text())
    static = {}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1, ast.unparse(imp)
                static.update({a.name: imp.module for a in imp.names})
    call = next(n.value for n in tree.body if isinstance(n, ast.Assign) and "lazy_exports" in ast.unparse(n.value))
    lazy = ast.literal_eval(call.args[1])
    assert lazy == static
    package = ".".join(init.parent.relative_to(ROOT).parts)
    mod = importlib.import_module(package)
    all_names = set(getattr(mod, "__all__", lazy))
    assert all_names == set(lazy), "__all__ and the lazy map differ"
    for name, sub in lazy.items():
        assert getattr(mod, name) is getattr(importlib.import_module(f"{package}.{sub}"), name)
    assert set(lazy) <= set(dir(mod))
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018 (the attribute read is the test)


def test_the_envs_table_names_the_retrieval_corpus_the_env_reads():
    from agentfly_gym.data.sources import RETRIEVAL_CORPUS_DIR
    from agentfly_gym.envs.retrieval import CORPUS_DIR

    assert RETRIEVAL_CORPUS_DIR == CORPUS_DIR
