"""Exec output over a TLS engine address (``DOCKER_HOST=tcp://...``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``),
as a remote Docker engine is reached: :func:`exec_start_frames` speaks TLS itself (docker-py's public
``exec_start`` drops output, docker/docker-py#3332), so its TLS path is checked against the real engine.

The engine here listens only on its unix socket, so the test puts a TLS front end before it: a thread that
accepts TLS connections on 127.0.0.1 (a certificate for 127.0.0.1 signed by a test CA, client certificates
required, as ``dockerd --tlsverify`` does) and passes the bytes through to ``/var/run/docker.sock``.  The
certificates come from the ``openssl`` program.  Everything the engine sees is real; only the TLS end is
not dockerd's own (a second daemon with its own data root is too heavy for a test).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agentfly_gym.resources.containers.docker.exec_stream import Endpoint, endpoint_from_env, exec_start_frames

pytestmark = pytest.mark.docker

ENGINE_SOCKET = "/var/run/docker.sock"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """``ca.pem``, the server's ``server-cert.pem``/``server-key.pem`` (for IP 127.0.0.1) and the client's
    ``cert.pem``/``key.pem``: the file names ``DOCKER_CERT_PATH`` holds."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca-key.pem", "-out", "ca.pem", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}-cert.pem", cwd=d)
    (d / "cert.pem").write_bytes((d / "client-cert.pem").read_bytes())
    (d / "key.pem").write_bytes((d / "client-key.pem").read_bytes())
    return d


class TlsFrontEnd:
    """TLS on 127.0.0.1:``port`` in front of the engine's unix socket; counts the verified client handshakes."""

    def __init__(self, certs: Path) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs / "ca.pem"))
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx.load_cert_chain(str(certs / "server-cert.pem"), str(certs / "server-key.pem"))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0
        self.refused = 0
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            self.refused += 1
            conn.close()
            return
        self.handshakes += 1
        engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        engine.connect(ENGINE_SOCKET)
        up = threading.Thread(target=self._pump, args=(tls, engine), daemon=True)
        up.start()
        self._pump(engine, tls)
        up.join(10)
        for s in (tls, engine):
            s.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        self._accepting.join(5)


@pytest.fixture(scope="module")
def front(certs, docker_client):
    f = TlsFrontEnd(certs)
    yield f
    f.close()


@pytest.fixture(scope="module")
def tls_api(certs, front):
    """docker-py's low-level client of the engine, over TLS through the front end, and the endpoint the exec
    client reads from the same environment variables."""
    import docker

    env = {"DOCKER_HOST": f"tcp://127.0.0.1:{front.port}", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(certs)}
    with pytest.MonkeyPatch.context() as mp:
        # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace a session's CA file (docker-py's ca.pem):
        # where they are set (as on this project's machines) docker-py cannot verify any private CA
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            mp.delenv(name, raising=False)
        client = docker.DockerClient(**docker.utils.kwargs_from_env(environment=env), timeout=60)
        yield client, endpoint_from_env(env)
        client.close()


@pytest.fixture(scope="module")
def tls_box(tls_api):
    client, ep = tls_api
    c = client.containers.run("agentfly/base:latest", ["sleep", "300"], detach=True, remove=True,
                              labels={"agentfly.test": "exec_tls"})
    yield client.api, c.id, ep
    c.remove(force=True)


def _run(api, cid, ep, cmd: str) -> tuple[bytes, int]:
    eid = api.exec_create(cid, ["sh", "-c", cmd])["Id"]
    out = b"".join(exec_start_frames(api, eid, endpoint=ep))
    return out, api.exec_inspect(eid)["ExitCode"]


def test_exec_output_arrives_whole_over_tls(tls_box, front):
    api, cid, ep = tls_box
    assert ep.scheme == "tcp"
    assert ep.tls is not None
    assert ep.tls.verify
    before = front.handshakes
    out, code = _run(api, cid, ep, "echo one; echo two >&2; echo three; exit 3")
    assert code == 3
    assert sorted(out.splitlines()) == [b"one", b"three", b"two"]
    out, code = _run(api, cid, ep, "head -c 2000000 /dev/zero | tr '\\0' 'y'; printf '\\377\\000end'")
    assert code == 0
    assert len(out) == 2_000_005
    assert out.endswith(b"\xff\x00end")
    # fast commands, many times: the output buffered with the answer's headers is not lost
    for i in range(20):
        assert _run(api, cid, ep, f"echo {i}") == (f"{i}\n".encode(), 0)
    assert front.handshakes >= before + 22  # each exec start made its own verified TLS connection


def test_a_client_without_a_certificate_is_refused(tls_box, front, certs):
    """The engine's TLS refuses a client that shows no certificate: the exec client raises ``OSError`` (an
    ``ssl.SSLError``), never hangs or reads a partial answer."""
    import docker

    api, cid, ep = tls_box
    eid = api.exec_create(cid, ["echo", "never"])["Id"]
    no_cert = Endpoint("tcp", ep.address, docker.tls.TLSConfig(ca_cert=str(certs / "ca.pem"), verify=True))
    refused = front.refused
    with pytest.raises(OSError):
        list(exec_start_frames(api, eid, endpoint=no_cert, timeout=10))
    for _ in range(100):  # the front end's thread records the refused handshake
        if front.refused > refused:
            break
        time.sleep(0.05)
    assert front.refused == refused + 1


def test_a_server_the_ca_did_not_sign_is_refused(tls_box, tmp_path):
    """A client with ``DOCKER_TLS_VERIFY`` checks the engine's certificate: another CA is refused."""
    import docker

    api, cid, ep = tls_box
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other-ca",
             "-keyout", "k.pem", "-out", "other-ca.pem", cwd=tmp_path)
    eid = api.exec_create(cid, ["echo", "never"])["Id"]
    wrong = Endpoint("tcp", ep.address, docker.tls.TLSConfig(ca_cert=str(tmp_path / "other-ca.pem"), verify=True,
                                                             client_cert=ep.tls.cert))
    with pytest.raises(ssl.SSLCertVerificationError):
        list(exec_start_frames(api, eid, endpoint=wrong, timeout=10))
