"""The exec client of :mod:`agentfly_gym.resources.containers.docker.exec_stream` against the real engine:
the output of every stream, large output split over many frames, the engine's errors as ``EngineError`` and
the engine's address read as docker-py reads it (``DOCKER_HOST`` and the TLS settings; no connection made).

Skips only when no engine answers and ``AGENTFLY_REQUIRE_DOCKER`` is unset (as tests/test_docker_backend.py).
"""

from __future__ import annotations

import pytest

from agentfly_gym.resources.containers.docker.exec_stream import (
    EngineError,
    Endpoint,
    endpoint_from_env,
    exec_start_frames,
)

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def box(docker_client):
    c = docker_client.containers.run("agentfly/base:latest", ["sleep", "300"], detach=True, remove=True,
                                     labels={"agentfly.test": "exec_stream"})
    yield docker_client.api, c.id
    c.remove(force=True)


def run(api, cid, cmd: str) -> tuple[bytes, int]:
    eid = api.exec_create(cid, ["sh", "-c", cmd])["Id"]
    out = b"".join(exec_start_frames(api, eid))
    return out, api.exec_inspect(eid)["ExitCode"]


def test_stdout_and_stderr_and_the_exit_code(box):
    """Both streams arrive (the engine reads the two pipes apart, so their relative order is not fixed)."""
    api, cid = box
    out, code = run(api, cid, "echo one; echo two >&2; echo three; exit 3")
    assert code == 3
    assert sorted(out.splitlines()) == [b"one", b"three", b"two"]
    assert out.index(b"one") < out.index(b"three")
    assert run(api, cid, "true") == (b"", 0)


def test_large_binary_output_arrives_whole(box):
    api, cid = box
    out, code = run(api, cid, "head -c 3000000 /dev/zero | tr '\\0' 'x'; printf '\\377\\000end'")
    assert code == 0
    assert len(out) == 3_000_005
    assert out.endswith(b"\xff\x00end")
    assert out[:10] == b"x" * 10


def test_an_unknown_exec_is_an_engine_error_404(box):
    api, _ = box
    with pytest.raises(EngineError) as e:
        list(exec_start_frames(api, "0" * 64))
    assert e.value.status == 404
    assert "0" * 12 in e.value.message
    with pytest.raises(ValueError):
        list(exec_start_frames(api, "abc\r\nHost: x"))


def test_an_exec_of_a_killed_container_is_an_engine_error(docker_client):
    """The engine forgets the execs of a stopped container (404) or refuses to start them (409)."""
    c = docker_client.containers.run("agentfly/base:latest", ["sleep", "300"], detach=True,
                                     labels={"agentfly.test": "exec_stream"})
    try:
        eid = docker_client.api.exec_create(c.id, ["true"])["Id"]
        c.kill()
        with pytest.raises(EngineError) as e:
            list(exec_start_frames(docker_client.api, eid))
        assert e.value.status in (404, 409)
        assert e.value.message
    finally:
        c.remove(force=True)


def test_the_engine_address_is_docker_pys(tmp_path):
    assert endpoint_from_env({}) == Endpoint("unix", "/var/run/docker.sock")
    assert endpoint_from_env({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}) == \
        Endpoint("unix", "/run/user/1000/docker.sock")
    assert endpoint_from_env({"DOCKER_HOST": "tcp://10.0.0.5:2375"}) == Endpoint("tcp", ("10.0.0.5", 2375))
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("")
    tls = endpoint_from_env({"DOCKER_HOST": "tcp://engine:2376", "DOCKER_TLS_VERIFY": "1",
                             "DOCKER_CERT_PATH": str(tmp_path)})
    assert tls.scheme == "tcp"
    assert tls.address == ("engine", 2376)
    assert tls.tls.verify
    assert tls.tls.cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert endpoint_from_env({"DOCKER_HOST": "ssh://me@engine"}).scheme == "other"


def test_another_transport_is_read_by_docker_py_with_a_warning(box, caplog):
    """For an ``ssh://`` engine the output comes from docker-py's public ``exec_start(stream=True)`` (run here
    against the local engine, whose address the endpoint only names)."""
    api, cid = box
    eid = api.exec_create(cid, ["sh", "-c", "echo via-docker-py"])["Id"]
    with caplog.at_level("WARNING", logger="agentfly_gym.resources.containers.docker.exec_stream"):
        out = b"".join(exec_start_frames(api, eid, endpoint=Endpoint("other", "ssh://me@engine:22")))
    assert out == b"via-docker-py\n"
    assert "docker-py#3332" in caplog.text
