"""The newcomer path: on a machine with no data set up, ``python -m agentfly_gym rollout --policy random`` runs
every environment from what the package ships (Chess, ALFWorld and WebShop samples, ScienceWorld's own
package) plus the locally built R2E-Gym task set.

The run gets no ``AGENTFLY_GYM_DATA`` / ``ALFWORLD_DATA`` / ``WEBSHOP_DATA``, a temporary ``HOME`` and a
temporary cache folder that links back only the entries of the real cache that are not data sets (the built
R2E tasks, converted models, image root filesystems), so a sample missing from the package fails here.
R2E-Gym runs on the daemon-less sandbox backend (the host's python3 + pytest), the quickest start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentfly_gym.data import cache_dir

ENVS = ("Chess-v0", "ScienceWorld-v0", "ALFWorld-v0", "WebShop-v0", "R2EGym-v0")
DATA_SETS = ("chess", "alfworld", "webshop")


@pytest.fixture(scope="module")
def r2e_tasks() -> Path:
    """The local R2E-Gym task set, built once into the shared cache (``agentfly-gym r2e build-tasks``)."""
    from agentfly_gym.envs.r2egym import build_local_tasks

    return build_local_tasks(log=None)


@pytest.fixture
def bare_env(tmp_path, r2e_tasks) -> dict[str, str]:
    real_cache = cache_dir()
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in real_cache.iterdir():
        if entry.name not in DATA_SETS:  # never a data set left in the cache by someone
            (cache / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTFLY_GYM_DATA", "ALFWORLD_DATA", "WEBSHOP_DATA")}
    env.update(HOME=str(tmp_path / "home"), AGENTFLY_GYM_CACHE=str(cache), COLUMNS="250", PYTHONUNBUFFERED="1")
    (tmp_path / "home").mkdir()
    return env


def test_every_env_runs_with_no_data_set_up(tmp_path, bare_env):
    r = subprocess.run([sys.executable, "-m", "agentfly_gym", "envs"], capture_output=True, text=True,
                       env=bare_env, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in DATA_SETS:  # the samples are what the envs read
        assert f"bundled sample: {Path(__file__).resolve().parents[1] / 'agentfly_gym' / 'samples' / name}" \
            in r.stdout.replace("\n", ""), r.stdout
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "agentfly_gym", "rollout", "--policy", "random", "-n", str(len(ENVS)),
            "--concurrency", str(len(ENVS)), "--max-turns", "2", "--max-tokens", "16", "--no-progress",
            "--env-kwargs", json.dumps({"R2EGym-v0": {"backend": "sandbox"}}), "--output-dir", str(out)]
    for env_id in ENVS:
        argv[4:4] = ["--env", env_id]
    r = subprocess.run(argv, capture_output=True, text=True, env=bare_env, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    per_env = summary["per_env"]
    assert sorted(per_env) == sorted(f"agentfly/{e}" for e in ENVS), per_env
    for env_id, s in per_env.items():
        assert (s["trajectories"], s["errors"]) == (1, 0), (env_id, s, r.stderr[-3000:])
        assert s["mean_turns"] >= 1, (env_id, s)
