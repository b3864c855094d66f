"""The library's layout, checked statically: no module over 600 lines, no import circle, command-line
code only in ``agentfly_gym/cli/``, and one manager contract that both managers keep and every caller names.

The checks read the source with :mod:`ast` (nothing is imported but the managers of the last two tests), so they
take well under a second.  ``python -m pytest tests/test_layout.py -q`` is the command; the numbers it enforces
are also what ``wc -l agentfly_gym/**/*.py`` shows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "agentfly_gym"

MAX_LINES = 600
#: Modules allowed past MAX_LINES.  Each is being rewritten by the engineers who remove the dependency
#: workarounds it holds (py4j client, ALFWorld engine patches, python-chess engine, the encode
#: path, KV-cache layers, ray._private), so it is not split here; remove an entry once that work has landed.
ALLOWED_LONG = {
    "agentfly_gym/envs/scienceworld/simulator.py",
    "agentfly_gym/envs/chess/engine.py",
    "agentfly_gym/envs/alfworld/engine_cache.py",
    "agentfly_gym/rollout/chat.py",
    "agentfly_gym/rollout/policies/transformers_policy.py",
    "agentfly_gym/resources/ray/manager.py",
}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``package`` (``__init__`` names its package)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _import_time_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run when the module is imported: the body, with the branches of module-level ``if``
    (except ``if TYPE_CHECKING:``), ``try`` and ``with`` blocks; not function or class bodies' functions."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                out += _import_time_statements(node.orelse)
                continue
            out += _import_time_statements(node.body) + _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            out += _import_time_statements(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                out += _import_time_statements(handler.body)
        elif isinstance(node, ast.With):
            out += _import_time_statements(node.body)
        elif isinstance(node, ast.ClassDef):
            out += _import_time_statements([n for n in node.body if not isinstance(n, ast.ClassDef)])
        else:
            out.append(node)
    return out


def _all_imports(tree: ast.Module) -> list[ast.stmt]:
    """Every import statement, also inside functions, but not under ``if TYPE_CHECKING:`` (type-only)."""
    out: list[ast.stmt] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        todo += ast.iter_child_nodes(node)
    return out


def import_graph(package: Path = PACKAGE, *, deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it is imported (``from . import x`` names module ``x``);
    with ``deferred``, also those it imports later, inside a function."""
    mods = modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in (_all_imports(tree) if deferred else _import_time_statements(tree.body)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each an import circle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm, recursive (the graph is a few hundred modules)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= ALLOWED_LONG, {k: v for k, v in long.items() if k not in ALLOWED_LONG}
    assert all((ROOT / p).is_file() for p in ALLOWED_LONG), "an allowed module is gone: drop it from ALLOWED_LONG"


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import circles (module-level imports): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_through_deferred_imports():
    """Nor through an import inside a function: a deferred import hides a circle from Python, not from a reader
    (a module that reaches back up to what imports it).  Imports for type checkers only do not count."""
    found = cycles(import_graph(deferred=True))
    assert not found, "import circles (deferred imports included): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_finds_a_circle(tmp_path):
    """The check itself: modules importing each other at import time are a circle; through an import inside a
    function only with ``deferred``; through an import under ``if TYPE_CHECKING:`` never."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("try:\n    from . import a\nexcept ImportError:\n    pass\ndef f(): ...\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import g\n")
    (pkg / "d.py").write_text("def g():\n    from .c import TYPE_CHECKING\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]
    assert cycles(import_graph(pkg, deferred=True)) == [["pkg.a", "pkg.b"]]  # c -> d is for type checkers
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    assert cycles(import_graph(pkg)) == []
    assert cycles(import_graph(pkg, deferred=True)) == [["pkg.a", "pkg.b"]]


def test_command_line_code_lives_in_cli():
    """No argument parsing and no ``*_main`` entry point outside ``agentfly_gym/cli/`` (worker scripts that run
    in a child process or a container, e.g. ``r2egym/r2e_tools.py``, keep their ``__main__`` block)."""
    offenders = []
    for name, path in modules().items():
        if name.startswith("agentfly_gym.cli") or name == "agentfly_gym.__main__":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.endswith("_main") \
                    and node.name != "_child_main":  # resources/isolated.py: the body of a worker process
                offenders.append(f"{name}: def {node.name}")
            elif isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
                offenders.append(f"{name}: import argparse")
            elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
                offenders.append(f"{name}: from argparse import ...")
    assert not offenders, offenders


def test_every_command_is_a_cli_module():
    """Each subcommand the dispatcher delegates names a module of ``agentfly_gym/cli/`` (the plugin's
    ``dataset`` command excepted: the plugin is its own package)."""
    from agentfly_gym.cli import DELEGATED

    mods = modules()
    for words, (module, func, _help) in DELEGATED.items():
        if module.startswith("agentfly_gym_verl"):
            continue
        assert module.startswith("agentfly_gym.cli.") and module in mods, (words, module)
        tree = ast.parse(mods[module].read_text())
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (words, module, func)


def test_both_managers_keep_the_manager_protocol():
    """``ResourceManager`` and ``RayResourceManager`` subclass the runtime-checkable ``Manager``, share its
    ``scope()`` (neither defines its own) and ``default_manager()`` is typed to return a ``Manager``."""
    from agentfly_gym.resources import Manager, ResourceManager, default_manager
    from agentfly_gym.resources.ray import RayResourceManager  # imports no Ray
    from agentfly_gym.resources.ray.manager import RayRolloutScope

    for cls in (ResourceManager, RayResourceManager):
        assert Manager in cls.__mro__
        assert "scope" not in vars(cls), f"{cls.__name__} copies scope(); Manager.scope is the one"
    assert RayResourceManager.scope_class is RayRolloutScope
    assert default_manager.__annotations__["return"] == "Manager"
    manager = ResourceManager()
    assert isinstance(manager, Manager)
    assert isinstance(manager.scope("s"), ResourceManager.scope_class)


@pytest.mark.parametrize("package", ["envs", "rollout", "rewards", "bridges", "vector.py"])
def test_callers_type_against_the_protocol(package):
    """Outside ``agentfly_gym/resources`` no annotation names the local ``ResourceManager``: callers take any
    ``Manager`` (either manager, as ``default_manager()`` may return)."""
    paths = [PACKAGE / package] if package.endswith(".py") else sorted((PACKAGE / package).rglob("*.py"))
    offenders = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            annotations = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                annotations = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                               if x is not None] + [node.returns]
            elif isinstance(node, ast.AnnAssign):
                annotations = [node.annotation]
            if any(ann is not None and "ResourceManager" in ast.unparse(ann) for ann in annotations):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
