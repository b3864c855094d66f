"""OpenEnv's example environment in a container from our resource manager, played through OpenEnvEnv.

Real components only: the echo env that OpenEnv's own ``openenv init`` generates, built into an
image on our base (``build_openenv_image``: the host's openenv-core and its server dependencies
copied in, no registry), run by the Docker backend with its port published on 127.0.0.1 at an
engine-chosen host port, and driven by OpenEnv's ``GenericEnvClient`` inside :class:`OpenEnvEnv`.
Also: ``ContainerSpec.ports`` validation and the sandbox backend's refusal.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from waiting import until

pytest.importorskip("openenv.core", reason="pip install 'agentfly-gym[openenv]'")

from agentfly_gym.bridges.openenv import OpenEnvEnv
from agentfly_gym.errors import ConfigError, ResourceUnavailable
from agentfly_gym.resources import ContainerSpec, ResourceManager

READY = "Echo Env environment ready!"  # the reset observation of OpenEnv's echo template


def test_ports_need_a_network_and_valid_numbers():
    with pytest.raises(ConfigError, match="needs network=True"):
        ContainerSpec(image="x", ports=(8000,))
    for bad in ((0,), (70000,), ("8000",), (True,), (8000, 8000)):
        with pytest.raises(ConfigError, match="port"):
            ContainerSpec(image="x", ports=bad, network=True)
    with pytest.raises(ConfigError, match="tuple of TCP port numbers"):
        ContainerSpec(image="x", ports=8000, network=True)
    a, b = ContainerSpec(image="x", network=True), ContainerSpec(image="x", network=True, ports=(8000,))
    assert a.key != b.key                                   # a published port makes another pool


def test_sandbox_backend_refuses_ports(tmp_path):
    """Chosen by name, the sandbox is refused when the spec (or the env) is built; chosen by ``"auto"``, when
    the backend is created at acquisition."""
    from agentfly_gym.resources.containers.sandbox import create

    with pytest.raises(ConfigError, match="'sandbox' container backend cannot publish ports=\\(8000,\\)"):
        ContainerSpec(image=str(tmp_path), backend="sandbox", network=True, ports=(8000,))
    with pytest.raises(ConfigError, match="'sandbox' container backend cannot publish ports=\\(8000,\\)"):
        OpenEnvEnv(image="agentfly/openenv-echo-env", container={"backend": "sandbox"})
    with pytest.raises(ResourceUnavailable, match="'sandbox' container backend cannot publish ports=\\(8000,\\)"):
        create(ContainerSpec(image=str(tmp_path), backend="auto", network=True, ports=(8000,)), {})


def test_bad_container_settings_are_named():
    with pytest.raises(ConfigError, match="exactly one of"):
        OpenEnvEnv(image="agentfly/openenv-echo-env", base_url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"\['ports'\] are set by OpenEnvEnv"):
        OpenEnvEnv(image="agentfly/openenv-echo-env", container={"ports": (1,)})
    with pytest.raises(ConfigError, match="cannot publish"):
        OpenEnvEnv(image="agentfly/openenv-echo-env", container={"network": False})
    with pytest.raises(ConfigError, match="bogus"):
        OpenEnvEnv(image="agentfly/openenv-echo-env", container={"bogus": 1})


@pytest.fixture(scope="module")
def echo_image(docker_client) -> str:
    """The echo env's image (built once, a no-op when unchanged: the tag is a content hash)."""
    from agentfly_gym.images.openenv import build_openenv_image

    return build_openenv_image("echo_env")


def _ours(client) -> list:
    return client.containers.list(all=True, filters={"label": ["agentfly=1", f"agentfly.pid={os.getpid()}"]})


@pytest.mark.docker
@pytest.mark.slow  # builds the echo server's image, minutes when not cached
def test_unchanged_image_is_not_rebuilt(echo_image, docker_client):
    """The second build finds the image by its labels (the copied packages' versions) and builds nothing."""
    from agentfly_gym.images.openenv import build_openenv_image

    lines = []
    assert build_openenv_image("echo_env", progress=lines.append) == echo_image
    assert not any("building" in line or "Step " in line for line in lines), lines
    labels = docker_client.images.get(echo_image).labels
    assert "openenv-core==" in labels["agentfly.openenv.dists"]
    assert labels["agentfly.openenv.env"] == "echo_env"


@pytest.mark.slow
@pytest.mark.docker
async def test_echo_env_in_pooled_containers(echo_image, docker_client):
    """Episodes on a pool of one container: published on 127.0.0.1, a fresh container (and port) on reuse,
    a second episode waits for the first, a killed container gives a handled observation, nothing leaks."""
    m = ResourceManager()
    try:
        kw = dict(image=echo_image, action_field="message", observation_field="echoed_message", manager=m,
                  max_instances=1, container={"cpus": 0.5, "memory": "256m"})
        env, env2 = OpenEnvEnv(**kw), OpenEnvEnv(**kw)
        seen = []
        for episode in range(2):
            obs, info = await env.areset(seed=episode)
            assert obs == READY
            assert info["openenv"]["message_length"] == 0
            assert info["error"] is None
            (box,) = env.scope.resources.values()
            host, port = box.endpoint(8000)
            assert host == "127.0.0.1"
            assert env._url == f"http://127.0.0.1:{port}"
            attrs = docker_client.api.inspect_container(box.container_id)
            assert attrs["HostConfig"]["PortBindings"]["8000/tcp"][0]["HostIp"] == "127.0.0.1"
            seen.append((box.id, box.container_id, box.restarts_in_place))
            for text in ("hello", "abc"):
                obs, reward, term, trunc, info = await env.astep(text)
                assert (obs, reward, term, trunc) == (text, pytest.approx(0.1 * len(text)), False, False)
            assert info["step"] == 2
            if episode == 1:  # a second episode waits for the one container while this one holds it
                waiting = asyncio.create_task(env2.areset(seed=6))
                await until(lambda: any(p["waiting"] for k, p in m.metrics().items() if k.startswith("container")),
                            60, "the second episode to wait for the container")
                assert not waiting.done()
            await env.aend_episode()
        (pool,) = [p for k, p in m.metrics().items() if k.startswith("container")]
        assert pool["started"] == 1
        assert pool["reused"] >= 1
        assert seen[0][0] == seen[1][0]                      # the same pooled instance ...
        if seen[0][1] == seen[1][1]:                          # ... reset on reuse: the container restarted in place
            assert seen[1][2] > seen[0][2]
        else:                                                 # ... or a fresh container in place of the old one
            assert docker_client.containers.list(all=True, filters={"id": seen[0][1]}) == []
        obs, _ = await asyncio.wait_for(waiting, 120)
        assert obs == READY
        (box,) = env2.scope.resources.values()
        assert box.container_id not in (seen[0][1], seen[1][1]) or box.restarts_in_place > seen[1][2]

        # the container dies mid-episode: a handled observation, the container discarded
        docker_client.api.kill(box.container_id)
        obs, reward, term, trunc, info = await env2.astep("anyone?")
        assert trunc
        assert not term
        assert reward == 0.0
        assert info["error"]
        assert "OpenEnv server" in info["error"]
        assert obs.startswith("Error:")
        assert not env2.scope_is_open                        # the episode ended, its scope released
        assert m.metrics()[box.spec.key]["in_use"] == 0
        await env.aclose()
        await env2.aclose()
    finally:
        await m.aclose()
    assert _ours(docker_client) == []


@pytest.mark.slow
@pytest.mark.docker
async def test_server_that_never_answers_fails_reset_clearly(echo_image, docker_client):
    """A container whose command serves nothing: reset fails naming /health, and the container is discarded."""
    from agentfly_gym.errors import ResourceStartError

    async with ResourceManager() as m:
        env = OpenEnvEnv(image=echo_image, command=("sleep", "infinity"), server_timeout=3, manager=m,
                         container={"memory": "128m"})
        with pytest.raises(ResourceStartError, match="did not answer /health with 200 within 3"):
            await env.areset(seed=0)
        (pool,) = [p for k, p in m.metrics().items() if k.startswith("container")]
        assert pool["in_use"] == 0
        assert pool["idle"] == 0
        await env.aclose()
    assert _ours(docker_client) == []


@pytest.mark.slow
@pytest.mark.docker
def test_closed_envs_leave_no_container_past_the_idle_time(echo_image, docker_client):
    """Sync envs on the default manager (which lives until process exit): after ``close()`` the pool keeps a
    fresh container idle, so the next env reuses it warm (one start), and removes it once ``max_idle_time``
    (300 s by default; 20 s here, so that the second env still comes before it under load) has passed with
    nobody acquiring it; the manager stays open."""
    kw = dict(image=echo_image, action_field="message", observation_field="echoed_message", max_instances=1,
              container={"cpus": 0.5, "memory": "256m", "max_idle_time": 20.0})
    first = OpenEnvEnv(**kw)
    key = first.container_spec.key

    def pool_containers() -> list:
        # sparse: no inspect per listed container, which raced with the pool removing it (404 NotFound)
        return docker_client.containers.list(all=True, sparse=True,
                                             filters={"label": [f"agentfly.pool={key}", f"agentfly.pid={os.getpid()}"]})

    assert first.reset(seed=0)[0] == READY
    assert first.step("hi")[0] == "hi"
    first.close()
    second = OpenEnvEnv(**kw)
    assert second.reset(seed=1)[0] == READY
    manager = second.manager
    second.close()
    snap = manager.metrics()[key]
    assert snap["started"] == 1
    assert snap["reused"] == 1
    deadline = time.monotonic() + 120
    while pool_containers() or manager.metrics()[key]["idle"]:
        assert time.monotonic() < deadline, f"containers still up: {pool_containers()}"
        time.sleep(0.2)
    assert not manager.closed
    assert manager.metrics()[key]["recycled"] == 1
