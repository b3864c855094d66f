"""The newcomer path: on a machine with no data set up, ``python -m agentfly_gym rollout --policy random`` runs
every environment from what the package ships (Chess, ALFWorld and WebShop samples, ScienceWorld's own
package) plus the locally built R2E-Gym task set.

The run gets no ``AGENTFLY_GYM_DATA`` / ``ALFWORLD_DATA`` / ``WEBSHOP_DATA``, a temporary ``HOME`` and a
temporary cache folder that links back only the entries of the real cache that are not data sets (the built
R2E tasks, converted models, image root filesystems), so a sample missing from the package fails here.
R2E-Gym runs on the daemon-less sandbox backend (the host's python3 + pytest), the quickest start.

The test suite too needs nothing beside the clone: its data ships in ``tests/data`` (see its README), no test
file names a folder outside the repository, and the tests that read data pass from a copy of the repository
placed where nothing is beside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentfly_gym.data.paths import cache_dir

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"
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


@pytest.mark.slow
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


# ------------------------------------------------------------------------------------- the test suite's data

# Names of the folder beside the repository that the project's own machines have and a newcomer's does not
# (written in pieces, so that this file does not match its own check).
_NAME = "sha" + "red"
_OUTSIDE = re.compile("|".join([r"\.\./" + _NAME, _NAME + r"/(?:data|cases)", r"[\"']" + _NAME + r"[\"']",
                                r"REPO\.parent\b"]))
# Tests that read every kind of test data through the conftest fixtures (data root, cases, tokenizer) and the
# ALFWorld games named in benchmarks/fidelity_alfworld.py; about a minute, mostly imports.
_DATA_TESTS = (
    "tests/test_data_samples.py",
    "tests/test_alfworld.py::test_split_counts_match_alfworld",
    "tests/test_alfworld.py::test_task_type_filter",
    "tests/test_alfworld.py::test_upstream_train_layout_and_solvable_filter",
    "tests/test_alfworld_fidelity.py::test_upgrade_game_is_the_2_1_2_release",
    "tests/test_webshop_fidelity.py::test_reward_cases_reproduce_upstream",
    "tests/test_chat_encode_fast.py::test_slow_tokenizer_is_refused",
)


def test_no_test_names_a_folder_outside_the_repository():
    """No file under tests/ reaches beside the clone (the project machines' data folder there, by its name or
    through the repository's parent folder), and every link in tests/data stays inside the repository."""
    offenders = [f"{p.relative_to(REPO)}:{i}: {line.strip()}"
                 for p in sorted((REPO / "tests").rglob("*.py"))
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if _OUTSIDE.search(line)]
    assert offenders == [], "\n".join(offenders)
    outside = [p for p in TEST_DATA.rglob("*") if not p.resolve().is_relative_to(REPO.resolve())]
    assert outside == []
    for name in ("alfworld", "chess", "webshop", "tokenizers/qwen3", "cases"):
        assert (TEST_DATA / name / "LICENSE").is_file(), name  # each source keeps its licence
        assert f"`{name}/" in (TEST_DATA / "README.md").read_text(encoding="utf-8"), name  # and is described


def test_games_the_tests_name_are_in_the_test_data():
    """Every ALFWorld trial that a test or the fidelity module plays by name is in tests/data (a game missing
    there would only show as a failure on a machine without the full data set)."""
    sources = [*(REPO / "tests").glob("*.py"), REPO / "benchmarks" / "fidelity_alfworld.py"]
    named = {m for p in sources for m in re.findall(r"valid_(?:seen|unseen|train)/[\w-]+/trial_T[\d_]+",
                                                    p.read_text(encoding="utf-8"))}
    missing = [t for t in sorted(named) if not (TEST_DATA / "alfworld" / "json_2.1.1" / t / "game.tw-pddl").is_file()]
    assert len(named) >= 4
    assert missing == []


@pytest.fixture(scope="module")
def lone_copy(tmp_path_factory) -> Path:
    """A copy of the repository (working tree, no .git or virtual environment) in a temporary folder with
    nothing beside it, as a newcomer's clone."""
    root = tmp_path_factory.mktemp("lone") / "agentfly-gym"
    shutil.copytree(REPO, root, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", ".pytest_cache", "*.egg-info", "runs", "build", "dist"))
    assert [p.name for p in root.parent.iterdir()] == [root.name]
    return root


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_data_reading_tests_pass_with_nothing_beside_the_clone(lone_copy, tmp_path):
    """The conftest's data lookup (``test_data``/``test_data``, ``test_cases``/``test_cases``, the Qwen3
    tokenizer) works in a copy of the repository with nothing beside it and no data variable set: the copy's own
    package and tests/data are what the tests read."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENTFLY_GYM_DATA", "ALFWORLD_DATA", "WEBSHOP_DATA", "PYTHONPATH")}
    env.update(PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", "import agentfly_gym; print(agentfly_gym.__file__)"], cwd=lone_copy,
                       env=env, capture_output=True, text=True, timeout=300)
    assert Path(r.stdout.strip()).is_relative_to(lone_copy), r.stdout + r.stderr  # the copy's package, not ours
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_DATA_TESTS],
                       cwd=lone_copy, env=env, capture_output=True, text=True, timeout=840)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) >= 13 and not re.search(r"skipped|deselected", r.stdout), r.stdout[-2000:]
