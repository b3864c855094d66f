"""One owner per piece of state: no module reads or writes another module's private attributes.

Checked statically with :mod:`ast` (nothing is imported; well under a second): an attribute ``x._name`` (``x`` not
``self``/``cls``/``super()``) is another module's private state when ``_name`` is defined in the library (assigned as
``self._name``, or a class member) only by other modules.  Where one module needs another's state, the owner grows a
public method (``AgentFlyEnv.discard()``, ``RayPool.track_release()``) or the two move into one module, as asyncpg
keeps every holder-to-pool touch inside pool.py.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "agentfly_gym", ROOT / "plugins" / "verl" / "agentfly_gym_verl"]

#: Touches that stay, each with its reason (module relative to the repository, the touched attribute).
ALLOWED = {
    # the grading guard's two halves share module-private helpers on purpose: the names must stay private to the
    # graded code's view, and the module is imported as ``_ns`` (a namespace, not another owner's object)
    ("agentfly_gym/envs/r2egym/grading_guard.py", "_snapshot"),
}


def _is_compat(path: Path) -> bool:
    """A version-guarded ``_compat`` module: its job is to reach into a third-party package's privates."""
    return path.name == "_compat.py"


def private_definitions(paths: list[Path]) -> dict[str, set[Path]]:
    """``_name`` -> the modules that own it: assign ``self._name`` / ``cls._name`` or define it in a class body."""
    owners: dict[str, set[Path]] = defaultdict(set)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                    and node.attr.startswith("_")):
                owners[node.attr].add(path)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    names: list[str] = []
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names = [item.name]
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names = [item.target.id]
                    elif isinstance(item, ast.Assign):
                        names = [t.id for t in item.targets if isinstance(t, ast.Name)]
                    for name in names:
                        if name.startswith("_") and not name.startswith("__"):
                            owners[name].add(path)
    return owners


def foreign_touches(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``"module:line: expression"`` for every private attribute a module reaches in another module's objects."""
    owners = private_definitions(paths)
    found = []
    for path in paths:
        if _is_compat(path):
            continue
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            if node.attr in owners and path not in owners[node.attr] and (rel, node.attr) not in ALLOWED:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def library_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in package.rglob("*.py"))


def test_no_module_touches_another_modules_private_state():
    assert foreign_touches(library_modules()) == []


def test_the_check_finds_a_foreign_touch(tmp_path):
    (tmp_path / "owner.py").write_text("class Env:\n    def __init__(self):\n        self._closed = False\n")
    (tmp_path / "user.py").write_text("def probe(env):\n    env._closed = True\n    env.ok = 1\n")
    (tmp_path / "_compat.py").write_text("def patch(env):\n    env._closed = True\n")
    paths = sorted(tmp_path.glob("*.py"))
    assert foreign_touches(paths, root=tmp_path) == ["user.py:2: env._closed"]


def test_discard_closes_an_env_that_never_started_without_a_loop():
    import gymnasium

    import agentfly_gym  # noqa: F401  (registers the envs)

    env = gymnasium.make("agentfly/Chess-v0").unwrapped
    env.discard()
    env.discard()  # idempotent
    assert env._closed
    env.close()  # nothing left to do
