"""The local R2E-Gym task set: built from pinned PyPI sdists (cached), and for EVERY task the
reward is 0 on the buggy repository and 1 after the gold patch, in a real container: the
sandbox backend (image "host") always, Docker (``agentfly/r2egym``) when an engine answers.

The first build downloads the sdists with pip (network access to the package index) and takes
a few minutes on a 2-core machine; later runs reuse the cache (``$AGENTFLY_GYM_CACHE``).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agentfly_gym.envs.r2egym import LOCAL_BUGS, R2EGymEnv, build_local_tasks, load_tasks
from agentfly_gym.cli.r2e import build_tasks_main
from agentfly_gym.envs.r2egym.grading import _normalise, compare_test_maps
from agentfly_gym.resources import ResourceManager

REPO = Path(__file__).resolve().parents[1]
R2E_COLUMNS = ("repo_name", "docker_image", "commit_hash", "problem_statement", "expected_output_json",
               "parsed_commit_content", "modified_files", "relevant_files", "prompt")


@pytest.fixture(scope="session")
def local_tasks_file() -> Path:
    t = time.monotonic()
    path = build_local_tasks()
    print(f"local R2E task set ready in {time.monotonic() - t:.1f}s")
    return path


@pytest.mark.slow  # builds the 21-task set: sdist downloads and verification, minutes when not cached
def test_task_set_format(local_tasks_file):
    tasks = load_tasks(local_tasks_file)
    assert len(tasks) == len(LOCAL_BUGS) >= 20
    assert len({t.repo_name for t in tasks}) >= 20  # 20+ distinct real packages
    for t, bug in zip(tasks, LOCAL_BUGS):
        assert all(c in t.row for c in R2E_COLUMNS)
        assert t.local
        assert t.task_id == bug.task_id
        assert t.row["source"] == f"pypi:{bug.package}=={bug.version}"
        assert t.expected
        assert set(t.expected.values()) <= {"PASSED", "FAILED", "ERROR"}
        assert t.row["fail_to_pass"], t.task_id  # the bug breaks at least one hidden test
        for rel in t.hidden_tests:  # hidden tests live apart from the repository
            assert (t.hidden_dir / rel).is_file()
            assert not (t.repo_dir / rel).exists()
        assert bug.new in (t.repo_dir / bug.file).read_text(encoding="utf-8")
        assert t.gold_patch.startswith(f"diff --git a/{bug.file} b/{bug.file}")
        assert bug.new.strip() not in t.problem_statement  # the issue shows symptoms, not the fix
        assert json.loads(t.row["expected_output_json"]) == t.expected


@pytest.mark.slow  # builds the 21-task set: sdist downloads and verification, minutes when not cached
def test_rebuild_is_idempotent(local_tasks_file, capsys):
    before = local_tasks_file.read_bytes()
    assert build_tasks_main(["--only", LOCAL_BUGS[0].task_id]) == 0
    assert "0 to build" in capsys.readouterr().out
    assert build_tasks_main(["--only", "no-such-task"]) == 2
    assert local_tasks_file.read_bytes() == before  # building a subset keeps the whole set listed


def _same_verdict_as_upstream_log(info: dict, expected: dict) -> None:
    """Isolated grading reads JUnit XML; upstream's parse of the same run's ``-rA`` log must agree on every
    test's status and on the verdict (for honest runs: the buggy repository and the gold patch), and the grading
    launcher must find the run sound."""
    g = info["grading"]
    if g["mode"] != "isolated":
        return
    # the grading launcher ran the tests and found nothing tampered with: honest runs keep upstream's verdict
    assert g["guard"] == {"applied": True, "sound": True, "problems": [], "audit_hook": True}, g["guard"]
    junit, log = _normalise(info["test_results"]), _normalise(g["log_test_results"])
    assert junit == log, {k: (junit.get(k), log.get(k)) for k in set(junit) | set(log) if junit.get(k) != log.get(k)}
    assert compare_test_maps(junit, expected) == compare_test_maps(log, expected) == info["score"]


async def _reward_before_and_after(env: R2EGymEnv, task_id: str) -> tuple[float, float, dict]:
    await env.areset(options={"task_id": task_id})
    o, r0, term0, _, info0 = await env.astep("<function=finish>\n</function>")
    assert term0
    _same_verdict_as_upstream_log(info0, env._by_id[task_id].expected)
    await env.areset(options={"task_id": task_id})
    o, _r, _term, _trunc, _info = await env.astep(await env.expert_action())
    assert "Exit code: 0" in o, o
    o, r1, term1, _, info1 = await env.astep(await env.expert_action())
    assert term1, o
    _same_verdict_as_upstream_log(info1, env._by_id[task_id].expected)
    if info1["grading"]["mode"] == "isolated":  # the gold patch is applied whole, nothing dropped
        assert not info1["grading"]["dropped"]
        assert info1["grading"]["kept"] == env._by_id[task_id].modified_files
    return r0, r1, info1


async def _check_all(local_tasks_file: Path, **env_kw) -> None:
    async with ResourceManager() as manager:
        envs = [R2EGymEnv(tasks=local_tasks_file, manager=manager, max_instances=2, **env_kw) for _ in range(2)]
        ids = [t.task_id for t in envs[0].tasks]
        results: dict[str, tuple] = {}

        async def worker(env: R2EGymEnv, mine: list[str]) -> None:
            for tid in mine:
                results[tid] = await _reward_before_and_after(env, tid)
            await env.aclose()

        await asyncio.gather(*(worker(e, ids[i::2]) for i, e in enumerate(envs)))
    bad = {tid: (r0, r1, info.get("test_results")) for tid, (r0, r1, info) in results.items() if (r0, r1) != (0.0, 1.0)}
    assert not bad, bad
    assert len(results) == len(ids)


@pytest.mark.slow
@pytest.mark.parametrize("grading", ["isolated", "in_place"])
async def test_every_task_reward_0_then_1_sandbox(local_tasks_file, grading):
    await _check_all(local_tasks_file, backend="sandbox", image="host", grading=grading)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("grading", ["isolated", "in_place"])
async def test_every_task_reward_0_then_1_docker(local_tasks_file, r2e_docker_image, grading):
    await _check_all(local_tasks_file, backend="docker", image=r2e_docker_image, grading=grading)
