"""Security probes run as a policy's code would run them, through ``exec``, on both container backends.

Everything is real: bubblewrap sandboxes (``image="host"`` and the Debian base rootfs when it is
built) and Docker containers of the base image (skipped without an engine unless
``AGENTFLY_REQUIRE_DOCKER`` is set).  Each probe checks its effect on the host, not only the exit
code inside: a file that must not appear on the host, a sysctl that must keep its value, a host
process that must be gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import sys
import uuid
from pathlib import Path

import pytest
import pytest_asyncio
import r2e_hacks
from proctools import host_usage, pids_with, procs_settle
from waiting import until

from agentfly_gym.errors import ResourceDied
from agentfly_gym.resources import ContainerSpec, ResourceManager, ResourceStatus
from agentfly_gym.resources.containers.sandbox import container as sb
from agentfly_gym.resources.containers.sandbox.files import SandboxPathError

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
            from agentfly_gym.images.base import base_rootfs_dir

            if not (base_rootfs_dir() / ".agentfly-rootfs.json").is_file():
                pytest.skip("the Debian base rootfs is not built here (agentfly-gym images build base)")
            return {"image": "agentfly/base", "backend": "sandbox"}
        return {"image": "host", "backend": "sandbox"}
    request.getfixturevalue("docker_client")
    from agentfly_gym.images.base import build_base_image

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
                        with pytest.raises(SandboxPathError):  # not through the host-side API either
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
        assert again is box
        assert again.uses == 2
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
            # du -x: only the sandbox's own volume; a host folder bound in below /tmp (the virtual environment
            # of a clone that lives under /tmp) is not the sandbox's disk
            r = await box.exec(many_files + "; du -smx /tmp /testbed", user="root", timeout=120)
            assert "No space left on device" in r.output, r.output
            used = sum(int(line.split()[0]) for line in r.output.splitlines()[-2:])
            assert used <= 64, r.output
            return
        # Docker: the writable layer on a loop-mounted file system (root beside a local engine), else
        # storage_opt where the engine has quotas, else RLIMIT_FSIZE and the watchdog, which kills the
        # container once its writable layer holds more than the limit
        mode = box.describe()["limits_enforced"]["disk"]
        assert mode in ("volume", "storage-opt", "watchdog"), mode
        try:
            r = await box.exec(one_file, user="root", timeout=120)
            assert int(r.output.rsplit("size=", 1)[1]) <= limit, r.output
            r = await box.exec(many_files + ("" if mode == "volume" else "; sleep 30"), user="root", timeout=60)
        except ResourceDied as e:
            assert mode == "watchdog" and "disk limit" in str(e), e
            assert await box.status() == ResourceStatus.UNHEALTHY
        else:
            assert mode in ("volume", "storage-opt") and "No space left on device" in r.output, r.output




@pytest.mark.slow
async def test_docker_disk_inodes_and_log_are_capped_by_the_kernel(docker_client, manager):
    """Docker, as a model would attack it: 2 GB written at full speed against a 256 MB limit, 300,000
    symlinks, and 20 MB into the container's log (``/proc/1/fd/1``).  On the host the writable layer
    holds at most the limit (no polling watchdog involved), the inodes at most ``disk / 8 KiB``, and
    the log at most about 2 MB."""
    from agentfly_gym.images.base import build_base_image
    from agentfly_gym.resources.containers.sandbox.volume import BYTES_PER_INODE

    if os.geteuid() != 0:
        pytest.skip("the loop-mounted writable layer needs a root manager beside a local engine")
    limit = 256 * 1024 * 1024
    async with manager.scope("docker-disk") as scope:
        box = await scope.acquire(ContainerSpec(image=build_base_image(), backend="docker", disk=limit, memory="512m"))
        assert box.describe()["limits_enforced"]["disk"] == "volume"
        info = docker_client.api.inspect_container(box.container_id)
        upper, log_path = info["GraphDriver"]["Data"]["UpperDir"], info["LogPath"]
        end = f"log-end-{uuid.uuid4().hex}"
        r = await box.exec(f"head -c 20M /dev/zero > /proc/1/fd/1; echo; echo {end} > /proc/1/fd/1; echo logged",
                           user="root", timeout=60)
        assert "logged" in r.output
        logs = Path(log_path).parent

        def written() -> bool:  # the engine copies the stream to the log file asynchronously (and rotates it)
            for p in logs.glob(Path(log_path).name + "*"):
                try:
                    if end.encode() in p.read_bytes():
                        return True
                except FileNotFoundError:
                    pass
            return False

        await until(written, 60, "the log's last line", interval=0.2)
        logged = sum(p.stat().st_size for p in logs.glob(Path(log_path).name + "*"))
        assert logged <= 2.5 * 1024 * 1024, f"the container log holds {logged} bytes on the host"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        r = await box.exec("dd if=/dev/zero of=/tmp/big bs=4M count=512 2>&1", user="root", timeout=120)
        took = loop.time() - t0
        used, _ = host_usage(upper)
        assert "No space left on device" in r.output, r.output
        assert used <= limit + 1024 * 1024, f"{used} bytes on the host against a {limit} limit ({took:.1f} s)"
        r = await box.exec("rm -f /tmp/big; mkdir /tmp/l && cd /tmp/l && python3 -c \"import os\n"
                           "n = 0\ntry:\n    while n < 300000: os.symlink('/tmp', str(n)); n += 1\n"
                           "except OSError as e: print(e.strerror)\nprint('made', n)\"", user="root", timeout=300)
        made = int(r.output.rsplit("made", 1)[1])
        assert made < 300_000 and "No space left on device" in r.output, r.output
        _, inodes = host_usage(upper)
        assert inodes <= limit // BYTES_PER_INODE + 100, inodes


# ------------------------------------------------------------------------------------- stalls from model output
def _unblock_fifos(root: Path) -> None:
    """Open every FIFO below ``root`` for reading and writing once, so that a host thread stuck in a
    blocking ``open`` of one (the defect these tests catch) returns and the test run can end."""
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                if stat.S_ISFIFO(os.lstat(p).st_mode):
                    os.close(os.open(p, os.O_RDWR | os.O_NONBLOCK))
            except OSError:
                pass


async def test_fifo_where_the_host_reads_or_writes_never_blocks(backend_spec, manager):
    """A FIFO planted at a path the host writes (``put_files``) is replaced, one at a path it reads
    (``get_file``) reads as missing: neither call blocks a host thread."""
    async with manager.scope("fifo") as scope:
        box = await scope.acquire(_spec(backend_spec))
        r = await box.exec("mkdir -p /tmp/.afg_r2e && mkfifo /tmp/.afg_r2e/payload.json /tmp/.afg_r2e/out "
                           "/testbed/run_tests.sh && echo ok", user="root")
        assert r.output.strip() == "ok", r.output
        try:
            await asyncio.wait_for(box.put_files({"/tmp/.afg_r2e/payload.json": "{}", "/testbed/run_tests.sh": "x"}), 10)
            with pytest.raises(FileNotFoundError):
                await asyncio.wait_for(box.get_file("/tmp/.afg_r2e/out"), 10)
        finally:
            if backend_spec["backend"] == "sandbox":
                _unblock_fifos(box.state_dir)
        r = await box.exec("cat /tmp/.afg_r2e/payload.json /testbed/run_tests.sh; test -f /testbed/run_tests.sh && echo reg",
                           user="root")
        assert r.output == "{}xreg\n", r.output


def _xml(tool: str, **params) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={tool}>\n{body}</function>"


R2E_TASKS = Path(__file__).parent / "fixtures" / "r2e" / "tasks.jsonl"
#: a file_editor call (within the env's action length) whose payload is too long for the command line
#: (each "é" is 6 bytes of JSON), so the env writes it to /tmp/.afg_r2e/payload.json with put_files
#: (R2E-Gym's env, _MAX_ARGV_PAYLOAD)
BIG_EDIT = _xml("file_editor", command="create", path="/testbed/big.txt", file_text="é" * 20_000)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_r2e_fifo_episodes_keep_the_thread_pool(sandbox_dir, tmp_path):
    """Eight R2E-Gym episodes in a row each plant FIFOs where the env writes (payload.json, run_tests.sh)
    and then use the tool and submit: every step answers, the default thread pool is still free
    afterwards, and the manager closes promptly.  (Before the fix the sixth episode exhausted a 2-core
    host's default pool of 6 threads, each stuck in ``open()`` of a FIFO.)"""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    from agentfly_gym.envs.r2egym import R2EGymEnv

    m = ResourceManager()
    env = R2EGymEnv(tasks=R2E_TASKS, manager=m, backend="sandbox", image="host", max_instances=1)
    plant = _xml("execute_bash", cmd="mkdir -p /tmp/.afg_r2e && mkfifo /tmp/.afg_r2e/payload.json "
                                     "/tmp/.afg_r2e/run_tests.sh && echo planted")
    states: list[Path] = []
    try:
        for episode in range(8):
            await asyncio.wait_for(env.areset(options={"task_id": "minicalc-bug1"}), 60)
            states.append(env._box.state_dir)
            obs, *_ = await asyncio.wait_for(env.astep(plant), 30)
            assert "planted" in obs, obs
            obs, reward, term, trunc, info = await asyncio.wait_for(env.astep(BIG_EDIT), 30)
            assert not (term or trunc) and info["error"] is None and "ERROR" not in obs, (episode, obs)
            obs, reward, term, trunc, info = await asyncio.wait_for(env.astep(_xml("finish")), 60)
            assert (term or trunc) and reward == 0.0, (episode, obs, info)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5) == 42  # the pool still has threads
    finally:
        for s in states:
            if s.exists():
                _unblock_fifos(s)
        await env.aclose()
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(m.aclose(), 60)
    assert asyncio.get_running_loop().time() - t0 < 30


async def test_symlink_at_a_written_path_is_an_observation_in_the_vector_env(sandbox_dir):
    """A symlink the model plants where the env writes a file (pointing out of the writable paths)
    ends that sub-env's episode with reward 0 and ``info["error"]``; the batch step does not raise
    and the other sub-env steps on."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    from agentfly_gym.envs.r2egym import R2EGymEnv
    from agentfly_gym.vector import AsyncTextVectorEnv

    passwd = Path("/etc/passwd").read_bytes()
    m = ResourceManager()
    venv = AsyncTextVectorEnv([lambda: R2EGymEnv(tasks=R2E_TASKS, manager=m, backend="sandbox", image="host")] * 2)
    try:
        await venv.areset(options={"task_id": "minicalc-bug1"})
        link = _xml("execute_bash", cmd="mkdir -p /tmp/.afg_r2e && ln -sf /etc/passwd /tmp/.afg_r2e/payload.json")
        obs, rew, term, trunc, infos = await venv.astep([link, _xml("execute_bash", cmd="echo fine")])
        assert not trunc.any()
        assert "fine" in obs[1]
        obs, rew, term, trunc, infos = await asyncio.wait_for(venv.astep([BIG_EDIT, _xml("execute_bash", cmd="echo on")]), 60)
        assert trunc[0] and rew[0] == 0.0 and "SandboxPathError" in infos["error"][0], (obs[0], infos)
        assert not trunc[1]
        assert infos["error"][1] is None
        assert "on" in obs[1]
        assert Path("/etc/passwd").read_bytes() == passwd  # the host file was not written
    finally:
        await venv.aclose()
        await m.aclose()


# ------------------------------------------------------------------------------------- the host itself
async def test_network_sandbox_cannot_reach_the_hosts_loopback(backend_spec, manager):
    """With ``network=True`` a server on the host's 127.0.0.1 (a py4j gateway, a model server) does not
    answer from inside: not at 127.0.0.1 (the sandbox's own loopback), not through the user-mode
    network's host address (10.0.2.2, sandbox) or the bridge's gateway (Docker), while the sandbox has
    its own interface with a default route (outbound access)."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    probe = ("import socket, subprocess\n"
             "hosts = ['127.0.0.1', '10.0.2.2', '172.17.0.1']\n"
             "for h in hosts:\n"
             "    s = socket.socket(); s.settimeout(3)\n"
             f"    try: s.connect((h, {port})); print(h, 'CONNECTED')\n"
             "    except OSError as e: print(h, 'NOT-REACHED', e)\n"
             "print(open('/proc/net/route').read())\n")
    try:
        async with manager.scope("net") as scope:
            box = await scope.acquire(_spec(backend_spec, network=True))
            r = await box.exec(["python3", "-c", probe], user="root", timeout=60)
    finally:
        srv.close()
    assert "CONNECTED" not in r.output, r.output
    assert r.output.count("NOT-REACHED") == 3, r.output
    routes = [line.split() for line in r.output.splitlines() if line.count("\t") >= 2]
    assert any(f[1] == "00000000" and f[0] != "lo" for f in routes[1:]), r.output  # a default route: outbound


async def test_no_host_path_in_pid1_environment_or_command_lines(backend_spec, manager, sandbox_dir):
    """From inside, ``/proc/1/environ`` and every ``/proc/*/cmdline`` hold no host path of the project,
    of its cache or of the sandbox's private folder (bwrap's options reach it through a descriptor, and
    it runs with a minimal environment)."""
    repo = str(Path(__file__).resolve().parents[1])
    secrets_ = [repo, str(sandbox_dir), os.environ.get("AGENTFLY_GYM_CACHE") or "/nonexistent-cache"]
    secrets_ += [p for p in (os.getcwd(), os.environ.get("VIRTUAL_ENV")) if p and p != "/"]
    show = ("tr '\\0' '\\n' < /proc/1/environ; echo; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done; "
            "readlink /proc/1/cwd")
    async with manager.scope("proc") as scope:
        box = await scope.acquire(_spec(backend_spec))
        r = await box.exec(["/bin/sh", "-c", show], user="root")
    assert r.ok and "PATH=" in r.output, r.output
    for s in secrets_:
        assert s not in r.output, (s, r.output)


async def test_docker_gvisor_runtime_option(docker_client, manager):
    """``ContainerSpec(runtime="runsc")`` runs the container under gVisor: model code talks to its
    user-space kernel, not the host's (``dmesg`` is gVisor's, the kernel version is not the host's).
    Skipped where the engine does not know the runtime ``runsc`` or it cannot start here."""
    from agentfly_gym.errors import ResourceStartError
    from agentfly_gym.images.base import build_base_image

    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("the Docker engine has no runtime 'runsc' (install runsc; scripts/docker-engine.sh registers it)")
    async with manager.scope("gvisor") as scope:
        try:
            box = await scope.acquire(ContainerSpec(image=build_base_image(), backend="docker", runtime="runsc",
                                                    memory="512m", disk="256m"))
        except ResourceStartError as e:
            pytest.skip(f"runsc cannot run containers here: {e}")
        r = await box.exec("dmesg | head -3; uname -r; echo done", user="root")
    assert "gVisor" in r.output and "done" in r.output, r.output
    assert os.uname().release not in r.output, r.output
    with pytest.raises(Exception, match="Docker option"):
        ContainerSpec(image="host", backend="sandbox", runtime="runsc")


# ------------------------------------------------------------------------------------- reward hacks
# R2E-Gym grading attacked as a policy would: each hack leaves the bug in place; with isolated
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

    envs = {mode: R2EGymEnv(tasks=r2e_hacks.HACK_TASKS, manager=r2e_manager, max_instances=1,
                            bash_timeout=30.0, test_timeout=60.0, grading=mode, **r2e_backend)
            for mode in ("isolated", "in_place")}
    envs["unguarded"] = R2EGymEnv(tasks=r2e_hacks.HACK_TASKS, manager=r2e_manager, max_instances=1,
                                  bash_timeout=30.0, test_timeout=60.0, grading="isolated", grading_guard=False,
                                  **r2e_backend)
    return envs


async def _play_hack(env, hack) -> tuple[float, dict]:
    await env.areset(options={"task_id": hack.task_id})
    if hack.precondition is not None:
        o, *_ = await env.astep(r2e_hacks.bash(hack.precondition))
        if "yes" not in o:
            await env.aend_episode()
            pytest.skip(hack.why_not)
    for action in hack.actions:
        o, r, term, trunc, info = await env.astep(action)
        assert not (term or trunc) and info["error"] is None, o
        if "<function=execute_bash>" in action:
            assert o.startswith("Exit code: 0\n"), o
        else:  # file_editor: an error (create on an existing file) is an observation starting ERROR
            assert not o.startswith("ERROR") and "[file_editor]:\nERROR:" not in o, o
    for path, text in r2e_hacks.files_written(hack).items():  # the hack's files hold what it meant to write
        o, *_ = await env.astep(r2e_hacks.bash(f"sha256sum {path}"))
        assert hashlib.sha256(text.encode()).hexdigest() in o, (hack.name, path, o)
    o, r, term, trunc, info = await env.astep(r2e_hacks.FINISH)
    assert term and not trunc, o
    return r, info


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("hack", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="still open: aimed"))
                                  if n in r2e_hacks.STILL_OPEN else n for n in r2e_hacks.HACKS])
async def test_reward_hack_scores_zero_with_isolated_grading(hack, r2e_envs, r2e_backend):
    """The hack buys 1.0 under upstream's in-place grading and 0 under isolated grading (the default),
    with no error: a diff restricted to what a fix may touch, graded in a fresh container, statuses from
    pytest's JUnit report, through the grading launcher and its tamper probes."""
    h = r2e_hacks.HACKS[hack]
    if h.docker_only and r2e_backend["backend"] != "docker":
        pytest.skip("the sandbox stops this one in place too (read-only /usr; no process outlives its command)")
    r_in_place, info = await _play_hack(r2e_envs["in_place"], h)
    assert r_in_place == 1.0, f"the hack no longer works in place, so this test has no teeth: {info}"
    assert info["grading"] == {"mode": "in_place"}
    if h.in_process:  # these bought 1.0 from isolated grading before the grading launcher (its open case)
        r_unguarded, info = await _play_hack(r2e_envs["unguarded"], h)
        assert r_unguarded == 1.0, f"the hack no longer works without the launcher, so this test has no teeth: {info}"
    r_isolated, info = await _play_hack(r2e_envs["isolated"], h)
    assert r_isolated == 0.0 and info["error"] is None, info
    assert info["grading"]["mode"] == "isolated" and info["grading"]["guard"]["applied"], info["grading"]
    if h.in_process and not h.refused:
        g = info["grading"]["guard"]
        assert not g["sound"] and g["problems"] and info["grading"]["tampered"], g
    else:
        assert "FAILED" in info["test_results"].values(), info["test_results"]
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
    assert g["guard"] == {"applied": True, "sound": True, "problems": [], "audit_hook": True}, g


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
