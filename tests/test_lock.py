"""The lock file the README's two commands install from (requirements/lock.txt) is complete and current.

``make setup`` installs requirements/lock.txt with uv instead of resolving pyproject.toml's ranges, so a lock
that falls behind pyproject.toml would install something other than what the project declares.  These checks
read only the repository (no index is asked), so they are exact and fast; regenerate the lock with
``make lock`` (scripts/lock.sh).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements" / "lock.txt"
FIX = "run `make lock` (scripts/lock.sh) and commit requirements/lock.txt"
# the platform the lock is made for (scripts/lock.sh: --python-version 3.11, x86_64 Linux)
MARKER_ENV = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}

sys.path.insert(0, str(REPO / "scripts"))
from lock_digest import dependency_digest


def _pins() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line.strip())
        assert m, f"requirements/lock.txt line {line!r} is not a plain 'name==version' pin; {FIX}"
        pins[canonicalize_name(m.group(1))] = Version(m.group(2))
    return pins


def _declared(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject's dependencies plus the given extras, self-references (agentfly-gym[...]) expanded."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    reqs, seen, todo = [Requirement(r) for r in project["dependencies"]], set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo.extend(req.extras)
            else:
                reqs.append(req)
    return reqs


def test_lock_was_made_from_this_pyproject():
    header = LOCK.read_text().splitlines()[:5]
    recorded = [line.split(":", 1)[1].strip() for line in header if line.startswith("# pyproject-dependencies-sha256:")]
    assert recorded, f"requirements/lock.txt has no pyproject-dependencies-sha256 header; {FIX}"
    assert recorded[0] == dependency_digest(REPO / "pyproject.toml"), (
        f"requirements/lock.txt is stale: pyproject.toml's dependencies changed since it was made; {FIX}")


def test_lock_names_its_command():
    assert "make lock" in "\n".join(LOCK.read_text().splitlines()[:3])


def test_every_declared_requirement_is_pinned_within_its_range():
    pins = _pins()
    problems = []
    for req in _declared(("all", "verl")):
        if req.marker is not None and not req.marker.evaluate({**MARKER_ENV, "extra": ""}):
            continue
        got = pins.get(canonicalize_name(req.name))
        if got is None:
            problems.append(f"{req} is not in the lock")
        elif not req.specifier.contains(got, prereleases=True):
            problems.append(f"{req} but the lock pins {got}")
    assert not problems, "; ".join(problems) + f"; {FIX}"


def test_lock_keeps_the_gpu_stack_out():
    pins = _pins()
    assert pins["torch"].local == "cpu", f"torch is pinned to {pins['torch']}, not the CPU build"
    gpu = sorted(n for n in pins if n.startswith("nvidia-") or n in ("vllm", "triton", "flash-attn"))
    assert not gpu, f"the default lock pulls GPU packages {gpu}"


def test_lock_holds_no_machine_paths_or_urls():
    text = LOCK.read_text()
    assert not re.search(r"file:|https?://|/opt/|/home/|/root/|/work/", text)


def test_a_changed_pyproject_is_caught(tmp_path):
    """The digest check has teeth: adding one dependency changes it."""
    before = dependency_digest(REPO / "pyproject.toml")
    changed = (REPO / "pyproject.toml").read_text().replace('"pyyaml>=6",', '"pyyaml>=6",\n    "six",', 1)
    assert changed != (REPO / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(changed)
    assert dependency_digest(tmp_path / "pyproject.toml") != before
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "lock_digest.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == dependency_digest(tmp_path / "pyproject.toml")


def test_the_setup_stamp_follows_the_interpreter(tmp_path):
    """``make demo PY=<another venv>`` must set that environment up, not trust a marker left by another one.

    The interpreter running the tests was set up from this lock (by ``make test``); a fresh virtual environment
    beside it was not, and setup.sh's check must tell them apart.
    """
    import venv

    check = ["bash", str(REPO / "scripts" / "setup.sh"), "--check"]
    ours = subprocess.run(check, env={"PATH": "/usr/bin:/bin", "PY": sys.executable}, cwd=REPO,
                          capture_output=True, text=True)
    if ours.returncode != 0:
        pytest.skip(f"the interpreter running the tests was not set up by scripts/setup.sh: {ours.stdout.strip()}")
    venv.create(tmp_path / "other", with_pip=False)
    other = subprocess.run(check, env={"PATH": "/usr/bin:/bin", "PY": str(tmp_path / "other" / "bin" / "python")},
                           cwd=REPO, capture_output=True, text=True)
    assert other.returncode == 1 and "not set up" in other.stdout, other.stdout + other.stderr
