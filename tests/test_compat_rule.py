"""Third-party internals are touched only in ``_compat.py`` modules (every workaround of a dependency
lives in one version-guarded ``_compat`` module next to its user, with a test that fails on a version it does
not know).

An AST check over ``agentfly_gym/`` and ``plugins/``; outside files named ``_compat.py`` it finds

* imports of a third-party module's private part: ``import ray._private.state``, ``from ray._private import
  utils``, ``from docker import _x``, ``import _pytest``;
* private attributes (``._x``, not dunder) reached from a name bound to something imported from a third-party
  module: ``ray._private``, ``DynamicCache._layers``, also through ``getattr(ray, "_private")``;
* private attributes of objects of unknown origin whose name the project never defines itself: ``api._post_json``,
  ``response.raw._fp``, ``tokenizer._tokenizer`` (a name the project defines, in a ``def``, a class or module
  assignment, an attribute assigned on ``self``/``cls``, ``__slots__``, is taken to be its own: the check cannot
  know types, so a private name shared with the project's own code goes unseen).

Third-party means neither the standard library nor ``agentfly_gym``/``plugins``; the standard library's own
underscored API (``os._exit``, ``sys._getframe``, a named tuple's ``_replace``) is not in scope.

:data:`ALLOWED` lists the files other engineers are still moving into ``_compat`` modules;
an entry whose file is clean fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("agentfly_gym", "plugins")
OWN_TOP = {"agentfly_gym", "plugins"}
STDLIB = set(sys.stdlib_module_names)
#: underscored names that are public API of the standard library's types (named tuples).
STDLIB_PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}

#: file (relative to the repository) -> why it still touches third-party internals.  Shrinks to nothing.
#: (_plan_worker.py is a script run by path in its own process (``python -P``), so it cannot import the package's
#: ``alfworld/_compat.py``; its one private read is ALFWorld's own planner entry point.)
ALLOWED: dict[str, str] = {
    "agentfly_gym/envs/alfworld/_plan_worker.py": "the ALFWorld PDDL env's _pddl_state/_entity_infos read to replan",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return bool(top) and top not in OWN_TOP and top not in STDLIB


def _files() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py") if ".venv" not in p.parts)


def _own_private_names(trees: dict[Path, ast.AST]) -> set[str]:
    """Private names the project defines itself (see the module docstring)."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    for stmt in node.body:
                        for t in _targets(stmt):
                            if isinstance(t, ast.Name):
                                names.add(t.id)
                        if (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                                 for t in stmt.targets)):
                            names.update(c.value for c in ast.walk(stmt.value)
                                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in _targets(node):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                        names.add(t.attr)
        for stmt in getattr(tree, "body", []):  # module-level assignments
            for t in _targets(stmt):
                if isinstance(t, ast.Name):
                    names.add(t.id)
    return {n for n in names if _private(n)}


def _targets(stmt: ast.AST) -> list[ast.AST]:
    if isinstance(stmt, ast.Assign):
        out = []
        for t in stmt.targets:
            out.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        return out
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return [stmt.target]
    return []


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def violations(path: Path, tree: ast.AST, own: set[str]) -> list[str]:
    """What ``tree`` (the module at ``path``) touches of third-party internals, as ``"line: what"``."""
    found: list[str] = []
    imported: dict[str, str] = {}  # local name -> the module it came from (third-party or stdlib)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _third_party(a.name) and any(_private(p) for p in a.name.split(".")):
                    found.append(f"{node.lineno}: import {a.name}")
                imported[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _third_party(node.module) and any(_private(p) for p in full.split(".")):
                    found.append(f"{node.lineno}: from {node.module} import {a.name}")
                imported[a.asname or a.name] = node.module
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute) and _private(node.attr):
            attr, base = node.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            attr, base = node.args[1].value, node.args[0]
        if attr is None:
            continue
        root = _root(base)
        if isinstance(root, ast.Name) and root.id in ("self", "cls"):
            continue
        if isinstance(root, ast.Call) or (isinstance(root, ast.Name) and root.id == "super"):
            continue
        where = ast.unparse(base)
        if not isinstance(base, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            where = f"({where})"
        origin = imported.get(root.id) if isinstance(root, ast.Name) else None
        if origin is not None:
            if _third_party(origin):
                found.append(f"{node.lineno}: {where}.{attr} ({origin})")
            continue  # the standard library's or the project's own module
        if attr not in own and attr not in STDLIB_PUBLIC:
            found.append(f"{node.lineno}: {where}.{attr}")
    return found


def scan() -> dict[str, list[str]]:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in _files()}
    own = _own_private_names(trees)
    out: dict[str, list[str]] = defaultdict(list)
    for p, tree in trees.items():
        if p.name != "_compat.py":
            for v in violations(p, tree, own):
                out[str(p.relative_to(REPO))].append(v)
    return dict(out)


def test_third_party_internals_only_in_compat_modules():
    found = scan()
    new = {f: v for f, v in found.items() if f not in ALLOWED}
    assert not new, ("third-party internals outside a _compat.py module (move them into a version-guarded "
                     "_compat.py next to their user, with a test that fails on an unknown version): "
                     + "; ".join(f"{f}: {', '.join(v)}" for f, v in new.items()))
    cleaned = [f for f in ALLOWED if f not in found]
    assert not cleaned, f"no longer needed in ALLOWED (remove them): {cleaned}"


def test_the_check_finds_what_it_is_for(tmp_path):
    """The rule catches each kind of access it is for (on the code this branch removed) and passes clean code."""
    bad = '''
import ray._private.state
from ray._private import utils
from docker import _x
import _pytest
import ray
from transformers.cache_utils import DynamicCache
def f(api, res, tok, ok):
    ray._private.worker
    getattr(ray, "_private")
    DynamicCache._layers
    api._post_json(api._url("/exec/{0}/start", 1))
    res.raw._fp.fp
    tok._tokenizer
    ok._own_name
    ok._replace(a=1)
'''
    lines = [v.split(": ", 1)[1] for v in violations(tmp_path / "m.py", ast.parse(bad), own={"_own_name"})]
    assert lines[:4] == ["import ray._private.state", "from ray._private import utils", "from docker import _x",
                         "import _pytest"]
    assert sorted(lines[4:]) == sorted([  # (attribute findings come in ast.walk's order)
        "ray._private (ray)", "ray._private (ray)", "DynamicCache._layers (transformers.cache_utils)",
        "api._post_json", "api._url", "res.raw._fp", "tok._tokenizer"])
    clean = '''
import os, sys
from collections import namedtuple
class A:
    _slot = 1
    def __init__(self):
        self._x = 1
    def g(self, other):
        os._exit(0); sys._getframe(); other._x; super()._y; self._z
'''
    assert violations(tmp_path / "m.py", ast.parse(clean), own={"_x"}) == []
