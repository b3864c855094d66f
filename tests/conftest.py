"""Shared fixtures: where the shared data sets live, and process-leak checks."""

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


def _shared_data() -> Path:
    env = os.environ.get("AGENTFLY_GYM_DATA")
    if env:
        return Path(env)
    return (REPO.parent / "shared" / "data").resolve()


SHARED_DATA = _shared_data()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The project's shared data folder (alfworld/, webshop/, chess/, tokenizers/).

    ``$AGENTFLY_GYM_DATA`` wins; else ``../shared/data`` beside the repository.  Read-only.
    """
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data folder not found at {SHARED_DATA}; set AGENTFLY_GYM_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def shared_cases() -> Path:
    """The shared held-back fidelity cases (``cases/`` beside the shared data folder).  Read-only."""
    cases = SHARED_DATA.parent / "cases"
    if not cases.is_dir():
        pytest.fail(f"shared cases folder not found at {cases} (beside the data folder {SHARED_DATA})")
    return cases


@pytest.fixture(autouse=True, scope="session")
def _data_env(tmp_path_factory):
    """Point the library at the shared data and a writable cache for the whole session."""
    os.environ.setdefault("AGENTFLY_GYM_DATA", str(SHARED_DATA))
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
    from agentfly_gym.images import build_image

    return build_image(REPO / "envs" / "r2egym")


@pytest.fixture(scope="session")
def tiny_qwen(shared_data) -> Path:
    """A random tiny Qwen2 model on the Qwen3 tokenizer (real model code, fast), built once and cached."""
    from agentfly_gym.rollout.models import tiny_qwen_dir

    return tiny_qwen_dir(shared_data / "tokenizers" / "qwen3")
