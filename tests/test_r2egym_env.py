"""R2E-Gym environment on real container backends: tool semantics on a hand-written fixture
repository, one container per rollout across turns, a killed container, grading at the step
limit, and Gymnasium's env checker.

Backends: the bubblewrap sandbox (image "host": the host's python3 + pytest) always; Docker
with the project's ``agentfly/r2egym`` image when an engine answers (skipped otherwise unless
``AGENTFLY_REQUIRE_DOCKER`` is set).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path

import gymnasium
import pytest

import agentfly_gym  # noqa: F401  (registers agentfly/R2EGym-v0)
from agentfly_gym.envs.r2egym import R2EGymEnv
from agentfly_gym.resources import ResourceManager
from r2e_hacks import NO_BYTECODE

FIXTURES = Path(__file__).parent / "fixtures" / "r2e"
REPO = Path(__file__).resolve().parents[1]


def _xml(tool: str, **params) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={tool}>\n{body}</function>"


@pytest.fixture(params=["sandbox", "docker"])
def backend_kw(request) -> dict:
    if request.param == "docker":
        return {"backend": "docker", "image": request.getfixturevalue("r2e_docker_image")}
    return {"backend": "sandbox", "image": "host"}


@pytest.fixture
async def manager():
    m = ResourceManager()
    yield m
    await m.aclose()


def _env(manager, backend_kw, **kw) -> R2EGymEnv:
    return R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", manager=manager, **backend_kw, **kw)


@pytest.mark.slow
async def test_tool_semantics(manager, backend_kw):
    env = _env(manager, backend_kw, bash_timeout=3.0, max_output=2000)
    obs, info = await env.areset(options={"task_id": "minicalc-bug1"})
    assert "minicalc.add(2, 3)` returns -1" in obs
    assert info["backend"] == backend_kw["backend"]
    ops = "/testbed/minicalc/ops.py"

    async def run(action: str) -> str:
        o, r, term, trunc, inf = await env.astep(action)
        assert (r, term, trunc, inf["error"]) == (0.0, False, False, None), o
        return o

    async def bash(cmd: str) -> str:
        return await run(_xml("execute_bash", cmd=cmd))

    o = await run(_xml("file_editor", command="view", path=ops))
    assert "     3     return a - b" in o
    assert "     8     return a - b" in o
    o = await run(_xml("file_editor", command="view", path=ops, view_range="[5, 6]"))
    assert "def sub" in o
    assert "def add" not in o
    assert "ERROR: Invalid view_range" in await run(_xml("file_editor", command="view", path=ops, view_range="[40, 50]"))
    o = await run(_xml("file_editor", command="view", path="/testbed"))
    assert "/testbed/minicalc/ops.py" in o
    assert "/testbed/tests" not in o
    assert "ERROR" in await run(_xml("file_editor", command="view", path="minicalc/ops.py"))  # not absolute
    # str_replace: non-unique and missing old_str are refused, the file is untouched
    o = await run(_xml("file_editor", command="str_replace", path=ops, old_str="return a - b", new_str="return a + b"))
    assert "ERROR" in o
    assert "Multiple occurrences" in o
    assert "[3, 8]" in o
    o = await run(_xml("file_editor", command="str_replace", path=ops, old_str="return a ** b", new_str="x"))
    assert "ERROR" in o
    assert "did not appear verbatim" in o
    assert (await bash("md5sum minicalc/ops.py")).count("minicalc/ops.py") == 1
    before = await bash("cat minicalc/ops.py")
    o = await run(_xml("file_editor", command="str_replace", path=ops,
                       old_str='\n    """Return a + b."""\n    return a - b\n',
                       new_str='\n    """Return a + b."""\n    return a + b\n'))
    assert "has been edited" in o
    assert "return a + b" in o
    assert "5" in await bash("python3 -c 'import minicalc; print(minicalc.add(2, 3))'")
    # undo_edit restores the previous content; a second undo has nothing left
    assert "undone successfully" in await run(_xml("file_editor", command="undo_edit", path=ops))
    assert await bash("cat minicalc/ops.py") == before
    assert "ERROR" in await run(_xml("file_editor", command="undo_edit", path=ops))
    # insert after line 0 (top) and at a bad line
    o = await run(_xml("file_editor", command="insert", path=ops, insert_line="0", new_str="# header"))
    assert "has been edited" in o
    assert "# header\ndef add" in await bash("head -2 minicalc/ops.py")
    assert "ERROR: Invalid insert_line" in await run(_xml("file_editor", command="insert", path=ops, insert_line="99",
                                                          new_str="x"))
    # create: new file yes, existing file no
    assert "File created" in await run(_xml("file_editor", command="create", path="/testbed/notes/new.py",
                                            file_text="X = 1\n"))
    assert "X = 1" in await bash("cat notes/new.py")
    assert "ERROR: File already exists" in await run(_xml("file_editor", command="create", path=ops, file_text="x"))
    # search: folder, file, nothing
    o = await run('{"name": "search", "arguments": {"search_term": "return a"}}')
    assert 'Found 3 matches for "return a"' in o
    assert "/testbed/minicalc/ops.py (3 matches)" in o
    o = await run(_xml("search", search_term="def sub", path=ops))
    assert "7:def sub(a, b):" in o  # one line lower after the insert
    assert "No matches found" in await run(_xml("search", search_term="zzz_nothing"))
    # execute_bash: exit code, timeout (killed), output cap
    assert "Exit code: 3" in await bash("echo hi; exit 3")
    t = time.monotonic()
    o = await bash("sleep 30; echo never")
    assert "took too long" in o
    assert "never" not in o
    assert time.monotonic() - t < 28
    o = await bash("yes abcdefgh | head -c 200000")
    assert len(o) < 3000
    # a malformed action is a handled observation
    o = await run("please fix it")
    assert o.startswith("ERROR: could not parse the tool call")
    assert "<function=" in o
    await env.aclose()


@pytest.mark.slow
async def test_same_container_across_turns_and_clean_reuse(manager, backend_kw):
    env = _env(manager, backend_kw, max_instances=1)
    _, info = await env.areset(seed=1)
    box = next(iter(env.scope.resources.values()))
    o, *_, i1 = await env.astep(_xml("execute_bash", cmd="echo state > /testbed/marker.txt; echo $$"))
    o, *_, i2 = await env.astep(_xml("execute_bash", cmd="cat /testbed/marker.txt"))
    assert "state" in o
    assert info["container"] == i1["container"] == i2["container"] == box.id
    assert list(env.scope.resources.values()) == [box]
    # next rollout: the pool's single container is reused, reset, and holds a fresh copy of the repo
    _, info2 = await env.areset(seed=2)
    assert info2["container"] == box.id
    o, *_ = await env.astep(_xml("execute_bash", cmd="ls /testbed; git -C /testbed status --short"))
    assert "marker.txt" not in o
    assert "minicalc" in o
    await env.aclose()


@pytest.mark.slow
async def test_disk_limit_holds_for_a_model_that_fills_the_disk(manager, backend_kw):
    """The env's ``disk`` limit reaches the container: a 160 MB write under a 64 MB limit fails in
    the sandbox (no space left) or ends the episode on Docker (its watchdog kills the container);
    either way the host never receives the 160 MB and the next episode starts clean."""
    env = _env(manager, backend_kw, disk="64m", max_instances=1, bash_timeout=60.0)
    await env.areset(seed=0)
    box = next(iter(env.scope.resources.values()))
    assert box.spec.disk == 64 * 1024 * 1024
    o, r, term, trunc, info = await env.astep(
        _xml("execute_bash", cmd="dd if=/dev/zero of=/testbed/big bs=1M count=160 2>&1; du -m /testbed/big"))
    if not trunc:
        sizes = [int(line.split()[0]) for line in o.splitlines() if line.strip().endswith("/testbed/big")]
        assert sizes and sizes[-1] <= 64, o
    else:
        assert info["error"], o
    await env.areset(seed=1)
    o, *_ = await env.astep(_xml("execute_bash", cmd="ls /testbed"))
    assert "big" not in o.split()
    assert "minicalc" in o
    await env.aclose()


def _kill(box) -> None:
    if box.backend_name == "docker":
        import docker

        docker.from_env().api.kill(box.container_id)
    else:
        shutil.rmtree(box.state_dir)


@pytest.mark.slow
async def test_killed_container_ends_only_its_rollout(manager, backend_kw):
    a, b = _env(manager, backend_kw, max_instances=2), _env(manager, backend_kw, max_instances=2)
    (_, ia), (_, ib) = await asyncio.gather(a.areset(seed=0), b.areset(seed=0))
    assert ia["container"] != ib["container"]

    async def victim():
        _kill(next(iter(a.scope.resources.values())))
        return await a.astep(_xml("execute_bash", cmd="echo hi"))

    async def survivor():
        await b.astep(await b.expert_action())
        return await b.astep(await b.expert_action())

    (oa, ra, ta, tra, infa), (_ob, rb, tb, _trb, infb) = await asyncio.gather(victim(), survivor())
    assert tra
    assert not ta
    assert ra == 0.0
    assert infa["error"]
    assert "Error" in oa
    assert tb
    assert rb == 1.0
    assert infb["error"] is None
    assert infb["won"]
    await a.aclose()
    await b.aclose()


@pytest.mark.slow
async def test_grading_at_the_step_limit_and_finish_without_fix(manager):
    env = _env(manager, {"backend": "sandbox", "image": "host"}, max_episode_steps=2)
    await env.areset(seed=0)
    o, r, term, trunc, info = await env.astep(await env.expert_action())
    assert (r, term, trunc) == (0.0, False, False)
    o, r, term, trunc, info = await env.astep(_xml("execute_bash", cmd="true"))
    assert trunc
    assert not term
    assert r == 1.0
    assert "Step limit reached" in o
    assert info["test_results"] == {"test_add": "PASSED", "test_sub": "PASSED", "TestMul.test_mul": "PASSED"}
    await env.areset(seed=0)
    o, r, term, trunc, info = await env.astep(_xml("finish"))
    assert term
    assert r == 0.0
    assert info["test_results"]["test_add"] == "FAILED"
    assert not info["won"]
    await env.aclose()


def test_check_env_and_make():
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make("agentfly/R2EGym-v0", tasks=str(FIXTURES / "tasks.jsonl"), backend="sandbox", image="host")
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(seed=3)
        assert info["task_id"] == "minicalc-bug1"
        assert "<github_issue>" in obs
        obs, _r, term, trunc, _info = env.step("not a tool call")
        assert not term
        assert not trunc
        assert obs.startswith("ERROR")
    finally:
        env.close()


@pytest.mark.slow
async def test_idle_containers_are_removed_after_max_idle_time(manager, r2e_docker_image, docker_client):
    """A container the pool keeps idle after the last episode (on Docker, the fresh one made when it went
    idle) is removed once ``max_idle_time`` passes, while the manager stays open; within it, the next
    episode reuses it."""
    import os

    env = _env(manager, {"backend": "docker", "image": r2e_docker_image}, max_instances=1, max_idle_time=5.0)
    await env.areset(seed=1)
    (box,) = env.scope.resources.values()
    key = box.spec.key
    await env.aend_episode()
    _, info = await env.areset(seed=2)
    assert info["container"] == box.id                       # warm reuse within the idle time
    await env.aclose()

    def pool_containers() -> list:
        import docker

        try:
            return docker_client.containers.list(all=True, filters={"label": [f"agentfly.pool={key}",
                                                                              f"agentfly.pid={os.getpid()}"]})
        except docker.errors.NotFound:  # listed, then removed before docker-py inspected it: look again
            return ["removed while listed"]

    deadline = time.monotonic() + 120
    while pool_containers() or manager.metrics()[key]["idle"]:
        assert time.monotonic() < deadline, f"containers still up: {pool_containers()}"
        await asyncio.sleep(0.2)
    assert not manager.closed
    assert manager.metrics()[key]["recycled"] == 1
    assert R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", backend="sandbox").max_idle_time == 300.0


def test_async_vector_env_forked_after_the_parent_used_docker(r2e_docker_image, docker_client):
    """A worker forked after the parent used Docker (any container env before, in the same process) inherits
    the parent's default manager and its Docker thread pool, whose threads do not exist in the child but count
    as idle: the worker's reset waited on it until ``reset_timeout`` (found by CI, where earlier tests had used
    the pool).  The child now runs on a loop and a default manager of its own, with its own thread pool."""
    from gymnasium.vector import AsyncVectorEnv

    from agentfly_gym.resources.containers.docker.engine import DockerEngine
    from agentfly_gym.resources.select import default_manager
    from agentfly_gym.utils.aio import run_sync

    async def use_docker() -> None:  # on the sync API's loop, through its default manager, as a sync env does
        engine = default_manager().services.get(DockerEngine)
        await asyncio.gather(*(engine.in_thread(lambda: engine.client().ping()) for _ in range(8)))

    run_sync(use_docker())  # the parent's pool now has idle threads

    def make():
        return gymnasium.make("agentfly/R2EGym-v0", tasks=FIXTURES / "tasks.jsonl", backend="docker",
                              image=r2e_docker_image, reset_timeout=120)

    venv = AsyncVectorEnv([make, make], shared_memory=False, context="fork")
    try:
        obs, _ = venv.reset(seed=[0, 1])
        assert len(obs) == 2
    finally:
        venv.close()


def test_async_vector_env_workers_leave_no_container_after_close(r2e_docker_image, docker_client):
    """Gymnasium's ``AsyncVectorEnv``: each worker process makes its env on its own default manager, and a
    ``multiprocessing`` worker ends with ``os._exit`` (no ``atexit``); closing the vector env must still
    remove the workers' containers (found by the memory benchmark: all of them were left running)."""
    from gymnasium.vector import AsyncVectorEnv

    def make():
        return gymnasium.make("agentfly/R2EGym-v0", tasks=FIXTURES / "tasks.jsonl", backend="docker",
                              image=r2e_docker_image)

    venv = AsyncVectorEnv([make, make], shared_memory=False)
    pids = [p.pid for p in venv.processes]
    try:
        venv.reset(seed=[0, 1])

        def containers() -> list:
            return [c for pid in pids
                    for c in docker_client.containers.list(all=True, filters={"label": [f"agentfly.pid={pid}"]})]

        assert len(containers()) >= 2, "each worker runs its episode in a container"
    finally:
        venv.close()
    deadline = time.monotonic() + 60
    while left := containers():
        assert time.monotonic() < deadline, f"containers of closed workers still up: {[c.name for c in left]}"
        time.sleep(0.5)


def _upstream_style_image(docker_client, base_image: str, tmp_path: Path) -> str:
    """An image laid out as R2E-Gym's task images are: the buggy repository as a git checkout at /testbed, the
    hidden tests at /r2e_tests, /run_tests.sh running them with ``pytest -rA`` (built from the fixture task)."""
    ctx = tmp_path / "ctx"
    shutil.copytree(FIXTURES / "repos" / "minicalc", ctx / "testbed", ignore=NO_BYTECODE)
    (ctx / "r2e_tests").mkdir()
    shutil.copy(FIXTURES / "hidden" / "minicalc" / "tests" / "test_calc.py", ctx / "r2e_tests" / "test_1.py")
    (ctx / "run_tests.sh").write_text("#!/bin/bash\ncd /testbed\n"
                                      "PYTHONPATH=/testbed python3 -m pytest -rA -p no:cacheprovider r2e_tests\n")
    (ctx / "Dockerfile").write_text(f"FROM {base_image}\nCOPY testbed /testbed\nCOPY r2e_tests /r2e_tests\n"
                                    "COPY run_tests.sh /run_tests.sh\n"
                                    "RUN cd /testbed && git init -q . && git add -A && git commit -qm base\n")
    tag = f"agentfly-test/r2e-upstream-row:{uuid.uuid4().hex[:12]}"
    docker_client.images.build(path=str(ctx), tag=tag, rm=True)
    return tag


@pytest.mark.slow
async def test_upstream_row_isolated_grading(manager, r2e_docker_image, docker_client, tmp_path):
    """An R2E-Gym row (its own image with /r2e_tests and /run_tests.sh): isolated grading records the base from
    the image's git checkout, hides the tests as upstream does, and grades the diff in a fresh container of
    the row's image through the grading launcher (the image's /run_tests.sh runs ``python3 -m pytest``): 0
    unfixed, 1 after the gold patch, 0 for a pass-all conftest.py and for a package wrapping
    ``TestReport.__init__``, which in place buy 1."""
    import r2e_hacks

    image = _upstream_style_image(docker_client, r2e_docker_image, tmp_path)
    row = json.loads((FIXTURES / "tasks.jsonl").read_text().splitlines()[0])
    up = {k: row[k] for k in ("repo_name", "problem_statement", "expected_output_json", "patch", "modified_files")}
    (tmp_path / "rows.jsonl").write_text(json.dumps({**up, "docker_image": image, "commit_hash": "0" * 40}) + "\n")
    hook = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    conftest = _xml("file_editor", command="create", path="/testbed/conftest.py", file_text=hook)
    try:
        results = {}
        for mode in ("isolated", "in_place"):
            env = R2EGymEnv(tasks=tmp_path / "rows.jsonl", manager=manager, backend="docker", grading=mode)
            for name in ("unfixed", "gold", "conftest", "wrap"):
                await env.areset(options={"task_index": 0})
                if name == "gold":
                    await env.astep(await env.expert_action())
                elif name == "conftest":
                    await env.astep(conftest)
                elif name == "wrap":
                    await env.astep(r2e_hacks.HACKS["testreport_wrap"].actions[0])
                o, r, term, _trunc, info = await env.astep(_xml("finish"))
                assert term and info["error"] is None, (o, info)
                results[mode, name] = r
                if mode == "isolated":
                    assert info["grading"]["guard"]["applied"], info["grading"]
                    assert info["grading"]["guard"]["sound"] == (name != "wrap"), info["grading"]
            await env.aclose()
        assert results == {("isolated", "unfixed"): 0.0, ("isolated", "gold"): 1.0, ("isolated", "conftest"): 0.0,
                           ("isolated", "wrap"): 0.0, ("in_place", "unfixed"): 0.0, ("in_place", "gold"): 1.0,
                           ("in_place", "conftest"): 1.0, ("in_place", "wrap"): 1.0}
    finally:
        await manager.aclose()
        docker_client.images.remove(image, force=True)
