"""The backend contract: a backend registered by a test serves a real manager; both container
backends cut long output the same way; `agentfly-gym resources gc` reaps what a killed process left
on both backends.

The toy backend below is the thing under test (the registry's contract), not a stand-in for a
real component; the container cases run the real Docker engine and the real bubblewrap sandbox.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ContainerSpec, Resource, ResourceManager, ResourceSpec, ResourceStatus, backends
from agentfly_gym.cli.resources import gc_main
from agentfly_gym.resources.containers import ownership, reaper
from agentfly_gym.resources.containers.output import TRUNCATION_MARKER, OutputBuffer

REPO = Path(__file__).resolve().parents[1]
RESOURCES = REPO / "agentfly_gym" / "resources"


# ------------------------------------------------------------------ a backend added by a test

@dataclasses.dataclass(frozen=True, kw_only=True)
class CounterSpec(ResourceSpec):
    """A new resource kind: a counter that starts at ``start``."""

    kind: ClassVar[str] = "counter"
    start: int = 0


class Counter(Resource):
    def __init__(self, spec: CounterSpec, *, labels: dict[str, str]) -> None:
        super().__init__(spec, labels=labels)
        self.value = getattr(spec, "start", 0)
        self.terminated = False

    async def start(self) -> None:
        self._status = ResourceStatus.READY

    async def reset(self) -> None:
        self.value = getattr(self.spec, "start", 0)

    async def status(self) -> ResourceStatus:
        return self._status

    async def adestroy(self) -> None:
        self._status = ResourceStatus.STOPPED

    def destroy(self) -> None:
        self.terminated = True
        self._status = ResourceStatus.STOPPED


@pytest.fixture
def registry(monkeypatch):
    """The backend registry, restored after the test (registrations are process-wide)."""
    monkeypatch.setattr(backends, "_BACKENDS", dict(backends._BACKENDS))
    monkeypatch.setattr(backends, "_RESOLVERS", dict(backends._RESOLVERS))
    return backends


async def test_a_registered_backend_gets_the_spec_and_the_managers_labels(registry):
    calls: list[tuple[ResourceSpec, dict[str, str]]] = []

    def create(spec, labels):
        calls.append((spec, dict(labels)))
        return Counter(spec, labels=labels)

    registry.register_backend("counter", "", create)
    spec = CounterSpec(start=5, max_instances=1)
    async with ResourceManager(manager_id="contract-test") as m:
        async with m.scope("a") as scope:
            c = await scope.acquire(spec)
            assert isinstance(c, Counter)
            assert c.value == 5
            c.value = 9
        async with m.scope("b") as scope:
            again = await scope.acquire(spec)
            assert again is c
            assert c.value == 5
        assert len(calls) == 1
        got_spec, labels = calls[0]
        assert got_spec is spec
        assert labels == {**m.labels, "agentfly.pool": spec.key}
        assert labels["agentfly.manager"] == "contract-test"
        assert labels["agentfly.pid"] == str(os.getpid())
        assert c.labels == labels


async def test_a_new_container_backend_is_chosen_by_name(registry):
    registry.register_backend("container", "counterbox", lambda spec, labels: Counter(spec, labels=labels))
    assert "counterbox" in registry.backend_names("container")
    spec = ContainerSpec(image="anything", backend="counterbox")
    async with ResourceManager() as m:
        async with m.scope("s") as scope:
            assert isinstance(await scope.acquire(spec), Counter)
    with pytest.raises(ConfigError, match="'nosuchbox' is not one of 'auto', 'counterbox', 'docker', 'sandbox'"):
        ContainerSpec(image="x", backend="nosuchbox")
    registry.register_resolver("container", lambda spec: "counterbox")
    assert registry.resolve_backend_name(ContainerSpec(image="x", backend="auto")) == "counterbox"


async def test_registry_errors_name_the_bad_value(registry):
    with pytest.raises(ConfigError, match="no backend for resource kind 'counter'"):
        backends.create_resource(CounterSpec(), {})
    registry.register_backend("counter", "", "no_such_module_xyz:create")
    from agentfly_gym.errors import ResourceUnavailable

    with pytest.raises(ResourceUnavailable, match="no_such_module_xyz"):
        backends.create_resource(CounterSpec(), {})
    with pytest.raises(ConfigError, match="register_resolver"):
        registry.register_backend("counter", "auto", "x:y")


def test_exit_teardown_reaches_instances_still_held(registry):
    """close (what the atexit hook and the SIGTERM handler call) terminates every instance the
    manager built and still references, whether a pool lists it or not."""
    registry.register_backend("counter", "", lambda spec, labels: Counter(spec, labels=labels))
    m = ResourceManager()
    built = [m.build_resource(CounterSpec(start=i)) for i in range(3)]
    m.close()
    assert all(c.terminated for c in built)
    assert m.closed


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_backend_imports_the_manager_the_pool_or_an_environment():
    """The old circle (manager.py <-> backends/__init__.py) and upward imports stay gone."""
    files = [*(RESOURCES / "backends").glob("*.py"), *(RESOURCES / "containers").rglob("*.py")]
    assert len(files) >= 12
    for f in files:
        for name in _imports(f):
            last = name.rsplit(".", 1)[-1]
            assert last not in ("manager", "pool") and "envs" not in name.split("."), (f.name, name)


# ------------------------------------------------------------------ one output format

def test_output_buffer_keeps_head_and_tail_with_one_marker():
    buf = OutputBuffer(100)
    buf.feed(b"A" * 300)
    buf.feed(b"Z" * 300)
    text, cut = buf.text(100)
    assert cut
    assert len(text) <= 100
    marker = TRUNCATION_MARKER.format(n=600 - (100 - len(TRUNCATION_MARKER.format(n=600))))
    assert text.startswith("AAA")
    assert text.endswith("ZZZ")
    assert marker in text
    # past 4 * max_chars bytes the middle is dropped as it streams, and still counted
    big = OutputBuffer(10)
    for _ in range(100):
        big.feed(b"x" * 1000)
    text, cut = big.text(40)
    assert cut
    assert len(text) <= 40
    assert "characters cut" in text
    assert int(text.split("[... ")[1].split(" ")[0]) > 99_000
    # short output, invalid UTF-8 replaced, not cut
    ok = OutputBuffer(50)
    ok.feed(b"ok\xff\n")
    assert ok.text(50) == ("ok\ufffd\n", False)
    tiny = OutputBuffer(5)
    tiny.feed(b"0123456789")
    assert tiny.text(5) == ("01234", True)  # no room for the marker: the head only


_LONG = "head -c 3000 /dev/zero | tr '\\0' A; head -c 3000 /dev/zero | tr '\\0' Z; echo"


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap ('bwrap' on PATH)")
async def test_both_backends_cut_long_output_identically(docker_client, tmp_path, monkeypatch):
    from agentfly_gym.images.base import build_base_image

    monkeypatch.setenv("AGENTFLY_GYM_SANDBOX_DIR", str(tmp_path / "sbx"))
    image = build_base_image()
    spec = dict(image=image, sandbox_image="host", memory="256m", pids=64)
    async with ResourceManager() as m:
        async with m.scope("docker") as d, m.scope("sandbox") as s:
            on_docker = await d.acquire(ContainerSpec(backend="docker", **spec))
            in_sandbox = await s.acquire(ContainerSpec(backend="sandbox", **spec))
            assert (on_docker.backend_name, in_sandbox.backend_name) == ("docker", "sandbox")
            a, b = await asyncio.gather(on_docker.exec(_LONG, max_output=500), in_sandbox.exec(_LONG, max_output=500))
    assert a.truncated
    assert b.truncated
    assert a.exit_code == b.exit_code == 0
    assert a.output == b.output
    assert "characters cut" in a.output
    assert len(a.output) <= 500


# ------------------------------------------------------------------ gc reaps both backends

_CHILD = """
import asyncio, sys
from agentfly_gym.resources import ContainerSpec, ResourceManager
async def main():
    m = ResourceManager(manager_id=sys.argv[2])
    async with m.scope("s") as scope:
        box = await scope.acquire(ContainerSpec(image=sys.argv[1], backend="docker", memory="128m"))
        sbx = await scope.acquire(ContainerSpec(image="host", backend="sandbox", memory="128m", name="sbx"))
        print(box.container_id, sbx.name, flush=True)
        await asyncio.sleep(600)  # alive until the test SIGKILLs it
asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap ('bwrap' on PATH)")
def test_gc_reaps_a_killed_managers_containers_and_sandboxes(docker_client, tmp_path, monkeypatch, capsys):
    """A manager SIGKILLed (no atexit, no handler) leaves a Docker container and a sandbox (folder,
    cgroup, processes); ``resources gc`` finds both as orphans of a dead owner and removes them."""
    import docker

    from agentfly_gym.images.base import build_base_image
    from agentfly_gym.resources.containers.sandbox import cgroups

    root = tmp_path / "sbx"
    monkeypatch.setenv("AGENTFLY_GYM_SANDBOX_DIR", str(root))
    manager_id = f"gc-test-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, build_base_image(), manager_id], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ))
    try:
        line = proc.stdout.readline().split()
        assert len(line) == 2, proc.stderr.read() if proc.poll() is not None else line
        cid, name = line
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert docker_client.api.inspect_container(cid)["State"]["Running"]
        assert (root / name).is_dir()
        labels = docker_client.api.inspect_container(cid)["Config"]["Labels"]
        assert labels["agentfly.manager"] == manager_id
        assert ownership.owner_dead(labels)
        # without a manager id both are found as orphans of a dead owner (dry run: others' stay untouched)
        containers, sandboxes = reaper.reap_all(dry_run=True)
        assert cid[:12] in containers
        assert name in sandboxes
        assert gc_main(["--manager", manager_id]) == 0
        out = capsys.readouterr()
        assert cid[:12] in out.out
        assert name in out.out
        assert "1 container(s) and 1 sandbox(es)" in out.err
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(cid)
        assert not (root / name).exists()
        parents = [cgroups.CGROUP_FS / cgroups.CGROUP_PARENT] + [
            b / cgroups.CGROUP_PARENT for b in (cgroups.cgroup1_dir(c) for c in ("memory", "pids", "cpu")) if b]
        assert not [p / name for p in parents if (p / name).exists()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reaper.reap_all(manager_id)  # whatever a failed assertion left
