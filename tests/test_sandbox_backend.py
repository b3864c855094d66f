"""The daemon-less sandbox container backend, against the real bubblewrap and the real kernel.

Nothing is faked: every test runs ``bwrap`` and checks the effect on the host (``/proc``,
cgroups, the private folders).  Needs the system package ``bubblewrap``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
from proctools import pids_with, procs_settle
from waiting import wait_until

from agentfly_gym.errors import ConfigError, ResourceDied, ResourceUnavailable
from agentfly_gym.resources import ContainerSpec, ResourceManager, ResourceStatus
from agentfly_gym.resources.containers.reaper import reap_sandbox_orphans
from agentfly_gym.resources.containers.sandbox import cgroups
from agentfly_gym.resources.containers.sandbox import container as sb
from agentfly_gym.resources.containers.sandbox.container import SandboxContainer
from agentfly_gym.resources.containers.sandbox.files import SandboxPathError
from agentfly_gym.resources.containers.sandbox.container import create as create_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap ('bwrap' on PATH)")




def _sandbox_cgroups(name: str) -> list[Path]:
    roots = [Path("/sys/fs/cgroup") / cgroups.CGROUP_PARENT]
    roots += [b / cgroups.CGROUP_PARENT for b in (cgroups.cgroup1_dir(c) for c in ("memory", "pids", "cpu")) if b is not None]
    return [r / name for r in roots if (r / name).exists()]


@pytest.fixture
def sandbox_dir(tmp_path, monkeypatch):
    """A private sandbox root for the test; checked empty (no leaked private folder) at the end."""
    root = tmp_path / "sbx-root"
    monkeypatch.setenv(sb.SANDBOX_DIR_ENV, str(root))
    yield root
    leftovers = [p.name for p in root.iterdir()] if root.exists() else []
    assert not leftovers, f"leaked sandbox folders: {leftovers}"


@pytest.fixture
async def make_box(sandbox_dir):
    """Start sandboxes from spec overrides; every one is released and checked gone afterwards."""
    boxes: list[SandboxContainer] = []

    async def make(**kw) -> SandboxContainer:
        kw.setdefault("image", "host")
        kw.setdefault("backend", "sandbox")
        limits = kw.pop("limits", "auto")
        box = SandboxContainer(ContainerSpec(**kw), labels={"agentfly.manager": "test-manager"}, limits=limits)
        boxes.append(box)
        await box.start()
        return box

    yield make
    for b in boxes:
        await b.adestroy()
        assert not _sandbox_cgroups(b.name), f"cgroup of {b.name} left behind"


async def test_exec_round_trip_and_exit_codes(make_box):
    box = await make_box()
    assert await box.status() == ResourceStatus.READY
    r = await box.exec("echo out; echo err >&2; exit 3")
    assert r.exit_code == 3
    assert not r.ok
    assert not r.timed_out
    assert "out" in r.output
    assert "err" in r.output
    r = await box.exec(["python3", "-c", "import sys; print(sys.argv[1])", "a b;c"])
    assert r.ok
    assert r.output == "a b;c\n"
    r = await box.exec(["/no/such/program"])
    assert r.exit_code != 0
    # a command killed by a signal reports 128 + N, as Docker does
    r = await box.exec("kill -9 $$")
    assert r.exit_code == 137
    d = box.describe()
    assert d["backend"] == "sandbox"
    assert d["limits"] in ("cgroup2", "cgroup1", "rlimit")
    with pytest.raises(ConfigError):
        await box.exec("")
    with pytest.raises(ConfigError):
        await box.exec("true", timeout=0)


async def test_workdir_env_user_and_readonly_root(make_box):
    box = await make_box(workdir="/testbed", env={"FOO": "from-spec", "BAR": "x"})
    r = await box.exec('pwd; echo "$FOO $BAR $HOME"')
    assert r.output.split("\n")[:2] == ["/testbed", "from-spec x /root"]
    r = await box.exec('pwd; echo "$FOO"', workdir="/tmp", env={"FOO": "from-exec"})
    assert r.output.split("\n")[:2] == ["/tmp", "from-exec"]
    # the host's environment does not leak in
    os.environ["AFG_SECRET_TEST"] = "leak"
    try:
        r = await box.exec('echo "[$AFG_SECRET_TEST]"')
        assert r.output.strip() == "[]"
    finally:
        del os.environ["AFG_SECRET_TEST"]
    r = await box.exec("id -u", user="1000")
    assert r.output.strip() == "1000"
    # the root filesystem is read-only; the private paths are writable
    r = await box.exec("touch /usr/afg-should-fail")
    assert r.exit_code != 0
    assert not Path("/usr/afg-should-fail").exists()
    assert (await box.exec("touch /testbed/a /tmp/b /root/c")).ok
    # image="host" gives the running interpreter with its packages (pytest for R2E tasks)
    assert (await box.exec("python3 -c 'import pytest'")).ok


async def test_timeout_kills_the_whole_process_tree(make_box):
    box = await make_box()
    tag = f"{uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 10**6}"
    # a child in the background plus a foreground sleep: both must die
    r = await box.exec(f"sleep 1{tag} & sleep 2{tag}", timeout=1.0)
    assert r.timed_out
    assert r.exit_code == -1
    assert r.duration < 60
    assert await procs_settle(tag, present=False)


async def test_processes_do_not_outlive_their_exec(make_box):
    box = await make_box()
    tag = f"{uuid.uuid4().int % 10**6}.5"
    r = await box.exec(f"(sleep 3{tag} &) ; echo started")
    assert r.ok
    assert "started" in r.output
    assert await procs_settle(tag, present=False)


async def test_output_is_capped_head_and_tail(make_box):
    box = await make_box()
    r = await box.exec("python3 -c \"print('A' * 500000 + 'Z' * 500000)\"", max_output=1000)
    assert r.truncated
    assert len(r.output) <= 1000
    assert r.output.startswith("AAAA")
    assert r.output.rstrip().endswith("ZZZZ")
    assert "characters cut" in r.output
    r = await box.exec("echo short", max_output=1000)
    assert not r.truncated
    assert r.output == "short\n"


async def test_files_persist_across_execs_and_reset_restores(make_box):
    box = await make_box(workdir="/testbed")
    await box.put_files({"/testbed/pkg/mod.py": "X = 1\n", "/tmp/data.bin": b"\x00\x01"}, mode=0o755)
    assert await box.get_file("/testbed/pkg/mod.py") == b"X = 1\n"
    r = await box.exec("ls -l /tmp/data.bin; python3 -c 'import pkg.mod as m; print(m.X)'")
    assert r.ok
    assert "-rwxr-xr-x" in r.output
    assert r.output.strip().endswith("1")
    assert (await box.exec("echo changed > pkg/mod.py; mkdir -p /root/.cache; echo 1 > /root/.cache/x")).ok
    assert await box.get_file("/testbed/pkg/mod.py") == b"changed\n"
    snap_state = sorted(p.name for p in (box.dir / "snapshot").iterdir())
    # a long exec is running while reset comes: it is killed
    tag = f"{uuid.uuid4().int % 10**6}.25"
    long = asyncio.ensure_future(box.exec(f"sleep 9{tag}", timeout=30))
    assert await procs_settle(tag, present=True)
    await box.reset()
    res = await asyncio.wait_for(long, 5)
    assert res.exit_code != 0
    assert pids_with(tag) == []
    with pytest.raises(FileNotFoundError):
        await box.get_file("/testbed/pkg/mod.py")
    with pytest.raises(FileNotFoundError):
        await box.get_file("/root/.cache/x")
    assert sorted(p.name for p in box.state_dir.iterdir()) == snap_state
    assert (await box.exec("ls -A /testbed")).output == ""
    assert box.last_reset_time is not None
    assert box.last_reset_time < 5


async def test_put_files_refuses_paths_outside_writable_binds(make_box):
    box = await make_box(workdir="/testbed")
    host_passwd = Path("/etc/passwd").read_bytes()
    with pytest.raises(SandboxPathError, match="writable"):
        await box.put_files({"/usr/evil": "x"})
    with pytest.raises(ConfigError, match="absolute"):
        await box.put_files({"relative/path": "x"})
    with pytest.raises(SandboxPathError):
        await box.put_files({"/testbed/../etc/passwd": "x"})
    # symlinks made inside the sandbox are followed as the sandbox sees them, never onto the host
    assert (await box.exec("ln -s /etc /tmp/etc-abs; ln -s ../../../../../etc /testbed/etc-rel")).ok
    for p in ("/tmp/etc-abs/passwd", "/testbed/etc-rel/passwd"):
        with pytest.raises(SandboxPathError):
            await box.put_files({p: "owned"})
    assert Path("/etc/passwd").read_bytes() == host_passwd
    # a link that stays inside the writable paths works, as it would inside
    assert (await box.exec("ln -s /tmp /testbed/tmplink")).ok
    await box.put_files({"/testbed/tmplink/through.txt": "ok"})
    assert (await box.exec("cat /tmp/through.txt")).output == "ok"
    # reading the read-only root works; /proc is not reachable from the host side
    assert (await box.get_file("/etc/passwd")) == host_passwd
    with pytest.raises(SandboxPathError):
        await box.get_file("/proc/self/status")
    with pytest.raises(FileNotFoundError):
        await box.get_file("/tmp/nothing-here")
    with pytest.raises(ConfigError):
        await box.get_file("/etc/passwd", max_bytes=3)


async def test_two_instances_are_isolated(make_box):
    a = await make_box(workdir="/testbed")
    b = await make_box(workdir="/testbed")
    assert a.dir != b.dir
    tag = f"{uuid.uuid4().int % 10**6}.75"
    await a.put_files({"/testbed/only-a": "a"})
    assert (await a.exec("echo a > /tmp/t")).ok
    long = asyncio.ensure_future(a.exec(f"sleep 5{tag}", timeout=10))
    assert await procs_settle(f"sleep\x005{tag}", present=True)
    r = await b.exec("ls -A /testbed /tmp")
    assert r.ok
    assert "only-a" not in r.output
    assert "t\n" not in r.output
    ps_a = (await a.exec("ps -eo args")).output.splitlines()
    ps_b = (await b.exec("ps -eo args")).output.splitlines()
    assert ps_a
    assert ps_b
    assert not any(line.startswith(f"sleep 5{tag}") for line in ps_b)  # a's processes are invisible to b
    assert not any(line.startswith(f"sleep 5{tag}") for line in ps_a)  # and to a's next exec (own pid ns)
    assert pids_with(f"sleep\x005{tag}")  # though it runs on the host
    await a.reset()
    await asyncio.wait_for(long, 5)


async def test_no_network_by_default(make_box):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(1)
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')"
    try:
        box = await make_box()
        r = await box.exec(["python3", "-c", probe])
        assert r.exit_code != 0
        assert "connected" not in r.output
        assert accepted == []
        # with network=True the host's loopback stays out of reach (the sandbox has its own network
        # namespace with a user-mode network), while the outside is reachable: the control is a server on
        # the host's outward address, which stands for any remote server
        net = await make_box(network=True)
        r = await net.exec(["python3", "-c", probe])
        assert r.exit_code != 0 and "connected" not in r.output, r.output
        assert accepted == []
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outward interface
            outward = u.getsockname()[0]
        except OSError:
            outward = None
        finally:
            u.close()
        if outward and not outward.startswith("127."):
            with socket.create_server((outward, 0)) as out_srv:
                out_port = out_srv.getsockname()[1]
                r = await net.exec(["python3", "-c", f"import socket; socket.create_connection(('{outward}', "
                                                     f"{out_port}), timeout=5); print('connected')"])
                assert r.ok and "connected" in r.output, r.output
    finally:
        stop.set()
        t.join(5)
        srv.close()


async def test_memory_hog_fails_inside_its_limit(make_box):
    box = await make_box(memory="128m")
    hog = "b = b'x' * (600 * 1024 * 1024); print('survived', len(b))"
    r = await box.exec(["python3", "-c", hog], timeout=60)
    assert r.exit_code != 0
    assert "survived" not in r.output
    if box.limit_mode in ("cgroup1", "cgroup2"):
        assert r.exit_code == 137  # the cgroup's OOM killer, as Docker reports it
    # the sandbox (and the host: this test process) is fine afterwards
    assert (await box.exec("python3 -c 'print(2 + 2)'")).output == "4\n"
    small = await box.exec(["python3", "-c", "b = b'x' * (16 * 1024 * 1024); print('ok')"])
    assert small.ok


async def test_memory_limit_in_rlimit_mode(make_box):
    box = await make_box(memory="256m", limits="rlimit")
    assert box.limit_mode == "rlimit"
    assert box.limits_enforced["memory"]
    assert box.limits_enforced["pids"]  # the sandbox never runs as host root, so RLIMIT_NPROC holds
    assert box.host_uid != 0
    r = await box.exec(["python3", "-c", "b = b'x' * (600 * 1024 * 1024); print('survived')"], timeout=60)
    assert r.exit_code != 0
    assert "MemoryError" in r.output


async def test_pid_limit_stops_a_bounded_fork_bomb(make_box):
    box = await make_box(pids=24)
    if not box.limits_enforced.get("pids"):
        pytest.skip(f"pid limit not enforceable in limit mode {box.limit_mode} as uid {os.geteuid()}")
    tag = f"{uuid.uuid4().int % 10**6}.125"
    bomb = ("import subprocess\nps = []\ntry:\n"
            f"    for i in range(200): ps.append(subprocess.Popen(['sleep', '3{tag}']))\n"
            "except OSError as e: print('stopped at', len(ps), e.errno)\n"
            "else: print('not stopped', len(ps))\n")
    r = await box.exec(["python3", "-c", bomb], timeout=60)
    assert "stopped at" in r.output, r.output
    assert int(r.output.split()[2]) < 24
    # the spawned processes die with the exec
    assert await procs_settle(tag, present=False)
    assert (await box.exec("echo alive")).ok


async def test_released_and_broken_instances(make_box):
    box = await make_box()
    shutil.rmtree(box.state_dir)
    assert await box.status() == ResourceStatus.UNHEALTHY
    with pytest.raises(ResourceDied):
        await box.exec("true")
    await box.adestroy()
    await box.adestroy()  # idempotent
    assert await box.status() == ResourceStatus.STOPPED
    assert not box.dir.exists()
    with pytest.raises(ResourceDied):
        await box.put_files({"/tmp/x": "x"})


async def test_missing_bwrap_or_rootfs_is_a_clear_error(make_box, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ResourceUnavailable, match="bubblewrap"):
        create_sandbox(ContainerSpec(image="host", backend="sandbox"), {})
    monkeypatch.undo()
    monkeypatch.setenv("AGENTFLY_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(sb.SANDBOX_DIR_ENV, str(tmp_path / "unused-root"))
    box = SandboxContainer(ContainerSpec(image="no-such/image:1", backend="sandbox"))
    with pytest.raises(ResourceUnavailable, match="no-such/image:1"):
        await box.start()
    await box.adestroy()


def _tiny_rootfs(path: Path) -> Path:
    """A minimal rootfs: dash, cat and their libraries copied from the host, plus /testbed content."""
    for prog in ("/bin/sh", "/bin/cat"):
        real = Path(os.path.realpath(prog))
        libs = subprocess.run(["ldd", str(real)], capture_output=True, text=True, check=True).stdout
        files = [real] + [Path(w) for w in libs.split() if w.startswith("/")]
        for f in files:
            dst = path / str(f).lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(f), dst)
        (path / "bin").mkdir(exist_ok=True)
        shutil.copy2(real, path / "bin" / Path(prog).name)
    (path / "testbed").mkdir()
    (path / "testbed" / "README").write_text("from the image\n")
    (path / "etc").mkdir(exist_ok=True)
    (path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nalice:x:1234:1234::/home/alice:/bin/sh\n")
    return path


async def test_rootfs_image_folder(make_box, tmp_path):
    rootfs = _tiny_rootfs(tmp_path / "rootfs")
    box = await make_box(image=str(rootfs), workdir="/testbed")
    r = await box.exec("cat README; echo x > new; cat /etc/passwd | cat >/dev/null; echo $$")
    assert r.ok
    assert r.output.startswith("from the image\n")
    assert (await box.exec("echo id > /etc/evil")).exit_code != 0
    assert not (rootfs / "etc" / "evil").exists()
    assert not (rootfs / "testbed" / "new").exists()
    assert (await box.exec('echo "$HOME"', user="alice")).output == "/home/alice\n"
    await box.reset()
    assert (await box.exec("cat README; for f in *; do echo $f; done")).output == "from the image\nREADME\n"


async def test_manager_pool_semantics_and_no_leftovers(sandbox_dir):
    spec = ContainerSpec(image="host", backend="sandbox", workdir="/testbed", max_instances=1)
    manager = ResourceManager(backend_factory=create_sandbox)
    tag = f"{uuid.uuid4().int % 10**6}.375"
    async with manager.scope("rollout-1") as scope:
        box = await scope.acquire(spec)
        assert await scope.acquire(spec) is box  # same scope -> same instance
        assert box.labels["agentfly.manager"] == manager.id
        await box.put_files({"/testbed/secret": "rollout-1"})
        name, private = box.name, box.dir
    async with manager.scope("rollout-2") as scope:
        again = await scope.acquire(spec)
        assert again is box
        assert again.uses == 2
        with pytest.raises(FileNotFoundError):  # ... and reset on reuse: no state leaks across rollouts
            await again.get_file("/testbed/secret")
        running = asyncio.ensure_future(again.exec(f"sleep 7{tag}", timeout=30))
        assert await procs_settle(tag, present=True)
    assert manager.metrics()[spec.key]["resets"] == 1
    await manager.aclose()
    await asyncio.wait_for(running, 5)
    assert pids_with(tag) == []
    assert not private.exists()
    assert not _sandbox_cgroups(name)


async def test_reap_orphans_of_a_dead_manager(sandbox_dir):
    box = SandboxContainer(ContainerSpec(image="host", backend="sandbox"), labels={"agentfly.manager": "mgr-dead"})
    keep = SandboxContainer(ContainerSpec(image="host", backend="sandbox"), labels={"agentfly.manager": "mgr-live"})
    await box.start()
    await keep.start()
    try:
        # our own process is alive: nothing is an orphan yet
        assert reap_sandbox_orphans(root=sandbox_dir) == []
        # reaping by manager id removes that manager's sandboxes only
        assert reap_sandbox_orphans("mgr-dead", root=sandbox_dir) == [box.name]
        assert not box.dir.exists()
        assert not _sandbox_cgroups(box.name)
        assert keep.dir.exists()
        assert await keep.status() == ResourceStatus.READY
        # a sandbox whose owner process died is found without a manager id
        dead = await asyncio.create_subprocess_exec("true")
        await dead.wait()
        marker = keep.dir / sb.MARKER_NAME
        marker.write_text(marker.read_text().replace(f'"owner_pid": {os.getpid()}', f'"owner_pid": {dead.pid}'))
        assert reap_sandbox_orphans(root=sandbox_dir) == [keep.name]
        assert not keep.dir.exists()
        assert not _sandbox_cgroups(keep.name)
    finally:
        await box.adestroy()
        await keep.adestroy()


async def test_debian_base_image_rootfs(make_box):
    """The Debian base rootfs of agentfly_gym.images.base (built by ``agentfly-gym images build base``)."""
    from agentfly_gym.images.base import base_rootfs_dir

    if not (base_rootfs_dir() / ".agentfly-rootfs.json").is_file():
        pytest.skip("the Debian base rootfs is not built here (agentfly-gym images build base)")
    box = await make_box(image="agentfly/base", workdir="/testbed", user="agent")
    r = await box.exec("id -un; python3 -c 'import sys; print(sys.version_info[:2])'; touch ~/ok /testbed/ok && echo w")
    assert r.ok and r.output.splitlines() == ["agent", "(3, 11)", "w"], r.output
    r = await box.exec("git init -q /testbed/repo && git -C /testbed/repo status --short && echo git-ok", user="root")
    assert r.ok and "git-ok" in r.output, r.output
    await box.reset()
    assert sorted((await box.exec("ls -A /testbed ~")).output.split()) == ["/home/agent:", "/testbed:"]


async def test_cpu_quota(make_box):
    box = await make_box(cpus=0.25)
    if not box.limits_enforced.get("cpu"):
        pytest.skip(f"no CPU limit in limit mode {box.limit_mode}")
    spin = ("import time\nt0 = time.monotonic(); c0 = time.process_time()\n"
            "while time.monotonic() - t0 < 1.5: pass\n"
            "print(round((time.process_time() - c0) / (time.monotonic() - t0), 2))")
    r = await box.exec(["python3", "-c", spin], timeout=30)
    share = float(r.output)
    assert share < 0.45, f"busy loop got {share} of a core under cpus=0.25"
    # the share alone proves little on a loaded machine: the cgroup holds the quota, and the kernel throttled the
    # loop, unless the machine was so loaded that the loop never used up its quota (then it had nothing to throttle)
    cpu_dir = Path(next(d for d in box._cgroups
                        if (Path(d) / "cpu.stat").exists() and ("/cpu/" in d or box.limit_mode == "cgroup2")))
    if (cpu_dir / "cpu.max").exists():
        quota, period = (cpu_dir / "cpu.max").read_text().split()
    else:
        quota, period = ((cpu_dir / f"cpu.cfs_{n}_us").read_text() for n in ("quota", "period"))
    assert int(quota) / int(period) == 0.25, (quota, period)
    stat = dict(line.split() for line in (cpu_dir / "cpu.stat").read_text().splitlines())
    assert int(stat["nr_throttled"]) > 0 or share < 0.25, (stat, share)


async def test_cancelled_exec_kills_its_command(make_box):
    box = await make_box()
    tag = f"{uuid.uuid4().int % 10**6}.625"
    task = asyncio.ensure_future(box.exec(f"sleep 8{tag}", timeout=30))
    assert await procs_settle(tag, present=True)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await procs_settle(tag, present=False)


def test_resources_gc_reaps_a_killed_managers_sandbox(sandbox_dir):
    """`agentfly-gym resources gc` after a SIGKILLed manager: its processes, cgroups, loop-mounted
    disk and folder are all gone (the command reaps every backend, Docker and sandbox)."""
    import signal
    import sys
    import textwrap

    tag = f"{uuid.uuid4().int % 10**6}.875"
    script = textwrap.dedent(f"""
        import asyncio, os, signal
        from agentfly_gym.resources import ContainerSpec
        from agentfly_gym.resources.containers.sandbox.container import SandboxContainer

        async def main():
            box = SandboxContainer(ContainerSpec(image="host", backend="sandbox", disk="64m"),
                                   labels={{"agentfly.manager": "gc-test"}})
            await box.start()
            task = asyncio.ensure_future(box.exec("sleep 6{tag}", timeout=60))
            print(box.name, box.describe()["limits_enforced"].get("disk"), flush=True)
            await asyncio.sleep(3600)  # alive (the exec running) until the test SIGKILLs it

        asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        name = child.stdout.readline().split()[0]
        wait_until(lambda: pids_with(tag), 30, "the sandboxed sleep to run")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    folder = sandbox_dir / name
    assert folder.exists()
    assert _sandbox_cgroups(name)
    had_volume = str(folder) in Path("/proc/self/mounts").read_text()
    # restricted to this test's manager id: the Docker engine may be shared with other live runs
    r = subprocess.run([sys.executable, "-m", "agentfly_gym", "resources", "gc", "--manager", "gc-test"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert name in r.stdout.split(), (r.stdout, r.stderr)
    assert "sandbox(es)" in r.stderr
    assert not folder.exists()
    assert not _sandbox_cgroups(name)
    assert str(folder) not in Path("/proc/self/mounts").read_text()
    assert not pids_with(tag)
    if os.geteuid() == 0:
        assert had_volume  # the disk limit's file system was there, and is unmounted now


async def test_an_exec_left_running_dies_when_the_instance_goes_idle(sandbox_dir):
    """A rollout that ends while one of its commands still runs: parking the idle instance kills it."""
    spec = ContainerSpec(image="host", backend="sandbox", max_instances=1)
    manager = ResourceManager(backend_factory=create_sandbox)
    tag = f"{uuid.uuid4().int % 10**6}.4375"
    try:
        async with manager.scope("rollout-1") as scope:
            box = await scope.acquire(spec)
            left = asyncio.ensure_future(box.exec(f"sleep 9{tag}", timeout=60))
            assert await procs_settle(tag, present=True)
        assert await procs_settle(tag, present=False), "the command outlived its rollout"
        assert (await asyncio.wait_for(left, 10)).exit_code != 0
        assert manager.metrics()[spec.key]["idle"] == 1
    finally:
        await manager.aclose()


async def test_a_mount_with_a_missing_source_is_refused_not_created(tmp_path):
    from agentfly_gym.resources import Mount

    missing = tmp_path / "no-such-folder"
    async with ResourceManager() as m, m.scope("mount") as scope:
        with pytest.raises(ConfigError, match="does not exist on the host"):
            await scope.acquire(ContainerSpec(image="host", backend="sandbox",
                                              mounts=(Mount(source=str(missing), target="/data"),)))
    assert not missing.exists()


@pytest.mark.slow
async def test_cancelled_starts_leave_no_folder_or_cgroup(tmp_path, monkeypatch):
    """Starts cancelled at every moment of their work (folder, disk copy, cgroups, the check exec) leave nothing
    behind: the work a thread was doing when the start was cancelled finishes before the teardown, so it cannot
    make a folder or a cgroup after the teardown has run (3-5 folders and 9-15 cgroups per 150 starts before)."""
    import glob
    import random

    monkeypatch.setenv(sb.SANDBOX_DIR_ENV, str(tmp_path / "boxes"))
    rng = random.Random(0)
    boxes = []
    for i in range(40):
        box = SandboxContainer(ContainerSpec(image="host", backend="sandbox", memory="256m", pids=64))
        boxes.append(box)
        task = asyncio.ensure_future(box.start())
        await asyncio.sleep(rng.uniform(0.0, 0.15) if i % 4 else 0)  # cancelled at a random moment of the start
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            await box.adestroy()
    await asyncio.sleep(0.5)  # nothing may appear late either: a folder or cgroup made after the tear-down
    left = [p for p in (tmp_path / "boxes").glob("*") if p.is_dir()] if (tmp_path / "boxes").exists() else []
    assert left == [], left
    cgroups = [d for b in boxes for d in glob.glob(f"/sys/fs/cgroup/**/agentfly-gym/{b.name}", recursive=True)]
    assert cgroups == [], cgroups


async def test_gc_under_another_root_leaves_a_live_idle_sandbox_its_cgroup(make_box, tmp_path):
    """An idle sandbox's cgroup is empty between execs; a reap of another sandbox root (another
    user, another test worker) once removed it as a stray, and the next exec failed to join it."""
    box = await make_box()
    if not box._cgroups:
        pytest.skip("no cgroup limits here (rlimit mode)")
    before = _sandbox_cgroups(box.name)
    assert before
    other_root = tmp_path / "other-root"
    other_root.mkdir()
    assert reap_sandbox_orphans(root=other_root) == []
    assert _sandbox_cgroups(box.name) == before
    r = await box.exec("echo still-here")
    assert r.ok, r.output
    assert r.output == "still-here\n"
