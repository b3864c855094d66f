"""Start an exec and read its output through the Docker Engine API, over the engine's own socket.

Why not docker-py's ``exec_start(stream=True)``: it reads the upgraded connection from the raw socket under
``http.client``'s buffered reader, so output that arrived in the same read as the response headers (a fast
command on a loaded machine) is skipped; the exec then reports exit 0 with empty output (docker/docker-py
issues 425 and 3332, still so in docker-py 7.2; measured here: 28-35 of 1,500 execs of ``echo`` under CPU
load).  ``exec_start(socket=True)`` hands out the same raw socket.  So this module is a small client of the one
Engine API endpoint that needs it, "Start an exec instance" (Docker Engine API reference, ``ExecStart``)::

    POST /v{api_version}/exec/{id}/start        {"Detach": false, "Tty": false}
    Connection: Upgrade, Upgrade: tcp           -> 101 (or 200), then the exec's output on the same connection

and reads status line, headers and output through ONE buffered reader, so nothing is skipped.  Without a TTY
the output is the Engine API's multiplexed stream ("Attach to a container", stream format): frames of an
8-byte header ``[type (0 stdin, 1 stdout, 2 stderr), 0, 0, 0, size (big-endian uint32)]`` and ``size`` bytes.

The engine's address is docker-py's own (``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``, read
by ``docker.utils.kwargs_from_env`` and parsed by ``docker.utils.parse_host``, as ``docker.from_env`` does):
a unix socket, or TCP (with TLS where configured).  Other transports (``ssh://``, ``npipe://``) go through
docker-py's public ``exec_start(stream=True)``, with that issue's race (a warning says so once).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import ssl
import struct
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, NamedTuple
from urllib.parse import urlparse

from ....errors import ResourceError

__all__ = ["EngineError", "Endpoint", "endpoint_from_env", "exec_start_frames"]

log = logging.getLogger(__name__)

_FRAME_HEADER = struct.Struct(">BxxxL")  # stream type, 3 zero bytes, payload size
_EXEC_ID = re.compile(r"[0-9A-Za-z_.-]{1,128}")
_MAX_LINE = 65536
_ENV_KEYS = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


class EngineError(ResourceError):
    """The engine answered ``exec start`` with an error.

    Attributes:
        status: the HTTP status (404: no such exec or container; 409: the container is not running).
        message: the engine's message (its JSON ``message``, else the body's text).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Endpoint(NamedTuple):
    """Where the engine listens: ``scheme`` ``"unix"`` (``address`` a socket path), ``"tcp"`` (``address``
    ``(host, port)``) or another transport this client does not speak (``"other"``); ``tls``: docker-py's
    ``TLSConfig`` for TCP, or None."""

    scheme: str
    address: Any
    tls: Any = None


def endpoint_from_env(environment: dict[str, str] | None = None) -> Endpoint:
    """The engine's address as ``docker.from_env`` finds it in ``environment`` (default ``os.environ``:
    ``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``), without connecting."""
    env = os.environ if environment is None else environment
    return _endpoint(tuple((k, env[k]) for k in _ENV_KEYS if k in env))


@lru_cache(maxsize=8)
def _endpoint(settings: tuple[tuple[str, str], ...]) -> Endpoint:
    from docker.utils import kwargs_from_env, parse_host

    kwargs = kwargs_from_env(dict(settings) or {"DOCKER_HOST": ""})  # ({} would make it read os.environ)
    tls = kwargs.get("tls")
    url = parse_host(kwargs.get("base_url"), False, tls=bool(tls))
    parsed = urlparse(url)
    if parsed.scheme == "http+unix":
        return Endpoint("unix", parsed.path)
    if parsed.scheme in ("http", "https"):
        return Endpoint("tcp", (parsed.hostname, parsed.port), tls if parsed.scheme == "https" else None)
    return Endpoint("other", url)


def _connect(ep: Endpoint, timeout: float) -> socket.socket:
    if ep.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(ep.address)
        except BaseException:
            sock.close()
            raise
        return sock
    host, port = ep.address
    sock = socket.create_connection((host, port), timeout)
    if ep.tls is None:
        return sock
    tls = ep.tls
    ctx = ssl.create_default_context(cafile=tls.ca_cert if tls.verify and tls.ca_cert else None)
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.cert:
        ctx.load_cert_chain(*tls.cert)
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def _read_body(reader: Any, headers: dict[str, str]) -> bytes:
    """The body of an error answer (``Content-Length`` or chunked; the connection is closed afterwards)."""
    if "content-length" in headers:
        return reader.read(int(headers["content-length"]))
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size = int(reader.readline(_MAX_LINE).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return bytes(out)
            out += reader.read(size)
            reader.readline(_MAX_LINE)  # the CRLF after each chunk
    return reader.read()


@lru_cache(maxsize=8)
def _warn_fallback(address: str) -> None:
    """Say once per address that docker-py reads the execs' output there."""
    log.warning("Docker engine at %s: exec output is read by docker-py, which can drop the output of fast "
                "commands (docker/docker-py#3332); unix:// and tcp:// engines are read directly", address)


def exec_start_frames(api: Any, exec_id: str, *, timeout: float = 120.0,
                      endpoint: Endpoint | None = None) -> Iterator[bytes]:
    """Start exec ``exec_id`` (attached, no TTY) and yield its output frames' payloads (bytes; stdout and
    stderr interleaved, in the order the engine sent them) until the exec ends.

    Args:
        api: the docker-py low-level client (``docker_client.api``); only its public ``api_version`` is read,
            and it does the request itself for transports this client does not speak.
        exec_id: the id ``api.exec_create`` returned.
        timeout: seconds to connect and to wait for the answer's headers; the output is then waited for
            without limit (a command may stay silent longer: the exec's own timeout, or the caller's
            cancellation, ends it).
        endpoint: the engine's address (default: :func:`endpoint_from_env`).

    Raises:
        EngineError: the engine refused (404: the exec or its container is gone; 409: not running).
        OSError: the engine cannot be reached, or the connection broke before the answer's headers.
        ValueError: ``exec_id`` is not an id.
    """
    if not _EXEC_ID.fullmatch(exec_id):
        raise ValueError(f"not an exec id: {exec_id!r}")
    ep = endpoint_from_env() if endpoint is None else endpoint
    if ep.scheme == "other":
        _warn_fallback(ep.address)
        yield from api.exec_start(exec_id, stream=True)
        return
    body = json.dumps({"Detach": False, "Tty": False}).encode()
    host = "docker" if ep.scheme == "unix" else f"{ep.address[0]}:{ep.address[1]}"
    request = (f"POST /v{api.api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
               f"Host: {host}\r\nUser-Agent: agentfly-gym\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n").encode() + body
    sock = _connect(ep, timeout)
    try:
        sock.sendall(request)
        reader = sock.makefile("rb")
        try:
            status_line = reader.readline(_MAX_LINE)
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
                raise ConnectionError(f"the Docker engine answered {status_line[:80]!r} to exec start")
            status = int(parts[1])
            headers: dict[str, str] = {}
            while True:
                line = reader.readline(_MAX_LINE)
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if status not in (101, 200):
                raw = _read_body(reader, headers)
                try:
                    message = str(json.loads(raw).get("message") or raw.decode(errors="replace"))
                except (ValueError, AttributeError):
                    message = raw.decode(errors="replace").strip()
                raise EngineError(status, message)
            sock.settimeout(None)
            while True:
                header = reader.read(_FRAME_HEADER.size)
                if len(header) < _FRAME_HEADER.size:
                    return
                _, size = _FRAME_HEADER.unpack(header)
                payload = reader.read(size) if size else b""
                if payload:
                    yield payload
                if len(payload) < size:
                    return
        finally:
            reader.close()
    finally:
        sock.close()
