"""Shared fixtures: where the test data lives (tests/data), Docker, process-leak checks; how the tests are shared
out among pytest-xdist workers.

``make test`` runs the suite on one worker per CPU (``-n auto --dist loadgroup``) in a random order
(pytest-randomly).  What a test must do to pass there, whatever runs beside it and before it:

- build what it needs through fixtures (a session fixture for a costly build, cached on disk, guarded by a file
  lock when two workers may build the same thing: see ``build_local_tasks``, ``tiny_qwen_dir``, the image builds);
- write only under its own ``tmp_path`` (or a cache entry written atomically), listen on a port the OS picked
  (port 0), name its Docker containers and processes by its own pid or a fresh id, and check for leaks among its
  own processes (``tests/proctools.py``: ``children_of=os.getpid()`` or a marker), never machine-wide;
- wait for an event or poll a condition with a generous deadline (``tests/waiting.py``), never a fixed sleep, and
  assert no wall-clock bound that a loaded machine can miss;
- tests that must not run beside each other (one cluster of a module, one engine's global state) carry
  ``pytest.mark.xdist_group("name")``: a group runs on one worker.  Tests that use a module-scoped fixture of
  their module are grouped by module automatically (below), so that fixture is built once.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("agentfly_gym_verl") is None:  # the plugin not installed: test it from the source tree
    sys.path.insert(0, str(REPO / "plugins" / "verl"))


#: The test suite's data, shipped in the repository (tests/data/README.md: what each file is, origin, licence):
#: alfworld/ (a subset of the games), chess/, webshop/ (a link to the package's sample), tokenizers/qwen3/, and
#: cases/ (the WebShop reward cases computed with upstream's code).  Nothing outside the clone is read.
TEST_DATA = REPO / "tests" / "data"


def _data_root() -> Path:
    env = os.environ.get("AGENTFLY_GYM_DATA")
    if env:
        return Path(env).expanduser()
    return TEST_DATA


#: The data root of this session: ``$AGENTFLY_GYM_DATA`` when set (e.g. a folder with the full data sets, in the
#: layout of tests/data), else tests/data.
DATA_ROOT = _data_root()


@pytest.fixture(scope="session")
def test_data() -> Path:
    """The data root the tests read (alfworld/, webshop/, chess/, tokenizers/qwen3/).  Read-only.

    ``tests/data`` of the repository, unless ``$AGENTFLY_GYM_DATA`` is set: then that folder, which must hold the
    same layout (for running the tests against the full data sets; the ALFWorld counts test knows both).
    """
    if not DATA_ROOT.is_dir():
        pytest.fail(f"data folder not found at {DATA_ROOT} (from AGENTFLY_GYM_DATA); unset it to use tests/data")
    return DATA_ROOT


@pytest.fixture(scope="session")
def test_cases() -> Path:
    """The WebShop reward cases computed with upstream's code (``tests/data/cases``).  Read-only.

    Always the repository's copy: ``$AGENTFLY_GYM_DATA`` only moves the data sets.
    """
    return TEST_DATA / "cases"


@pytest.fixture(autouse=True, scope="session")
def _data_env(tmp_path_factory):
    """Point the library at the data root and a writable cache for the whole session."""
    os.environ.setdefault("AGENTFLY_GYM_DATA", str(DATA_ROOT))
    os.environ.setdefault("AGENTFLY_GYM_CACHE", str(Path.home() / ".cache" / "agentfly-gym"))
    yield


def _engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def docker_client():
    """A docker-py client of a running engine, started with scripts/docker-engine.sh if none answers.

    Without an engine the test is skipped, or fails when ``AGENTFLY_REQUIRE_DOCKER`` is set (CI sets it).
    """
    if not _engine_answers():
        subprocess.run([str(REPO / "scripts" / "docker-engine.sh"), "start"], capture_output=True, timeout=120,
                       check=False)
    if not _engine_answers():
        if os.environ.get("AGENTFLY_REQUIRE_DOCKER"):
            pytest.fail("no Docker engine answers and AGENTFLY_REQUIRE_DOCKER is set")
        pytest.skip("no Docker engine answers (set AGENTFLY_REQUIRE_DOCKER=1 to make this a failure)")
    import docker

    return docker.from_env(timeout=120)


@pytest.fixture(scope="session")
def r2e_docker_image(docker_client) -> str:
    """The R2E-Gym base image, built offline if missing (envs/r2egym)."""
    from agentfly_gym.images.build import build_image

    return build_image(REPO / "envs" / "r2egym")


@pytest.fixture(scope="session")
def tiny_qwen(test_data) -> Path:
    """A random tiny Qwen2 model on the Qwen3 tokenizer (real model code, fast), built once and cached."""
    from agentfly_gym.rollout.models import tiny_qwen_dir

    return tiny_qwen_dir(test_data / "tokenizers" / "qwen3")


def pytest_collection_modifyitems(config, items):
    """Keep the tests of a module that use one of its module- or class-scoped fixtures on one xdist worker (a group
    named after the module), so that fixture (a Ray cluster, a server, a loaded model) is built once, not once per
    worker.  Explicit ``xdist_group`` marks are kept; without pytest-xdist the marks do nothing."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        if any(d and d[-1].scope in ("module", "class") for d in defs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
