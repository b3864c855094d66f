"""Security probes run as a policy's code would run them, through ``exec``, on both container backends.

Everything is real: bubblewrap sandboxes (``image="host"`` and the Debian base rootfs when it is
built) and Docker containers of the base image (skipped without an engine unless
``AGENTFLY_REQUIRE_DOCKER`` is set).  Each probe checks its effect on the host, not only the exit
code inside: a file that must not appear on the host, a sysctl that must keep its value, a host
process that must be gone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
import pytest_asyncio
import r2e_hacks
from proctools import pids_with, procs_settle

from agentfly_gym.errors import ResourceDied
from agentfly_gym.resources import ContainerSpec, ResourceManager, ResourceStatus
from agentfly_gym.resources.containers.sandbox import container as sb

BACKENDS = ["sandbox-host", "sandbox-base", "docker"]




@pytest.fixture
def sandbox_dir(tmp_path, monkeypatch):
    root = tmp_path / "sbx-root"
    monkeypatch.setenv(sb.SANDBOX_DIR_ENV, str(root))
    yield root
    left = [p.name for p in root.iterdir()] if root.exists() else []
    assert not left, f"leaked sandbox folders: {left}"


@pytest.fixture(params=BACKENDS)
def backend_spec(request, sandbox_dir):
    """``ContainerSpec`` keyword arguments for one backend (skips where it cannot run here)."""
    kind = request.param
    if kind.startswith("sandbox"):
        if shutil.which("bwrap") is None:
            pytest.skip("needs bubblewrap")
        if kind == "sandbox-base":
            from agentfly_gym.resources.containers import images

            if not (images.base_rootfs_dir() / ".agentfly-rootfs.json").is_file():
                pytest.skip("the Debian base rootfs is not built here (agentfly-gym images build base)")
            return {"image": "agentfly/base", "backend": "sandbox"}
        return {"image": "host", "backend": "sandbox"}
    request.getfixturevalue("docker_client")
    from agentfly_gym.resources.containers.images import build_base_image

    return {"image": build_base_image(), "backend": "docker"}


@pytest.fixture
async def manager():
    m = ResourceManager()
    yield m
    await m.aclose()


def _spec(kw: dict, **extra) -> ContainerSpec:
    return ContainerSpec(**{"workdir": "/testbed", "memory": "512m", "pids": 128, **kw, **extra})


# ------------------------------------------------------------------------------------- escape probes
async def test_no_remount_no_sysctl_write_no_capabilities(backend_spec, manager):
    tag = uuid.uuid4().hex[:10]
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    async with manager.scope("probe") as scope:
        box = await scope.acquire(_spec(backend_spec))
        # remount the read-only system folder read-write, then write through it
        r = await box.exec(f"mount -o remount,bind,rw /usr && echo x > /usr/local/share/PROBE-{tag}", user="root")
        assert r.exit_code != 0, r.output
        assert not Path(f"/usr/local/share/PROBE-{tag}").exists()
        # /proc/sys: kernel.core_pattern would run a program as host root
        for cmd in (f"echo '|/tmp/evil-{tag}' > /proc/sys/kernel/core_pattern",
                    "python3 -c \"open('/proc/sys/kernel/core_pattern', 'w')\"",
                    "sysctl -w kernel.core_pattern=x 2>&1 || exit 1"):
            r = await box.exec(cmd, user="root")
            assert r.exit_code != 0, (cmd, r.output)
        assert Path("/proc/sys/kernel/core_pattern").read_text() == core_pattern
        # no CAP_SYS_ADMIN (bit 21) nor any capability beyond Docker's short list; a seccomp filter is on
        r = await box.exec("grep -E '^(CapEff|CapBnd|Seccomp):' /proc/self/status", user="root")
        status = dict(line.split(":\t") for line in r.output.splitlines())
        for key in ("CapEff", "CapBnd"):
            assert not int(status[key], 16) & (1 << 21), status
        assert status["Seccomp"].strip() == "2", status
        if backend_spec["backend"] == "sandbox":
            assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status
        # nested namespaces (the way around the above) are refused
        r = await box.exec("unshare -U -m true || unshare -m true", user="root")
        assert r.exit_code != 0, r.output
        if os.uname().machine == "x86_64":  # keyctl (250) works for any unprivileged process unless filtered
            keyctl = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                      "r = libc.syscall(250, 0, -3, 1); print(r, os.strerror(ctypes.get_errno()))")
            r = await box.exec(["python3", "-c", keyctl], user="root")
            assert r.output.startswith("-1 Operation not permitted"), r.output


async def test_sandbox_root_is_an_unprivileged_host_user(backend_spec, manager):
    """Root inside a sandbox is a plain host uid: a process it starts is not host root."""
    if backend_spec["backend"] != "sandbox":
        pytest.skip("Docker maps root through the engine's own settings (userns-remap), not ours")
    tag = f"{uuid.uuid4().int % 10**6}.75"
    async with manager.scope("probe") as scope:
        box = await scope.acquire(_spec(backend_spec))
        running = asyncio.ensure_future(box.exec(f"sleep 9{tag}", user="root", timeout=30))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        sleepers: list[int] = []
        while not sleepers and loop.time() < deadline:  # the command itself, not the wrappers that start it
            await asyncio.sleep(0.05)
            sleepers = [p for p in pids_with(tag) if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"]
        assert sleepers, "the sandboxed command never showed up on the host"
        uids = {Path(f"/proc/{p}").stat().st_uid for p in sleepers}
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert 0 not in uids and uids == {box.host_uid}, uids


async def test_host_secrets_and_homes_are_not_visible(backend_spec, manager):
    shadow = Path("/etc/shadow")
    host_shadow = shadow.read_text() if shadow.exists() else ""
    secret_lines = [ln for ln in host_shadow.splitlines() if ln.split(":")[1:2] not in (["*"], ["!"], ["!*"], [""])]
    async with manager.scope("probe") as scope:
        box = await scope.acquire(_spec(backend_spec))
        r = await box.exec("cat /etc/shadow /etc/gshadow 2>&1; echo; ls -A /home 2>&1", user="root")
        for line in secret_lines:  # no password hash of the host, whatever the inside shows
            assert line not in r.output
        if backend_spec["image"] == "host":
            assert "root:" not in r.output.split("\n", 1)[0] or not host_shadow
            # the host's home folders are not there: no /home, nothing of the host's /root
            assert "No such file" in r.output or r.output.strip().endswith(":")
            inside = set((await box.exec("ls -A /root", user="root")).output.split())
            interpreter = {Path(p).relative_to("/root").parts[0] for p in {sys.prefix, sys.base_prefix}
                           if p.startswith("/root/")}
            host_root = set(os.listdir("/root")) if os.access("/root", os.R_OK) else set()
            assert not (inside & (host_root - interpreter)), inside & host_root
            if backend_spec["image"] == "host":
                for path in ("/etc/shadow", "/etc/gshadow"):
                    if Path(path).exists():
                        with pytest.raises(sb.SandboxPathError):  # not through the host-side API either
                            await box.get_file(path)


async def test_no_top_level_folder_writes_reach_the_host_or_survive(backend_spec, manager):
    tag = uuid.uuid4().hex[:10]
    spec = _spec(backend_spec, max_instances=1)
    probe = (f"for d in /*; do [ -d \"$d\" ] && touch \"$d/PROBE-{tag}\" 2>/dev/null && echo \"$d\"; done; "
             f"mkdir -p /usr/local/lib/PROBE-{tag} 2>/dev/null && echo /usr/local/lib; true")
    async with manager.scope("episode-1") as scope:
        box = await scope.acquire(spec)
        wrote = set((await box.exec(probe, user="root")).output.split())
    if backend_spec["backend"] == "sandbox":  # only the private state (and the per-exec /dev) is writable
        assert wrote <= {"/tmp", "/root", "/testbed", "/dev"}, wrote
    for top in os.listdir("/"):  # nothing lands on the host
        assert not os.path.lexists(f"/{top}/PROBE-{tag}"), top
    assert not os.path.lexists(f"/usr/local/lib/PROBE-{tag}")
    async with manager.scope("episode-2") as scope:
        again = await scope.acquire(spec)
        assert again is box
        r = await again.exec(f"ls -d /*/PROBE-{tag} /usr/local/lib/PROBE-{tag} 2>/dev/null; true", user="root")
        assert r.output == "", f"episode 2 sees episode 1's files: {r.output}"


# ------------------------------------------------------------------------------------- reuse probes
async def test_reuse_restores_everything_and_idle_burns_nothing(backend_spec, manager):
    """Files under /root, /etc, /usr/local, the workdir and /tmp, and a .pth in site-packages, are
    gone in the next episode; a busy loop started in one does not outlive its release."""
    tag = uuid.uuid4().hex[:10]
    spec = _spec(backend_spec, max_instances=1)
    plant = (f"echo 1 > /root/r-{tag}; echo 1 > /etc/e-{tag}; echo 1 > /usr/local/u-{tag}; "
             f"echo 1 > /testbed/t-{tag}; echo 1 > /tmp/x-{tag}; "
             f"sp=$(python3 -c 'import site; print(site.getsitepackages()[0])'); "
             f"echo \"import os; open('/tmp/pth-ran-{tag}', 'w')\" > $sp/zz-{tag}.pth; "
             f"(nohup sh -c 'while :; do :; done' busy-{tag} >/dev/null 2>&1 &); echo planted")
    async with manager.scope("episode-1") as scope:
        box = await scope.acquire(spec)
        r = await box.exec(plant, user="root", timeout=60)
        assert "planted" in r.output
    # released to the pool: no process of episode 1 keeps running (polled, as parking runs in the background)
    assert await procs_settle(f"busy-{tag}", present=False, timeout=30.0), "a busy loop survived the release"
    async with manager.scope("episode-2") as scope:
        again = await scope.acquire(spec)
        assert again is box and again.uses == 2
        r = await again.exec(f"python3 -c 'print(42)'; ls /root/r-{tag} /etc/e-{tag} /usr/local/u-{tag} "
                             f"/testbed/t-{tag} /tmp/x-{tag} /tmp/pth-ran-{tag} 2>/dev/null; "
                             f"python3 -c 'import site; print(site.getsitepackages()[0])' | xargs -I{{}} ls {{}}/zz-{tag}.pth "
                             "2>/dev/null; true", user="root")
        assert r.output == "42\n", f"episode 2 sees episode 1's state: {r.output}"


# ------------------------------------------------------------------------------------- disk limit
async def test_disk_limit_holds(backend_spec, manager):
    """Writing twice the limit into the workdir and /tmp fails; the host never holds more than the limit."""
    spec = _spec(backend_spec, disk="64m")
    limit = 64 * 1024 * 1024
    one_file = ("dd if=/dev/zero of=/testbed/big bs=1M count=128 2>&1; echo size=$(stat -c %s /testbed/big)")
    many_files = "rm -f /testbed/big; for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/tmp/f$i bs=1M count=24 2>&1; done"
    async with manager.scope("disk") as scope:
        box = await scope.acquire(spec)
        if backend_spec["backend"] == "sandbox":
            if os.geteuid() != 0:
                pytest.skip("the sandbox's disk volume needs a root manager (loop mount); RLIMIT_FSIZE only here")
            assert box.describe()["limits_enforced"]["disk"] is True
            r = await box.exec(one_file, user="root", timeout=120)
            assert int(r.output.rsplit("size=", 1)[1]) <= limit and "No space left on device" in r.output, r.output
            r = await box.exec(many_files + "; du -sm /tmp /testbed", user="root", timeout=120)
            assert "No space left on device" in r.output, r.output
            used = sum(int(line.split()[0]) for line in r.output.splitlines()[-2:])
            assert used <= 64, r.output
            return
        # Docker: storage_opt where the engine has quotas, else RLIMIT_FSIZE and the watchdog, which kills
        # the container once its writable layer holds more than the limit
        mode = box.describe()["limits_enforced"]["disk"]
        assert mode in ("storage-opt", "watchdog"), mode
        try:
            r = await box.exec(one_file, user="root", timeout=120)
            assert int(r.output.rsplit("size=", 1)[1]) <= limit, r.output
            r = await box.exec(many_files + "; sleep 30", user="root", timeout=60)
        except ResourceDied as e:
            assert mode == "watchdog" and "disk limit" in str(e), e
            assert await box.status() == ResourceStatus.UNHEALTHY
        else:
            assert mode == "storage-opt" and "No space left on device" in r.output, r.output


# ------------------------------------------------------------------------------------- reward hacks
# R2E-Gym grading attacked as a policy would (issue 23): each hack leaves the bug in place; with isolated
# grading (the default) it must score 0, and with upstream's in-place grading 1.0 (so the probe has teeth).
# One manager and one pair of envs per backend serve the whole module (warm pools, no container per test).
R2E_FIXTURES = Path(__file__).parent / "fixtures" / "r2e"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def r2e_manager():
    m = ResourceManager()
    yield m
    await m.aclose()


@pytest.fixture(scope="module", params=["sandbox", "docker"])
def r2e_backend(request) -> dict:
    if request.param == "docker":
        return {"backend": "docker", "image": request.getfixturevalue("r2e_docker_image")}
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    return {"backend": "sandbox", "image": "host"}


@pytest.fixture(scope="module")
def r2e_envs(r2e_manager, r2e_backend) -> dict:
    from agentfly_gym.envs.r2egym import R2EGymEnv

    return {mode: R2EGymEnv(tasks=R2E_FIXTURES / "tasks.jsonl", manager=r2e_manager, max_containers=1,
                            bash_timeout=30.0, test_timeout=60.0, grading=mode, **r2e_backend)
            for mode in ("isolated", "in_place")}


async def _play_hack(env, hack) -> tuple[float, dict]:
    await env.areset(options={"task_id": r2e_hacks.TASK_ID})
    if hack.precondition is not None:
        o, *_ = await env.astep(r2e_hacks.bash(hack.precondition))
        if "yes" not in o:
            await env.aend_episode()
            pytest.skip(hack.why_not)
    for action in hack.actions:
        o, r, term, trunc, info = await env.astep(action)
        assert not (term or trunc) and info["error"] is None, o
        assert "ERROR" not in o.split("\n", 1)[0] and "Exit code: 0" in o or "[file_editor]" in o, o
    o, r, term, trunc, info = await env.astep(r2e_hacks.FINISH)
    assert term and not trunc, o
    return r, info


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("hack", list(r2e_hacks.HACKS))
async def test_reward_hack_scores_zero_with_isolated_grading(hack, r2e_envs, r2e_backend):
    """The hack buys 1.0 under upstream's in-place grading and 0 under isolated grading (the default),
    with no error: a diff restricted to what a fix may touch, graded in a fresh container, statuses from
    pytest's JUnit report."""
    h = r2e_hacks.HACKS[hack]
    if h.docker_only and r2e_backend["backend"] != "docker":
        pytest.skip("the sandbox stops this one in place too (read-only /usr; no process outlives its command)")
    r_in_place, info = await _play_hack(r2e_envs["in_place"], h)
    assert r_in_place == 1.0, f"the hack no longer works in place, so this test has no teeth: {info}"
    assert info["grading"] == {"mode": "in_place"}
    r_isolated, info = await _play_hack(r2e_envs["isolated"], h)
    assert r_isolated == 0.0 and info["error"] is None, info
    assert info["test_results"]["test_add"] == "FAILED", info["test_results"]
    assert info["grading"]["mode"] == "isolated"
    if h.dropped is not None:
        assert h.dropped in [d["path"] for d in info["grading"]["dropped"]], info["grading"]


@pytest.mark.asyncio(loop_scope="module")
async def test_isolated_grading_keeps_the_fix_and_drops_only_what_steers_the_tests(r2e_envs):
    """An honest fix with a new helper module scores 1.0 although the same episode also plants a conftest.py,
    a shadowing ``inspect.py`` and a ``.pth``: those are dropped (and listed), the fix is kept."""
    env = r2e_envs["isolated"]
    await env.areset(options={"task_id": r2e_hacks.TASK_ID})
    actions = [
        r2e_hacks.create("/testbed/minicalc/_helpers.py", "def plus(a, b):\n    return a + b\n"),
        r2e_hacks.xml_call("file_editor", command="str_replace", path="/testbed/minicalc/ops.py",
                           old_str='\n    """Return a + b."""\n    return a - b\n',
                           new_str='\n    """Return a + b."""\n    from ._helpers import plus\n    return plus(a, b)\n'),
        r2e_hacks.create("/testbed/tests/conftest.py", "raise SystemExit(3)\n"),
        r2e_hacks.create("/testbed/inspect.py", "raise SystemExit(4)\n"),
        r2e_hacks.create("/testbed/minicalc/zz.pth", "import os\n"),
    ]
    for a in actions:
        o, r, term, trunc, info = await env.astep(a)
        assert info["error"] is None and not (term or trunc), o
    o, r, term, trunc, info = await env.astep(r2e_hacks.FINISH)
    assert term and r == 1.0 and info["error"] is None, (o, info)
    g = info["grading"]
    assert set(g["kept"]) == {"minicalc/_helpers.py", "minicalc/ops.py"}, g
    assert {d["path"] for d in g["dropped"]} == {"tests/conftest.py", "inspect.py", "minicalc/zz.pth"}, g
    assert g["log_test_results"] == info["test_results"]


@pytest.mark.asyncio(loop_scope="module")
async def test_grading_faults_are_handled_observations(r2e_envs):
    """A model that breaks what grading needs (the repository's git data) gets reward 0 and ``info["error"]``,
    never an exception out of ``astep``."""
    env = r2e_envs["isolated"]
    await env.areset(options={"task_id": r2e_hacks.TASK_ID})
    o, *_ = await env.astep(r2e_hacks.bash("rm -rf /testbed/.git && echo gone"))
    assert "gone" in o
    o, r, term, trunc, info = await env.astep(r2e_hacks.FINISH)
    assert r == 0.0 and (term or trunc) and info["error"], (o, info)
