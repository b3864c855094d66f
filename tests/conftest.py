"""Shared fixtures: where the shared data sets live, and process-leak checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(autouse=True, scope="session")
def _data_env(tmp_path_factory):
    """Point the library at the shared data and a writable cache for the whole session."""
    os.environ.setdefault("AGENTFLY_GYM_DATA", str(SHARED_DATA))
    os.environ.setdefault("AGENTFLY_GYM_CACHE", str(Path.home() / ".cache" / "agentfly-gym"))
    yield
