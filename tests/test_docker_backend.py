"""The Docker container backend against a real Docker engine and the locally built base image.

The module skips only when no engine answers and ``AGENTFLY_REQUIRE_DOCKER`` is unset (CI sets it,
so a missing engine fails there).  The engine is started with ``scripts/docker-engine.sh`` when it
is not running; the base image is built once (a few minutes) and reused afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from proctools import default_sigint
from waiting import threads_running, until

from agentfly_gym.errors import ConfigError, ResourceDied, ResourceError
from agentfly_gym.resources import ContainerSpec, ResourceManager, ResourceStatus
from agentfly_gym.resources.containers import choice as containers
from agentfly_gym.resources.containers.docker import DockerContainer
from agentfly_gym.cli.resources import gc_main
from agentfly_gym.resources.containers.reaper import reap_docker_orphans as reap_orphans

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", autouse=True)
def engine(docker_client):
    """A running engine (started if needed); afterwards no container of this process may remain."""
    client = docker_client
    yield client
    left = client.containers.list(all=True, filters={"label": ["agentfly=1", f"agentfly.pid={os.getpid()}"]})
    for c in left:
        c.remove(force=True)
    assert not left, f"containers left behind by this test process: {[c.name for c in left]}"


@pytest.fixture(scope="module")
def base_image(engine) -> str:
    from agentfly_gym.images.base import build_base_image

    return build_base_image()


@pytest.fixture
async def manager():
    m = ResourceManager()
    yield m
    await m.aclose()


def spec(base_image: str, **kw) -> ContainerSpec:
    kw.setdefault("memory", "256m")
    kw.setdefault("pids", 128)
    return ContainerSpec(image=base_image, backend="docker", **kw)


async def procs(c: DockerContainer) -> list[str]:
    """Command lines of the processes in the container (other than the listing itself)."""
    r = await c.exec("for p in /proc/[0-9]*; do [ -r $p/cmdline ] && tr '\\0' ' ' < $p/cmdline && echo; done",
                     user="root")
    return [line for line in r.output.splitlines() if line.strip() and "/proc/[0-9]" not in line]


def _stamps_and_text(output: str) -> tuple[list[float], str]:
    """The lines of ``output`` that are numbers (clock readings), and the other lines."""
    stamps, text = [], []
    for line in output.splitlines(keepends=True):
        try:
            stamps.append(float(line))
        except ValueError:
            text.append(line)
    return stamps, "".join(text)


@pytest.mark.slow
async def test_scope_reuse_labels_limits_and_parallel_exec(engine, base_image, manager):
    s = spec(base_image, cpus=0.5, pids=100, max_instances=2)
    async with manager.scope("rollout-1") as a, manager.scope("rollout-2") as b:
        c1 = await a.acquire(s)
        assert await a.acquire(s) is c1  # same (scope, spec key) -> same container
        c2 = await b.acquire(s)
        assert c2 is not c1
        assert c2.container_id != c1.container_id
        assert isinstance(c1, DockerContainer)
        assert c1.backend_name == "docker"
        info = engine.api.inspect_container(c1.container_id)
        labels = info["Config"]["Labels"]
        assert labels["agentfly"] == "1"
        assert labels["agentfly.manager"] == manager.id
        assert labels["agentfly.pool"] == s.key
        assert labels["agentfly.pid"] == str(os.getpid())
        hc = info["HostConfig"]
        assert hc["NanoCpus"] == 500_000_000
        assert hc["Memory"] == hc["MemorySwap"] == 256 * 1024**2
        assert hc["PidsLimit"] == 100
        # no network: networking disabled (a private network namespace with only lo, and no engine sandbox to build)
        assert info["Config"].get("NetworkDisabled") is True
        assert hc["NetworkMode"] in ("default", "")
        ifaces = (await c1.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")).output.split()
        assert ifaces == ["lo"]
        assert (await c1.exec("getent hosts localhost")).exit_code == 0  # the read-only /etc/hosts
        assert hc["Init"] is True
        assert hc["SecurityOpt"] == ["no-new-privileges"]
        assert hc["CapDrop"] == ["ALL"]
        assert "NET_RAW" not in hc["CapAdd"]
        assert "SYS_ADMIN" not in hc["CapAdd"]
        # execs are awaited independently: the two commands' sleeps overlap (each prints the host clock, which the
        # containers share, before and after its sleep; one after the other, the second would start after the first
        # ended), whatever the load
        stamp = "date +%s.%N; sleep 3; date +%s.%N"
        r1, r2 = await asyncio.gather(c1.exec(f"{stamp}; echo one"), c2.exec(f"{stamp}; echo two 1>&2; exit 3"))
        (s1, e1), out1 = _stamps_and_text(r1.output)
        (s2, e2), out2 = _stamps_and_text(r2.output)  # its stderr line may come before the stdout ones
        assert max(s1, s2) < min(e1, e2), (r1.output, r2.output)
        assert (r1.exit_code, out1, r1.ok) == (0, "one\n", True)
        assert (r2.exit_code, out2, r2.ok) == (3, "two\n", False)  # stderr is part of the output
        r = await c1.exec(["printf", "%s|", "a b", "c"], workdir="/etc", env={"X": "1"})
        assert r.output == "a b|c|"
        r = await c1.exec("echo $X $(pwd) $(id -u)", workdir="/etc", env={"X": "42"})
        assert r.output == "42 /etc 0\n"
        r = await c1.exec("id -un", user="agent")
        assert r.output == "agent\n"
        with pytest.raises(ConfigError):
            await c1.exec("true", timeout=0)
    # the scopes ended: both containers went back to the pool, still alive
    assert manager.metrics()[s.key]["idle"] == 2


async def test_pool_cap_waiter_proceeds_after_release(base_image, manager):
    s = spec(base_image, max_instances=1)
    first = manager.scope("first")
    c = await first.acquire(s)
    second = manager.scope("second")
    waiter = asyncio.ensure_future(second.acquire(s))
    await until(lambda: manager.metrics()[s.key]["waiting"] == 1, 30, "the second acquisition to queue")
    assert not waiter.done()
    await c.exec("echo leaked > /tmp/state")
    await first.aclose()
    c2 = await asyncio.wait_for(waiter, 30)
    assert c2 is c  # the one container, reset before the waiter got it
    r = await c2.exec("cat /tmp/state")
    assert r.exit_code != 0
    m = manager.metrics()[s.key]
    assert m["started"] == 1
    assert m["reused"] == 1
    assert m["max_in_use"] == 1
    await second.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("in_place", [True, False], ids=["restarted-in-place", "replaced"])
async def test_reset_restores_state_and_parking_makes_reuse_cheaper_than_start(base_image, manager, in_place):
    """reset() gives a fresh container (files anywhere, processes, /tmp), whether the same container restarted with
    its writable layer emptied (root beside a local overlay2 engine, as in CI) or a new one in its place; the pool
    parks an idle instance, so the next acquisition waits for nothing like a start."""
    s = spec(base_image, max_instances=1)
    async with manager.scope("r") as scope:
        c = await scope.acquire(s)
        if in_place and not c.engine.restart_in_place_ok:
            pytest.skip("restarting in place needs root beside a local overlay2 engine whose mounts this process sees")
        if not in_place:
            c.engine.restart_in_place_ok = False
        original = await c.get_file("/root/.bashrc")
        profile = await c.get_file("/root/.profile")
        r = await c.exec(
            "echo changed > /root/.bashrc; rm /root/.profile; mkdir -p /root/junk && echo x > /root/junk/f; "
            "mkdir -p /srv/new && echo y > /srv/new/f; echo z > /tmp/z; mkdir /var/tmp/d; echo e > /etc/planted; "
            "(setsid sleep 1001 >/dev/null 2>&1 &); (nohup sleep 1002 >/dev/null 2>&1 &); echo ok")
        assert r.output == "ok\n"
        await c.put_files({"/home/agent/work/a.py": "print(1)\n"})
        assert any("sleep 1001" in p for p in await procs(c))
        first = c.container_id
        await c.reset()  # not parked (still in use): made fresh now
        assert (c.container_id == first) is in_place
        assert c.restarts_in_place == int(in_place)
        assert c.last_reset_time is not None
        assert await c.get_file("/root/.bashrc") == original
        assert await c.get_file("/root/.profile") == profile
        for gone in ("/root/junk", "/srv/new", "/home/agent/work", "/etc/planted"):
            assert (await c.exec(f"test -e {gone}")).exit_code == 1, gone
        assert (await c.exec("ls -A /tmp /var/tmp")).output == "/tmp:\n\n/var/tmp:\n"
        live = await procs(c)
        assert not any("sleep 100" in p for p in live), live
        assert any(p.startswith("sleep infinity") for p in live)  # the keep-alive is there
        assert await c.status() == ResourceStatus.READY
        start_time = c.start_duration
        await c.exec("echo used > /root/used")
    # released with no waiter: parked, i.e. replaced in the background while idle
    for _ in range(600):
        if c._park_future is not None and c._park_future.done():
            break
        await asyncio.sleep(0.05)
    assert c._park_future is not None
    assert c._park_future.exception() is None
    parked = c.container_id
    assert (parked == first) is in_place  # made fresh while parked, in the background
    assert c.restarts_in_place == 2 * int(in_place)
    async with manager.scope("r2") as scope:
        t0 = time.monotonic()
        again = await scope.acquire(s)
        reuse_time = time.monotonic() - t0
        assert again is c
        # cheaper than a start: the acquisition started nothing (the container parked is the one handed out)
        assert c.container_id == parked and manager.metrics()[s.key]["started"] == 1, manager.metrics()[s.key]
        assert (await c.exec("test -e /root/used")).exit_code == 1
    print(f"\ndocker: start {start_time:.3f}s, reuse after parking {reuse_time:.3f}s")


_STATE = "ipcs; ls -A /dev /dev/shm /dev/mqueue /root /tmp; stat -c '%n %a %U:%G' / /etc /usr/share/doc /usr/bin/ls"
_DISK = "df --output=used,iused /"  # compared where the layer is a volume of its own (else the host's file system)
_ENGINE_FILES = "cat /etc/hosts /etc/hostname /etc/resolv.conf"  # the container's address may change on a restart

_EPISODE = r"""
echo evil >> /etc/hosts; echo evil > /etc/hostname; echo 'nameserver 6.6.6.6' >> /etc/resolv.conf
echo s > /dev/shm/x; echo d > /dev/planted; mkfifo /tmp/fifo; ipcmk -M 4096 >/dev/null; ipcmk -Q >/dev/null
python3 -c "
import os
os.makedirs('/root/deep', exist_ok=True); os.chdir('/root/deep')
for i in range(3000):
    os.mkdir('d'); os.chdir('d')
open('f', 'w').write('x')
open('/root/n\x01\nodd name', 'w').write('y')
os.symlink('/etc/passwd', '/root/link')
"
head -c 30000000 /dev/urandom > /root/big
rm -rf /usr/share/doc; chmod 700 /etc; chown nobody /usr/bin/ls; chmod 777 /; chown nobody /
(setsid sleep 999 >/dev/null 2>&1 &); echo evil > /proc/1/fd/1; echo done"""


@pytest.mark.slow
@pytest.mark.parametrize(("how", "network"), [("used", True), ("used", False), ("stopped", False), ("removed", True)])
async def test_reset_in_place_leaves_nothing_of_a_hostile_episode(engine, base_image, manager, how, network):
    """Whatever an episode writes (the engine's /etc files, /dev and /dev/shm, SysV IPC objects, a 3,000-deep tree,
    odd names, a symbolic link out, 30 MB, a lower folder deleted, lower files' modes and owners, the container's
    output) and leaves running, reset() restores the state right after start; also when the container was stopped from outside
    (restarted in place as well) or removed from outside (a new container in its place)."""
    s = spec(base_image, max_instances=1, network=network)
    async with manager.scope("h") as scope:
        c = await scope.acquire(s)
        before = (await c.exec(_STATE)).output
        disk = (await c.exec(_DISK)).output if c.disk_mode == "volume" else None
        first = c.container_id
        r = await c.exec(_EPISODE, timeout=120)
        assert r.output.endswith("done\n"), r.output
        assert (await c.exec(_STATE)).output != before
        if how == "stopped":
            engine.api.kill(first)
        elif how == "removed":
            engine.api.remove_container(first, force=True)
        await c.reset()
        in_place = bool(c.engine.restart_in_place_ok) and how != "removed"
        assert (c.container_id == first) is in_place
        assert c.restarts_in_place == int(in_place)
        assert (await c.exec(_STATE)).output == before
        if disk is not None:
            assert (await c.exec(_DISK)).output == disk
        engine_files = (await c.exec(_ENGINE_FILES)).output
        assert "evil" not in engine_files
        assert "6.6.6.6" not in engine_files
        live = await procs(c)
        assert not any("sleep 999" in p for p in live), live
        assert b"evil" not in engine.api.logs(c.container_id)  # the container's output, which the engine keeps
        assert await c.status() == ResourceStatus.READY


async def test_an_engine_that_cannot_bind_the_hosts_file_gets_the_none_network(base_image, manager, monkeypatch):
    """A remote engine cannot bind this host's hosts file: the create is refused, and containers without a network
    are made on the "none" network instead (the engine's own /etc/hosts), from then on for that engine."""
    from agentfly_gym.resources.containers.docker import etc_hosts

    monkeypatch.setattr(etc_hosts, "HOSTS_FILE", "/nonexistent/agentfly-gym/hosts")  # not on the engine's host
    async with manager.scope("n") as scope:
        c = await scope.acquire(spec(base_image))
        assert c.engine.hosts_bind_ok is False
        info = c.engine.client().api.inspect_container(c.container_id)
        assert info["HostConfig"]["NetworkMode"] == "none"
        assert (await c.exec("getent hosts localhost")).exit_code == 0


async def test_a_hosts_file_only_its_owner_reads_is_bound_as_a_readable_copy(base_image, manager, monkeypatch,
                                                                           tmp_path):
    """A checkout made under umask 077 has the packaged hosts file at mode 600, and a bound file keeps its host
    mode: a readable copy in the cache is bound instead, so that a non-root user in the container resolves
    localhost."""
    from agentfly_gym.resources.containers.docker import etc_hosts

    private = tmp_path / "hosts"
    private.write_bytes(Path(etc_hosts.HOSTS_FILE).read_bytes())
    private.chmod(0o600)
    monkeypatch.setattr(etc_hosts, "HOSTS_FILE", str(private))
    monkeypatch.setenv("AGENTFLY_GYM_CACHE", str(tmp_path / "cache"))
    async with manager.scope("h") as scope:
        c = await scope.acquire(spec(base_image, user="agent"))
        r = await c.exec("id -un; getent hosts localhost")
        assert r.exit_code == 0 and r.output.startswith("agent\n") and "localhost" in r.output, r.output
    assert private.stat().st_mode & 0o777 == 0o600  # the checkout's file is left as it is


@pytest.mark.slow
async def test_reset_of_an_image_with_a_volume_makes_a_new_container(engine, base_image, manager):
    """An image's VOLUME is an anonymous volume the engine keeps across a restart: such a container is never
    restarted in place; reset() gives a new one, and what the episode wrote in the volume is gone."""
    import io

    recipe = f"FROM {base_image}\nVOLUME /data\n".encode()
    image, _ = engine.images.build(fileobj=io.BytesIO(recipe), tag="agentfly/test-volume:latest", rm=True)
    async with manager.scope("v") as scope:
        c = await scope.acquire(spec("agentfly/test-volume:latest", max_instances=1))
        first = c.container_id
        assert (await c.exec("echo kept > /data/x && echo ok")).output == "ok\n"
        await c.reset()
        assert c.container_id != first
        assert c.restarts_in_place == 0
        assert (await c.exec("test -e /data/x")).exit_code == 1


@pytest.mark.slow
async def test_exec_timeout_kills_command_and_children(base_image, manager):
    async with manager.scope("t") as scope:
        c = await scope.acquire(s := spec(base_image))
        r = await c.exec("sleep 31 & sleep 32; echo never", timeout=1)
        assert r.timed_out
        assert r.exit_code == -1
        assert not r.ok
        assert "never" not in r.output
        assert 0.9 < r.duration < 20  # stopped at its 1 s timeout, not at the end of its 31-32 s (margin for load)
        # a child that left the process group (setsid) is found by the exec's marker and killed too
        r = await c.exec("setsid sleep 33 & sleep 34", timeout=1)
        assert r.timed_out
        assert r.duration < 20
        # a background server of a command that finished in time keeps running (until reset)
        r = await c.exec("setsid sleep 35 >/dev/null 2>&1 & echo started", timeout=5)
        assert r.output == "started\n"
        assert not r.timed_out
        left = await procs(c)
        assert not any(p.startswith(("sleep 31", "sleep 32", "sleep 33", "sleep 34")) for p in left), left
        assert any(p.startswith("sleep 35") for p in left), left
        # a command that finishes in time is untouched by the timeout wrapper
        r = await c.exec("sleep 0.2; echo fine", timeout=5)
        assert (r.output, r.timed_out) == ("fine\n", False)
        assert s.key in manager.metrics()


@pytest.mark.slow
async def test_output_cap_keeps_head_and_tail(base_image, manager):
    async with manager.scope("o") as scope:
        c = await scope.acquire(spec(base_image))
        r = await c.exec("echo BEGIN; head -c 3000000 /dev/zero | tr '\\0' 'y'; echo; echo END", max_output=1000)
        assert r.truncated
        assert len(r.output) <= 1000
        assert r.output.startswith("BEGIN\nyyy")
        assert r.output.endswith("yyy\nEND\n")
        assert "characters cut" in r.output
        r = await c.exec("printf 'ok\\377\\n'")
        assert r.output == "ok\ufffd\n"
        assert not r.truncated
        r = await c.exec("seq 1 100", max_output=50)
        assert len(r.output) <= 50
        assert r.output.startswith("1\n")
        assert r.output.endswith("100\n")


@pytest.mark.slow
async def test_killed_container_is_unhealthy_and_replaced(engine, base_image, manager):
    s = spec(base_image)
    scope = manager.scope("k")
    c = await scope.acquire(s)
    engine.api.kill(c.container_id)
    assert await c.status() == ResourceStatus.UNHEALTHY
    with pytest.raises(ResourceDied):
        await c.exec("true")
    await scope.aclose()
    async with manager.scope("k2") as scope2:
        c2 = await scope2.acquire(s)
        assert c2 is not c
        assert (await c2.exec("echo alive")).output == "alive\n"
    m = manager.metrics()[s.key]
    assert m["replaced"] == 1
    assert m["started"] == 2
    # the dead container was removed, not just abandoned (in the background: a refresh begun when it was parked
    # finishes first)
    import docker

    def gone() -> bool:
        try:
            engine.api.inspect_container(c.name)
        except docker.errors.NotFound:
            return True
        return False

    await until(gone, timeout=60, what="the dead container removed")


@pytest.mark.slow
async def test_memory_hog_is_oom_killed_and_fork_bomb_is_contained(engine, base_image, manager):
    s = spec(base_image, memory="64m", pids=40)
    async with manager.scope("m") as scope:
        c = await scope.acquire(s)
        r = await c.exec("python3 -c 'b = bytearray(400 * 1024 * 1024); print(len(b))'", timeout=60)
        assert r.exit_code == 137
        assert "419430400" not in r.output
        assert await c.status() == ResourceStatus.READY  # the container itself survives
        assert (await c.exec("echo still here")).output == "still here\n"
        host_procs = len(os.listdir("/proc"))
        r = await c.exec("f() { f | f & }; f; sleep 3; echo bomb-done", timeout=6)
        stats = engine.api.inspect_container(c.container_id)
        assert stats["State"]["Running"]
        assert len(os.listdir("/proc")) < host_procs + 60  # bounded by pids=40, not exploding
        await c.reset()  # freezes and kills whatever the bomb left
        assert (await c.exec("echo recovered")).output == "recovered\n"
        # the OOM kill is the last episode's: the fresh container (restarted in place, where the engine keeps its
        # State.OOMKilled) is healthy
        assert await c.status() == ResourceStatus.READY
        left = await procs(c)
        assert len(left) <= 3, left


@pytest.mark.slow
async def test_network_off_by_default_and_on_when_enabled(base_image, manager):
    probe = textwrap.dedent("""
        import os, socket, threading
        print("ifaces", sorted(os.listdir("/sys/class/net")))
        srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
        port = srv.getsockname()[1]
        threading.Thread(target=lambda: srv.accept()[0].sendall(b"hi"), daemon=True).start()
        print("loopback", socket.create_connection(("127.0.0.1", port), timeout=5).recv(2).decode())
        try:
            socket.create_connection(("192.0.2.1", 9), timeout=3)  # TEST-NET-1, never routed: no packet leaves
            print("outside connected")
        except OSError as e:
            print("outside", type(e).__name__, e.errno)
    """)
    async with manager.scope("n") as scope:
        off = await scope.acquire(spec(base_image))
        on = await scope.acquire(spec(base_image, network=True))
        r_off = await off.exec(["python3", "-c", probe], timeout=30)
        r_on = await on.exec("cat /proc/net/route | wc -l; ls /sys/class/net", timeout=30)
    assert "ifaces ['lo']" in r_off.output
    assert "loopback hi" in r_off.output
    assert "outside OSError 101" in r_off.output  # ENETUNREACH: no route at all
    assert "eth0" in r_on.output
    assert int(r_on.output.split()[0]) >= 2


@pytest.mark.slow
async def test_put_and_get_files_round_trip(base_image, manager):
    blob = bytes(range(256)) * 4096 + os.urandom(1000)
    async with manager.scope("f") as scope:
        c = await scope.acquire(spec(base_image, user="agent", workdir="/home/agent"))
        await c.put_files({"/home/agent/deep/er/blob.bin": blob, "/home/agent/t.txt": "héllo\n"}, mode=0o750)
        assert await c.get_file("/home/agent/deep/er/blob.bin") == blob
        assert await c.get_file("/home/agent/t.txt") == "héllo\n".encode()
        r = await c.exec("stat -c '%U %a' t.txt deep/er; ln -s deep/er/blob.bin link; mkdir d")
        assert r.output == "agent 750\nagent 755\n"  # new parents belong to the spec's user too
        assert await c.get_file("/home/agent/link") == blob  # symbolic links are followed
        with pytest.raises(FileNotFoundError):
            await c.get_file("/home/agent/missing")
        with pytest.raises(IsADirectoryError):
            await c.get_file("/home/agent/d")
        with pytest.raises(ResourceError):
            await c.get_file("/home/agent/deep/er/blob.bin", max_bytes=100)
        with pytest.raises(ConfigError):
            await c.put_files({"relative/path": b""})
        with pytest.raises(ConfigError):
            await c.put_files({"/home/../etc/x": b""})


async def test_release_is_idempotent_and_aclose_removes_containers(engine, base_image):
    import docker

    m = ResourceManager()
    scope = m.scope("x")
    c = await scope.acquire(spec(base_image))
    idle = await m.scope("y").acquire(spec(base_image, pids=99))
    names = [c.name, idle.name]
    await m.aclose()
    for n in names:
        with pytest.raises(docker.errors.NotFound):
            engine.api.inspect_container(n)
    await c.adestroy()  # idempotent, never raises
    c.destroy()
    assert await c.status() == ResourceStatus.STOPPED
    with pytest.raises(ResourceDied):
        await c.exec("true")


async def test_missing_local_image_fails_clearly(manager):
    from agentfly_gym.errors import ResourceStartError

    with pytest.raises(ResourceStartError, match="images build"):
        await manager.scope("z").acquire(ContainerSpec(image="agentfly/no-such-image:1", backend="docker"))


def test_resolve_backend(base_image, tmp_path):
    assert containers.resolve_backend(ContainerSpec(image=base_image, backend="auto")) == "docker"
    assert containers.resolve_backend(ContainerSpec(image=str(tmp_path), backend="auto")) == "sandbox"
    assert containers.resolve_backend(ContainerSpec(image=base_image, backend="sandbox")) == "sandbox"
    assert containers.resolve_backend(ContainerSpec(image="x", backend="docker")) == "docker"


def test_reap_orphans_removes_dead_owners_only(engine, base_image, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    base_labels = {"agentfly": "1", "agentfly.pool": "container:test"}
    orphan = engine.containers.create(base_image, ["sleep", "infinity"], network_mode="none", labels={
        **base_labels, "agentfly.manager": f"afg-{dead.pid}-deadbeef"})
    mine = engine.containers.create(base_image, ["sleep", "infinity"], network_mode="none", labels={
        **base_labels, "agentfly.manager": "custom-live", "agentfly.pid": str(os.getpid())})
    try:
        assert orphan.id[:12] not in reap_orphans(older_than=3600, dry_run=True)  # too young
        assert orphan.id[:12] in reap_orphans(dry_run=True)
        engine.api.inspect_container(orphan.id)  # dry run removed nothing
        removed = reap_orphans()
        assert orphan.id[:12] in removed
        assert mine.id[:12] not in removed
        engine.api.inspect_container(mine.id)  # the live process's container stays
        assert gc_main(["--manager", "custom-live"]) == 0
        assert mine.id[:12] in capsys.readouterr().out
    finally:
        for c in (orphan, mine):
            try:
                c.remove(force=True)
            except Exception:
                pass
    import docker

    for c in (orphan, mine):
        with pytest.raises(docker.errors.NotFound):
            engine.api.inspect_container(c.id)


_CHILD = """
import asyncio, os, sys, time
from agentfly_gym.resources import ContainerSpec, ResourceManager, teardown
teardown.install()   # the application asks SIGTERM to tear down (making a manager installs no handler)
async def main():
    m = ResourceManager()
    c = await m.scope("s").acquire(ContainerSpec(image=sys.argv[1], backend="docker", memory="128m"))
    print(c.container_id, flush=True)
    if sys.argv[2] == "wait":
        await asyncio.sleep(120)  # alive until the test signals it
asyncio.run(main())   # exits without closing the manager: the atexit hook must clean up
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigint", "atexit"])
def test_process_end_removes_its_containers(engine, base_image, how):
    import docker

    proc = subprocess.Popen([sys.executable, "-c", _CHILD, base_image, "exit" if how == "atexit" else "wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=default_sigint)
    try:
        cid = proc.stdout.readline().strip()
        assert cid, proc.stderr.read()
        if how != "atexit":
            assert engine.api.inspect_container(cid)["State"]["Running"]
            proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(cid)


@pytest.mark.slow
async def test_fast_exec_output_is_never_lost_under_cpu_load(engine, base_image, manager):
    """docker-py's ``exec_start`` drops output that arrives together with the HTTP response headers
    (docker/docker-py#3332): under CPU load about 2% of quick ``echo`` execs came back empty with exit 0.
    With busy processes loading the CPUs, every one of 400 quick execs must return its exact output."""
    s = spec(base_image, max_instances=2)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        async with manager.scope("a") as a, manager.scope("b") as b:
            boxes = [await a.acquire(s), await b.acquire(s)]
            results = await asyncio.gather(*(boxes[i % 2].exec(f"echo a=1; echo ok-{i}") for i in range(400)))
    finally:
        for p in burners:
            p.kill()
            p.wait()
    lost = [(i, r.exit_code, r.output) for i, r in enumerate(results) if r.output != f"a=1\nok-{i}\n"]
    assert not lost, f"{len(lost)} of 400 execs lost output, e.g. {lost[:3]}"
    assert all(r.exit_code == 0 for r in results)


async def test_a_container_killed_during_an_exec_is_reported_dead(engine, base_image, manager):
    """``docker kill`` from outside while a command runs: the exec raises ResourceDied (not an ordinary
    exit 137 the agent would read as its own command's result)."""
    s = spec(base_image)
    async with manager.scope("k") as scope:
        c = await scope.acquire(s)
        running = asyncio.ensure_future(c.exec("sleep 20; echo never"))
        for _ in range(100):
            if any("sleep 20" in p for p in await procs(c)):
                break
            await asyncio.sleep(0.1)
        await asyncio.to_thread(engine.api.kill, c.container_id)
        with pytest.raises(ResourceDied, match="stopped during the command"):
            await asyncio.wait_for(running, 30)
        await scope.discard(c)


@pytest.mark.slow
async def test_a_mount_with_a_missing_source_is_refused_not_created(base_image, manager, tmp_path):
    """Docker's legacy ``binds`` created a root-owned empty folder for a missing source and started the
    container; typed mounts (and the backend's own check) refuse it, and nothing appears on the host."""
    from agentfly_gym.resources import Mount

    missing = tmp_path / "no-such-folder"
    s = spec(base_image, mounts=(Mount(source=str(missing), target="/data"),))
    async with manager.scope("mount") as scope:
        with pytest.raises(ConfigError, match="does not exist on the host"):
            await scope.acquire(s)
    assert not missing.exists()
    present = tmp_path / "data"
    present.mkdir()
    (present / "x.txt").write_text("hello")
    async with manager.scope("mount-ok") as scope:
        box = await scope.acquire(spec(base_image, mounts=(Mount(source=str(present), target="/data"),)))
        assert (await box.exec("cat /data/x.txt")).output == "hello"
        assert (await box.exec("touch /data/y 2>/dev/null || echo read-only")).output == "read-only\n"


@pytest.mark.slow
async def test_a_cancelled_exec_of_a_torn_down_container_prints_nothing(base_image, tmp_path):
    """Ctrl-C during a run: the exec's task is cancelled and the container torn down, so the exec's thread
    ends with ResourceDied that nobody awaits; asyncio must not report "Future exception was never retrieved"."""
    import gc

    reported: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        m = ResourceManager()
        scope = m.scope("cancel")
        box = await scope.acquire(spec(base_image))
        task = asyncio.ensure_future(box.exec("sleep 30", timeout=60))
        deadline = loop.time() + 30
        while not any("sleep 30" in p for p in await procs(box)):  # the exec runs: cancel it midway
            assert loop.time() < deadline, "the exec never started"
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await scope.aclose()
        await m.aclose()
        # the exec's thread (the Docker pool's workers, not its disk watchdog) leaves the backend's code
        await until(lambda: not threads_running(os.path.join("containers", "docker", ""), thread_prefix="afg-docker_"),
                    30, "the exec's thread to end")
        for _ in range(3):  # the thread's result reaches the loop (call_soon_threadsafe)
            await asyncio.sleep(0)
        del task
        gc.collect()
        await asyncio.sleep(0)
        assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported
    finally:
        loop.set_exception_handler(None)
