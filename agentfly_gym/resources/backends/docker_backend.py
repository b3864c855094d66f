"""The Docker container backend: :class:`DockerContainer`, orphan reaping and signal-safe cleanup.

Every docker-py call is blocking, so it runs on a dedicated thread pool (``_docker_pool``);
the event loop never waits on the engine.

Containers run with (``ContainerSpec`` field -> Docker setting):

* ``cpus`` -> ``nano_cpus``; ``memory`` -> ``mem_limit`` = ``memswap_limit`` (no swap beyond the
  limit, so a memory hog is OOM-killed inside it); ``pids`` -> ``pids_limit`` (stops fork bombs);
* ``disk`` -> ``storage_opt={"size": disk}`` where the engine's storage driver supports it (overlay2
  on xfs with ``pquota``, btrfs, zfs; probed once per process).  Elsewhere (e.g. overlay2 on ext4)
  ``ulimits`` ``fsize=disk`` (no file grows past it: ``EFBIG``) and a host-side watchdog that sums the
  container's writable layer (``GraphDriver.Data.UpperDir``, when the engine is local) every
  :data:`DISK_POLL` seconds and kills the container once it exceeds ``disk``: its exec then raises
  :class:`~agentfly_gym.errors.ResourceDied` saying so, and the pool replaces it;
* ``network=False`` -> ``network_mode="none"`` (loopback only), ``True`` -> the default bridge;
* ``ports`` -> each published on ``127.0.0.1`` at a host port the engine picks, read back after
  start into ``published_ports`` (:func:`_port_bindings`, :func:`_read_published_ports`);
* ``mounts`` -> bind mounts, read-only where ``Mount.read_only``; ``env``, ``user``, ``workdir``;
* always: ``init=True`` (docker-init reaps zombies as PID 1), ``security_opt=["no-new-privileges"]``,
  ``cap_drop=["ALL"]`` with :data:`CAP_ADD` added back, and the labels ``agentfly=1``,
  ``agentfly.manager=<manager id>``, ``agentfly.pool=<spec key>``, ``agentfly.pid``,
  ``agentfly.pid_start`` and ``agentfly.host`` (so :func:`reap_orphans` can tell a dead owner).

Images must provide ``/bin/sh`` and ``timeout`` (coreutils).  The project's base image
(:mod:`agentfly_gym.images`) has them.

Episode isolation: ``reset()`` (on every re-acquisition) replaces the container with a fresh one
of the same image and settings, so nothing written in one episode (``/root``, ``/etc``,
``/usr/local``, a ``.pth`` in site-packages) is seen by the next; ``park()`` (when the pool keeps the
instance idle) does it at once, so no process of the last episode keeps running while idle and the
next acquisition finds a fresh container ready.

Cleanup: :meth:`DockerContainer.release` removes the container (``manager.aclose()`` releases
every pool); :meth:`DockerContainer.terminate_sync` is called by the manager's ``atexit`` hook;
SIGINT/SIGTERM handlers (installed once, on the main thread, when the first container starts;
they chain to the previous handlers) remove this process's containers; :func:`reap_orphans`
(``agentfly-gym resources gc``, :func:`gc_main`) removes those whose owning process died.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import io
import logging
import os
import re
import signal
import socket
import struct
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import (
    ConfigError,
    ResourceDied,
    ResourceError,
    ResourceStartError,
    ResourceUnavailable,
)
from ..base import ResourceStatus
from ..container import DEFAULT_MAX_OUTPUT, ContainerResource, ExecResult
from ..spec import ContainerSpec

if TYPE_CHECKING:
    from ..manager import ResourceManager

__all__ = [
    "CAP_ADD", "DockerContainer", "create_docker", "docker_available", "gc_main", "install_signal_handlers",
    "reap_orphans",
]

log = logging.getLogger(__name__)

CAP_ADD: tuple[str, ...] = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
"""Capabilities added back after ``cap_drop=["ALL"]``: what root inside needs for ordinary tools
(``cp -a``/``chown``/``chmod`` of others' files, ``kill`` of other users' processes, ``su``/``setpriv``
to drop to a user).  No ``NET_*``, ``SYS_*``, ``MKNOD`` or ``SETPCAP``; with ``no-new-privileges``
a non-root user cannot gain any of them."""

_LABEL = "agentfly"
_STATE_DIR = "/.agentfly"
_EXEC_MARK = "AGENTFLY_EXEC"
_KILL_GRACE = 5.0  # seconds past an exec's timeout before the host-side kill
DISK_POLL = 1.0
"""Seconds between two measurements of a container's writable layer by the disk watchdog."""
_MARKER = "\n[... {n} characters cut ...]\n"

# ------------------------------------------------------------------------------- engine access

_client_lock = threading.Lock()
_client: Any = None
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_probe: bool | None = None
_storage_opt_ok: bool | None = None  # whether the engine accepts storage_opt size (None: not tried yet)


def _docker():
    try:
        import docker
    except ImportError as e:
        raise ResourceUnavailable("the docker backend needs docker-py: pip install 'agentfly-gym[docker]'") from e
    return docker


def _get_client() -> Any:
    """The process-wide docker-py client (created on first use, 64 pooled connections)."""
    global _client
    with _client_lock:
        if _client is None:
            docker = _docker()
            try:
                _client = docker.from_env(timeout=120, max_pool_size=64)
            except docker.errors.DockerException as e:
                raise ResourceUnavailable(f"no Docker engine configured here: {e}") from e
        return _client


def _docker_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _client_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="afg-docker")
        return _pool


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_docker_pool(), lambda: fn(*args))


def docker_available(*, refresh: bool = False) -> bool:
    """Whether a Docker engine answers a ping (cached per process; ``refresh=True`` probes again).

    Blocking, at most ~3 seconds.  Never raises.
    """
    global _probe
    if _probe is not None and not refresh:
        return _probe
    try:
        docker = _docker()
        c = docker.from_env(timeout=3)
        try:
            ok = bool(c.ping())
        finally:
            c.close()
    except Exception:
        ok = False
    _probe = ok
    return ok


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
        return data.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


# ------------------------------------------------------------------------------- live registry

_live_lock = threading.Lock()
_live: dict[str, DockerContainer] = {}
_prev_handlers: dict[int, Any] = {}


def _terminate_all_sync() -> None:
    """Remove every container of this process now, in parallel (signal handler, best effort)."""
    with _live_lock:
        boxes = list(_live.values())
    if not boxes:
        return
    threads = [threading.Thread(target=b.terminate_sync, daemon=True) for b in boxes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)


def _on_signal(signum: int, frame: Any) -> None:
    _terminate_all_sync()
    prev = _prev_handlers.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or None: set outside Python): let the default action happen
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_signal_handlers() -> bool:
    """Install the SIGINT/SIGTERM handlers that remove this process's containers, once.

    Each handler removes the live containers, then chains to the handler that was installed
    before (Python's ``KeyboardInterrupt`` for SIGINT; the default action, process exit, for a
    default SIGTERM).  Python lets only the main thread install handlers: called from another
    thread this does nothing and returns ``False`` (the ``atexit`` hook and :func:`reap_orphans`
    still clean up).  Applications driving containers from a background loop can call it from
    their main thread.

    Returns:
        Whether the handlers are installed now.
    """
    if threading.current_thread() is not threading.main_thread():
        return all(signal.getsignal(s) is _on_signal for s in (signal.SIGINT, signal.SIGTERM)) \
            if _prev_handlers else False
    for sig in (signal.SIGINT, signal.SIGTERM):
        cur = signal.getsignal(sig)
        if cur is _on_signal:
            continue
        _prev_handlers[sig] = cur
        signal.signal(sig, _on_signal)
    return True


# ------------------------------------------------------------------------------- disk watchdog

_watched: dict[str, DockerContainer] = {}  # container id -> instance whose disk limit the watchdog holds
_watch_thread: threading.Thread | None = None


def _tree_bytes(root: str, stop_at: int) -> int:
    """Bytes allocated below ``root`` (``st_blocks * 512``, hard links once), stopping past ``stop_at``."""
    total, seen = 0, set()
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
        if total > stop_at:
            break
    return total


def _watch(box: DockerContainer) -> None:
    """Hold ``box``'s disk limit from the host (engines without ``storage_opt size``)."""
    global _watch_thread
    with _live_lock:
        if box.container_id:
            _watched[box.container_id] = box
        if _watch_thread is None or not _watch_thread.is_alive():
            _watch_thread = threading.Thread(target=_watch_loop, name="afg-docker-disk", daemon=True)
            _watch_thread.start()


def _watch_loop() -> None:
    while True:
        time.sleep(DISK_POLL)
        with _live_lock:
            items = list(_watched.items())
        for cid, box in items:
            if box.container_id != cid or box._upper_dir is None or box.spec.disk is None:
                with _live_lock:
                    _watched.pop(cid, None)
                continue
            used = _tree_bytes(box._upper_dir, box.spec.disk)
            if used > box.spec.disk:
                box._death_reason = (f"its disk limit of {box.spec.disk} bytes was exceeded "
                                     f"(writable layer at {used} bytes or more)")
                log.warning("%s: %s; killing the container", box.id, box._death_reason)
                with contextlib.suppress(Exception):
                    _get_client().api.kill(cid)
                with _live_lock:
                    _watched.pop(cid, None)


# ------------------------------------------------------------------------------- shell scripts

# Run as root right after start: reports the tools present and the user's uid/gid.
_SETUP = r"""
if command -v timeout >/dev/null 2>&1; then echo timeout=1; else echo timeout=0; fi
if [ -n "${AFG_USER:-}" ]; then echo "uid=$(id -u "$AFG_USER")"; echo "gid=$(id -g "$AFG_USER")"; fi
echo setup-ok
"""

# Kill every process whose environment holds the exec marker (host-side backstop of exec timeouts).
_KILL_MARKED = r"""
for n in 1 2 3; do
  for d in /proc/[0-9]*; do
    grep -qz "^$1\$" "$d/environ" 2>/dev/null && kill -s KILL "${d#/proc/}" 2>/dev/null
  done
done
exit 0
"""


# ------------------------------------------------------------------------------- exec output

_FRAME_HEADER = struct.Struct(">BxxxL")  # stream type (0 stdin, 1 stdout, 2 stderr), 3 zero bytes, payload size


def _exec_start_frames(api: Any, exec_id: str) -> Iterator[bytes]:
    """Start an exec (attached, no TTY) and yield its output frames' payloads, stdout and stderr interleaved.

    docker-py's ``exec_start(stream=True)`` reads the upgraded connection from the raw socket
    (``response.raw._fp.fp.raw``), which skips whatever ``http.client`` already buffered while reading
    the response headers.  When a command's output arrives in the same read as the headers (a fast
    command on a loaded machine) it is silently lost: the exec reports exit 0 with empty output
    (docker/docker-py issues 425 and 3332; measured here: 28-35 of 1,500 execs of ``echo`` under CPU
    load).  This reads the same connection through its buffered reader instead, so nothing is skipped.
    The stream format is the Docker Engine API's multiplexed stream ("Attach to a container",
    stream format: an 8-byte header ``[type, 0, 0, 0, size (big-endian uint32)]`` then ``size`` bytes).

    Raises:
        docker.errors.APIError / NotFound: as ``exec_start`` (the exec or container is gone).
    """
    res = api._post_json(api._url("/exec/{0}/start", exec_id), headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                         data={"Tty": False, "Detach": False}, stream=True)
    try:
        api._raise_for_status(res)
        reader = res.raw._fp.fp  # the BufferedReader over the upgraded socket (docker-py takes its .raw)
        # a command may stay silent for longer than the client's request timeout: block like docker-py's
        # poll()-based reads do (the exec's own timeout, or a cancellation, ends the stream)
        reader.raw._sock.settimeout(None)
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
        res.close()


# ------------------------------------------------------------------------------- output capping

class _OutputBuffer:
    """Keeps the head and the tail of a byte stream within a bounded memory."""

    def __init__(self, max_chars: int) -> None:
        self.cap = max(4 * max_chars, 64)  # bytes: a UTF-8 character is at most 4 bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            extra = len(self.tail) - self.cap
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def text(self, max_chars: int) -> tuple[str, bool]:
        """The kept output as at most ``max_chars`` characters, and whether it was cut.

        When bytes were dropped from the middle, their count stands in for the characters cut.
        """
        if not self.dropped:
            full = bytes(self.head + self.tail).decode("utf-8", errors="replace")
            if len(full) <= max_chars:
                return full, False
            head_t = tail_t = full
            total = len(full)
        else:
            head_t = self.head.decode("utf-8", errors="replace")
            tail_t = self.tail.decode("utf-8", errors="replace").lstrip("\ufffd")
            total = len(head_t) + self.dropped + len(tail_t)
        marker_len = len(_MARKER.format(n=total))
        if max_chars <= marker_len:
            return head_t[:max_chars], True
        keep = max_chars - marker_len
        h, t = keep // 2, keep - keep // 2
        return head_t[:h] + _MARKER.format(n=total - h - t) + tail_t[len(tail_t) - t:], True


# ------------------------------------------------------------------------------- published ports

def _port_bindings(ports: Sequence[int]) -> dict[str, tuple[str]] | None:
    """docker-py's ``port_bindings`` for ``ContainerSpec.ports``: each TCP port on 127.0.0.1, host port
    left to the engine (``("127.0.0.1",)``), so pooled containers never collide and nothing listens
    beyond loopback."""
    return {f"{p}/tcp": ("127.0.0.1",) for p in ports} or None


def _read_published_ports(api: Any, cid: str, ports: Sequence[int]) -> dict[int, tuple[str, int]]:
    """Container port -> ``("127.0.0.1", host port)`` as the engine published them (``NetworkSettings.Ports``).

    The engine fills the bindings once the container runs; read a few times in case it lags.

    Raises:
        ResourceStartError: a port has no binding on 127.0.0.1 (the container stopped at once, or the
            engine refused to publish it).
    """
    if not ports:
        return {}
    found: dict[str, Any] = {}
    for _ in range(50):
        try:
            found = (api.inspect_container(cid).get("NetworkSettings") or {}).get("Ports") or {}
        except Exception as e:  # noqa: BLE001  (reported below with what was found)
            found = {"error": str(e)}
        if all(found.get(f"{p}/tcp") for p in ports):
            break
        time.sleep(0.1)
    out: dict[int, tuple[str, int]] = {}
    for p in ports:
        bound = [b for b in found.get(f"{p}/tcp") or () if b.get("HostIp") == "127.0.0.1" and b.get("HostPort")]
        if not bound:
            raise ResourceStartError(f"container {cid[:12]}: port {p}/tcp was not published on 127.0.0.1 "
                                     f"(engine reports {found!r}); has the container exited?")
        out[p] = ("127.0.0.1", int(bound[0]["HostPort"]))
    return out


# ------------------------------------------------------------------------------- the container

class DockerContainer(ContainerResource):
    """One Docker container for a :class:`ContainerSpec`, labelled with its manager's id.

    Lifecycle (all blocking engine calls run on a thread pool):

    * ``start()``: checks the image exists locally (images named ``agentfly/...`` are never pulled;
      others are pulled once), creates and starts the container with the spec's limits (see the
      module docstring), then runs a setup step that checks the tools and the spec's user.
    * ``park()`` (the pool keeps the instance idle): removes the container, with every process of
      the episode, and starts a fresh one in its place in the background.
    * ``reset()``: waits for that fresh container, or makes one now (an instance handed straight to
      a waiter, or used since): the whole writable file system and every process are as right
      after ``start()``, whatever the episode wrote (``spec.reset_paths`` is not needed).  Raises
      :class:`~agentfly_gym.errors.ResourceError` if it fails, so the pool replaces the instance.
    * ``status()``: ``UNHEALTHY`` when the container is gone, not running, was OOM-killed or went
      past its disk limit.
    * ``release()``: ``docker rm -f``; idempotent, never raises.
    """

    backend_name = "docker"

    def __init__(self, spec: ContainerSpec, manager_id: str) -> None:
        pid = os.getpid()
        labels = {
            _LABEL: "1",
            f"{_LABEL}.manager": manager_id,
            f"{_LABEL}.pool": spec.key,
            f"{_LABEL}.pid": str(pid),
            f"{_LABEL}.pid_start": _proc_start(pid) or "",
            f"{_LABEL}.host": socket.gethostname(),
        }
        super().__init__(spec, labels=labels)
        self.spec: ContainerSpec = spec
        self.name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"{manager_id}-{self.id}")
        self.container_id: str | None = None
        self._lock = threading.Lock()
        self._released = False
        self._has_timeout = True
        self._owner: tuple[int, int] = (0, 0)
        self.start_duration: float | None = None
        self.last_reset_time: float | None = None
        self._generation = 0
        self._fresh = False              # no exec or file write since the container was made
        self._park_future: concurrent.futures.Future | None = None
        self.disk_mode: str | None = None  # "storage-opt", "watchdog", "fsize" or None (no limit)
        self._upper_dir: str | None = None
        self._death_reason: str | None = None
        self.published_ports: dict[int, tuple[str, int]] = {}

    # -- lifecycle
    async def start(self) -> None:
        self._status = ResourceStatus.STARTING
        install_signal_handlers()
        t0 = time.monotonic()
        try:
            await _in_thread(self._start_sync)
        except BaseException:
            self._status = ResourceStatus.UNHEALTHY
            raise
        self.start_duration = time.monotonic() - t0
        self._status = ResourceStatus.READY

    def _start_sync(self) -> None:
        global _storage_opt_ok
        docker = _docker()
        client = _get_client()
        api = client.api
        spec = self.spec
        self._death_reason = None
        self._upper_dir = None
        try:
            api.inspect_image(spec.image)
        except docker.errors.ImageNotFound:
            if spec.image.startswith("agentfly/"):
                raise ResourceStartError(
                    f"image {spec.image!r} is not built here; build it with `agentfly-gym images build` "
                    "(agentfly_gym.images.build_image) first") from None
            try:
                client.images.pull(spec.image)
            except docker.errors.APIError as e:
                raise ResourceStartError(f"image {spec.image!r} is not here and pulling it failed: {e}") from e
        except docker.errors.APIError as e:
            raise ResourceStartError(f"docker engine error looking up image {spec.image!r}: {e}") from e
        def host_config(storage_opt: bool) -> Any:
            extra: dict[str, Any] = {}
            if spec.disk and storage_opt:
                extra["storage_opt"] = {"size": str(spec.disk)}
            elif spec.disk:
                extra["ulimits"] = [docker.types.Ulimit(name="fsize", soft=spec.disk, hard=spec.disk)]
            return api.create_host_config(
                nano_cpus=int(spec.cpus * 1e9),
                mem_limit=spec.memory,
                memswap_limit=spec.memory,
                pids_limit=spec.pids,
                network_mode="bridge" if spec.network else "none",
                security_opt=["no-new-privileges"],
                cap_drop=["ALL"],
                cap_add=list(CAP_ADD),
                binds={m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts} or None,
                init=True,
                port_bindings=_port_bindings(spec.ports),
                **extra,
            )

        env = {k: v for k, v in spec.env} if spec.env else {}
        self._generation += 1
        name = self.name if self._generation == 1 else f"{self.name}-{self._generation}"

        def create(storage_opt: bool) -> dict[str, Any]:
            return api.create_container(
                spec.image, command=list(spec.command), name=name, labels=self.labels, environment=env or None,
                working_dir=spec.workdir or None, user=spec.user or None, host_config=host_config(storage_opt),
                hostname="agentfly", detach=True, tty=False, stdin_open=False, ports=list(spec.ports) or None)

        use_opt = bool(spec.disk) and _storage_opt_ok is not False
        try:
            try:
                created = create(use_opt)
            except docker.errors.APIError as e:
                if not use_opt or not re.search(r"storage.?opt|quota|not supported", str(e.explanation or e), re.I):
                    raise
                log.info("the Docker engine cannot limit a container's disk (%s); using RLIMIT_FSIZE and a watchdog",
                         e.explanation or e)
                _storage_opt_ok, use_opt = False, False
                created = create(False)
            else:
                if use_opt:
                    _storage_opt_ok = True
        except docker.errors.APIError as e:
            raise ResourceStartError(f"creating a container of {spec.image!r} failed: {e.explanation or e}") from e
        cid = created["Id"]
        if spec.disk and not use_opt:
            try:
                upper = (api.inspect_container(cid).get("GraphDriver") or {}).get("Data", {}).get("UpperDir")
            except docker.errors.APIError:
                upper = None
            self._upper_dir = upper if upper and os.path.isdir(upper) else None
            self.disk_mode = "watchdog" if self._upper_dir else "fsize"
        else:
            self.disk_mode = "storage-opt" if spec.disk else None
        with self._lock:
            if self._released:  # released (e.g. start timeout) while the engine was creating it
                self._remove_sync(cid)
                raise ResourceStartError(f"{self.id} was released during start")
            self.container_id = cid
            with _live_lock:
                _live[cid] = self
        try:
            api.start(cid)
        except docker.errors.APIError as e:
            raise ResourceStartError(f"starting a container of {spec.image!r} failed: {e.explanation or e}") from e
        self.published_ports = _read_published_ports(api, cid, spec.ports)
        res = self._exec_sync(["/bin/sh", "-c", _SETUP, "sh"], timeout=120, workdir="/",
                              env={"AFG_USER": spec.user} if spec.user else None, user="root",
                              max_output=10_000, use_timeout=False)
        if res.exit_code != 0 or "setup-ok" not in res.output:
            raise ResourceStartError(
                f"{self.id}: setting up the container of {spec.image!r} failed (exit {res.exit_code}); "
                f"the image needs /bin/sh, cp and timeout: {res.output[-2000:]}")
        info = dict(line.split("=", 1) for line in res.output.splitlines() if "=" in line)
        self._has_timeout = info.get("timeout") == "1"
        if "uid" in info:
            try:
                self._owner = (int(info["uid"]), int(info["gid"]))
            except (KeyError, ValueError):
                raise ResourceStartError(f"{self.id}: user {spec.user!r} does not exist in {spec.image!r}") from None
        if self.disk_mode == "watchdog":
            _watch(self)
        self._fresh = True

    def _replace_sync(self) -> None:
        """Remove the current container (every process with it) and make a fresh one in its place."""
        with self._lock:
            if self._released:
                raise ResourceDied(f"{self.id} was released")
            cid, self.container_id = self.container_id, None
            self._fresh = False
            self.published_ports = {}
        if cid is not None:
            with _live_lock:
                _live.pop(cid, None)
            self._remove_sync(cid)
        self._start_sync()

    async def park(self) -> None:
        """The pool keeps this instance idle: end the episode's processes now, get a fresh container ready.

        Never raises; a failure shows in the next :meth:`reset`.
        """
        if self._released or self._park_future is not None or self._fresh:
            return
        fut = _docker_pool().submit(self._replace_sync)
        self._park_future = fut
        with contextlib.suppress(BaseException):
            await asyncio.shield(asyncio.wrap_future(fut))

    async def reset(self) -> None:
        """Make this instance a fresh container of its spec (see the class docstring).

        Raises:
            ResourceDied: released.
            ResourceError / ResourceStartError: the fresh container could not be made.
        """
        if self._released:
            raise ResourceDied(f"{self.id} is not running")
        t0 = time.monotonic()
        fut, self._park_future = self._park_future, None
        try:
            if fut is not None:
                await asyncio.shield(asyncio.wrap_future(fut))
            if not self._fresh or self.container_id is None:
                await asyncio.shield(_in_thread(self._replace_sync))
        except ResourceError:
            self._status = ResourceStatus.UNHEALTHY
            raise
        except Exception as e:
            self._status = ResourceStatus.UNHEALTHY
            raise ResourceError(f"{self.id}: reset failed: {e}") from e
        self._status = ResourceStatus.READY
        self.last_reset_time = time.monotonic() - t0

    async def status(self) -> ResourceStatus:
        if self._status in (ResourceStatus.STOPPED, ResourceStatus.CREATED, ResourceStatus.STARTING):
            return self._status
        if self._park_future is not None:  # being replaced by a fresh container: reset() tells
            return self._status
        if self._death_reason is not None:
            self._status = ResourceStatus.UNHEALTHY
            return self._status
        if self.container_id is None:
            self._status = ResourceStatus.UNHEALTHY
            return self._status
        try:
            state = await _in_thread(self._state_sync)
        except Exception:
            state = None
        if state is None or state.get("Status") != "running" or state.get("OOMKilled"):
            self._status = ResourceStatus.UNHEALTHY
        return self._status

    def _state_sync(self) -> dict[str, Any] | None:
        docker = _docker()
        try:
            return _get_client().api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return None

    async def release(self) -> None:
        fut = self._park_future
        if fut is not None:  # let a replacement in flight finish, so its container is removed too
            with contextlib.suppress(BaseException):
                await asyncio.shield(asyncio.wrap_future(fut))
        try:
            await _in_thread(self.terminate_sync)
        except Exception:  # never raises
            log.warning("releasing %r failed", self, exc_info=True)

    def terminate_sync(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            cid, self.container_id = self.container_id, None
            self.published_ports = {}
        self._status = ResourceStatus.STOPPED
        if cid is not None:
            self._remove_sync(cid)
            with _live_lock:
                _live.pop(cid, None)

    @staticmethod
    def _remove_sync(cid: str) -> None:
        try:
            _get_client().api.remove_container(cid, force=True, v=True)
        except Exception as e:
            if type(e).__name__ != "NotFound":
                log.warning("removing container %s failed: %s", cid[:12], e)

    # -- the container API
    async def exec(self, cmd: str | list[str], *, timeout: float = 60.0, workdir: str | None = None,
                   env: dict[str, str] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                   user: str | None = None) -> ExecResult:
        """Run ``cmd`` in the container (see :meth:`ContainerResource.exec`).

        The command runs under ``timeout -s KILL <timeout>``, which kills its whole process group
        at the deadline (``exit_code=-1``, ``timed_out=True``); then every process that carries
        this exec's marker variable ``AGENTFLY_EXEC`` (descendants that left the group, e.g. via
        ``setsid``) is killed too.  The same marker kill is the backstop when the exec has not
        returned 5 seconds after the deadline, and runs when the awaiting task is cancelled.
        Background processes of a command that finished in time keep running (a server started
        by one call can serve the next); ``reset()`` kills them.  Output is read incrementally and
        only its head and tail are kept, so memory stays bounded.

        Raises:
            ConfigError: ``timeout`` or ``max_output`` is not positive, or ``cmd`` is empty.
            ResourceDied: the container is gone or not running.
        """
        if not timeout or timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} must be > 0 seconds")
        if max_output < 1:
            raise ConfigError(f"max_output={max_output!r} must be >= 1 character")
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv or (isinstance(cmd, str) and not cmd.strip()):
            raise ConfigError("cmd must be a non-empty shell string or argv list")
        return await self._exec_async(argv, timeout=timeout, workdir=workdir, env=env, user=user,
                                      max_output=max_output, use_timeout=True)

    async def _exec_async(self, argv: list[str], *, timeout: float, workdir: str | None, env: dict[str, str] | None,
                          user: str | None, max_output: int, use_timeout: bool) -> ExecResult:
        mark = f"{_EXEC_MARK}={uuid.uuid4().hex}"
        fut = asyncio.get_running_loop().run_in_executor(
            _docker_pool(), lambda: self._exec_sync(argv, timeout=timeout, workdir=workdir, env=env, user=user,
                                                    max_output=max_output, use_timeout=use_timeout, mark=mark))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout + _KILL_GRACE)
        except TimeoutError:
            log.warning("%s: exec still running %.0fs past its timeout; killing it", self.id, _KILL_GRACE)
            await _in_thread(self._kill_marked_sync, mark)
            try:
                return await asyncio.wait_for(asyncio.shield(fut), 10)
            except TimeoutError:
                log.warning("%s: exec did not end after the kill; abandoning its output", self.id)
                return ExecResult(exit_code=-1, output="", timed_out=True, duration=timeout + _KILL_GRACE + 10)
        except asyncio.CancelledError:
            # the caller gave up: kill the command instead of leaving it running
            _docker_pool().submit(self._kill_marked_sync, mark)
            raise

    def _kill_marked_sync(self, mark: str) -> None:
        cid = self.container_id
        if cid is None:
            return
        try:
            api = _get_client().api
            eid = api.exec_create(cid, ["/bin/sh", "-c", _KILL_MARKED, "sh", mark], user="root")["Id"]
            api.exec_start(eid)
        except Exception:
            log.debug("killing marked processes in %s failed", self.id, exc_info=True)

    def _exec_sync(self, argv: list[str], *, timeout: float, workdir: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None,
                   max_output: int = DEFAULT_MAX_OUTPUT, use_timeout: bool = True,
                   mark: str | None = None) -> ExecResult:
        docker = _docker()
        cid = self.container_id
        if cid is None:
            raise ResourceDied(f"{self.id} was released")
        if self._death_reason is not None:
            raise ResourceDied(f"{self.id}: {self._death_reason}")
        self._fresh = False
        api = _get_client().api
        environment = dict(env or {})
        if mark:
            k, _, v = mark.partition("=")
            environment[k] = v
        if use_timeout and self._has_timeout:
            argv = ["timeout", "-s", "KILL", f"{timeout:.3f}", *argv]
        t0 = time.monotonic()
        buf = _OutputBuffer(max_output)
        try:
            eid = api.exec_create(cid, argv, stdout=True, stderr=True, user=user or self.spec.user or "",
                                  environment=environment or None, workdir=workdir or self.spec.workdir or None)["Id"]
            for chunk in _exec_start_frames(api, eid):
                buf.feed(chunk)
            code = api.exec_inspect(eid).get("ExitCode")
        except docker.errors.NotFound as e:
            raise ResourceDied(f"{self.id}: the container is gone ({e.explanation or e})") from e
        except docker.errors.APIError as e:
            if e.status_code == 409 or "not running" in str(e):
                raise ResourceDied(f"{self.id}: the container is not running ({e.explanation or e})") from e
            raise ResourceError(f"{self.id}: exec failed: {e.explanation or e}") from e
        duration = time.monotonic() - t0
        if self._death_reason is not None:  # the disk watchdog killed the container meanwhile
            raise ResourceDied(f"{self.id}: {self._death_reason}")
        text, truncated = buf.text(max_output)
        timed_out = use_timeout and code in (124, 137) and duration >= timeout
        if timed_out and mark:  # descendants that left the process group (setsid) die too
            self._kill_marked_sync(mark)
        if code is None or (code == 137 and not timed_out):
            # cut off or SIGKILLed: if the container itself is gone (killed from outside, OOM), say so, so the
            # env ends the episode with an error instead of showing the agent "exit 137"
            running = True
            for _ in range(20):  # the engine marks a killed container stopped a moment after its execs end
                try:
                    running = api.inspect_container(cid).get("State", {}).get("Running", False)
                except docker.errors.NotFound:
                    running = False
                except docker.errors.APIError:
                    break
                if not running:
                    break
                time.sleep(0.1)
            if not running:
                why = f": {self._death_reason}" if self._death_reason else ""
                raise ResourceDied(f"{self.id}: the container stopped during the command (exit {code}){why}")
        if code is None:
            code = -1
        return ExecResult(exit_code=-1 if timed_out else int(code), output=text, timed_out=timed_out,
                          truncated=truncated, duration=duration)

    async def put_files(self, files: dict[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write files into the container with one tar upload (see :meth:`ContainerResource.put_files`).

        Files are owned by the spec's user (root when ``spec.user`` is empty).  Missing parent
        folders are created by that user where it may (one extra ``exec`` when ``spec.user`` is
        set), else by the engine (owned by root, mode 755).

        Raises:
            ConfigError: a path is not absolute or contains ``..``.
            ResourceDied: the container is gone.
            ResourceError: the engine refused the upload (e.g. a read-only mount).
        """
        data = io.BytesIO()
        now = time.time()
        with tarfile.open(fileobj=data, mode="w") as tar:
            for path, content in files.items():
                if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
                    raise ConfigError(f"file path {path!r} must be absolute and must not contain '..'")
                raw = content.encode() if isinstance(content, str) else bytes(content)
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode, info.mtime = len(raw), mode, now
                info.uid, info.gid = self._owner
                tar.addfile(info, io.BytesIO(raw))
        if self._owner != (0, 0):
            parents = sorted({p.rsplit("/", 1)[0] or "/" for p in files})
            await self._exec_async(["/bin/sh", "-c", 'mkdir -p -- "$@" 2>/dev/null; exit 0', "sh", *parents],
                                   timeout=30, workdir="/", env=None, user=None, max_output=1000, use_timeout=False)
        await _in_thread(self._put_sync, data.getvalue())

    def _put_sync(self, payload: bytes) -> None:
        docker = _docker()
        cid = self._require_cid()
        self._fresh = False
        try:
            _get_client().api.put_archive(cid, "/", payload)
        except docker.errors.NotFound as e:
            raise ResourceDied(f"{self.id}: the container is gone") from e
        except docker.errors.APIError as e:
            raise ResourceError(f"{self.id}: writing files failed: {e.explanation or e}") from e

    async def get_file(self, path: str, *, max_bytes: int = 10_000_000) -> bytes:
        """Read one file (symbolic links followed) from the container.

        Raises:
            FileNotFoundError: no such file.
            IsADirectoryError: ``path`` is a folder.
            ResourceError: the file is larger than ``max_bytes``.
            ResourceDied: the container is gone.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"file path {path!r} must be absolute")
        return await _in_thread(self._get_sync, path, max_bytes)

    def _get_sync(self, path: str, max_bytes: int, depth: int = 0) -> bytes:
        docker = _docker()
        cid = self._require_cid()
        api = _get_client().api
        try:
            stream, stat = api.get_archive(cid, path)
        except docker.errors.NotFound as e:
            if self._state_sync() is None:
                raise ResourceDied(f"{self.id}: the container is gone") from e
            raise FileNotFoundError(f"{path}: no such file in container {self.id}") from None
        except docker.errors.APIError as e:
            raise ResourceError(f"{self.id}: reading {path} failed: {e.explanation or e}") from e
        link = stat.get("linkTarget") or ""
        if link and depth < 8:
            for _ in stream:
                pass
            target = link if link.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(path), link))
            return self._get_sync(target, max_bytes, depth + 1)
        if stat.get("mode", 0) & (1 << 31):  # Go's os.ModeDir
            for _ in stream:
                pass
            raise IsADirectoryError(f"{path} is a folder in container {self.id}")
        if stat.get("size", 0) > max_bytes:
            for _ in stream:
                pass
            raise ResourceError(f"{path} is {stat['size']} bytes, more than max_bytes={max_bytes}")
        raw = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    assert f is not None
                    return f.read()
        raise FileNotFoundError(f"{path}: not a regular file in container {self.id}")

    def endpoint(self, port: int) -> tuple[str, int]:
        """``("127.0.0.1", host port)`` of container port ``port`` (see :meth:`ContainerResource.endpoint`).

        Whoever asks may change the container's state over the network, where no ``exec`` is seen:
        the container no longer counts as fresh, so ``park()``/``reset()`` replace it before reuse.
        """
        found = super().endpoint(port)
        self._fresh = False
        return found

    def _require_cid(self) -> str:
        cid = self.container_id
        if cid is None:
            raise ResourceDied(f"{self.id} was released")
        return cid

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(backend="docker", container=(self.container_id or "")[:12], name=self.name, image=self.spec.image,
                 ports={p: f"{h}:{hp}" for p, (h, hp) in self.published_ports.items()},
                 disk=self.spec.disk, limits_enforced={"disk": self.disk_mode}, last_reset_time=self.last_reset_time)
        return d


def create_docker(spec: ContainerSpec, manager: ResourceManager) -> DockerContainer:
    """An unstarted :class:`DockerContainer` for ``spec``, labelled with ``manager.id``.

    Raises:
        ResourceUnavailable: docker-py is not installed.
    """
    _docker()
    return DockerContainer(spec, manager.id)


# ------------------------------------------------------------------------------- orphans

_MANAGER_PID = re.compile(r"^afg-(\d+)-[0-9a-f]+$")


def _owner_dead(labels: dict[str, str], host: str) -> bool:
    """Whether the process that labelled a container is gone (never guesses across hosts)."""
    if labels.get(f"{_LABEL}.host", host) != host:
        return False
    pid_s = labels.get(f"{_LABEL}.pid")
    if not pid_s:
        m = _MANAGER_PID.match(labels.get(f"{_LABEL}.manager", ""))
        if not m:
            return False  # a custom manager id with no pid: only reaped by manager_id
        pid_s = m.group(1)
    try:
        pid = int(pid_s)
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OSError):
        return False
    start = labels.get(f"{_LABEL}.pid_start")
    return bool(start) and _proc_start(pid) not in (None, start)  # the pid was reused by another process


def reap_orphans(manager_id: str | None = None, *, older_than: float = 0, dry_run: bool = False) -> list[str]:
    """Remove containers labelled ``agentfly=1`` whose manager is gone (or is ``manager_id``).

    A container is an orphan when its owning process (label ``agentfly.pid``, else the pid embedded
    in a manager id ``"afg-<pid>-<hex>"``) no longer exists on this host or its pid now belongs to
    a process started later.  Containers of live processes, of other hosts sharing the engine, and
    of custom manager ids without a pid are left alone unless ``manager_id`` names them.

    Args:
        manager_id: remove this manager's containers (alive or not) instead of the dead ones.
        older_than: only containers created at least this many seconds ago.
        dry_run: list what would be removed without removing it.

    Returns:
        The 12-hex-digit ids of the containers removed (or that would be).

    Raises:
        ResourceUnavailable: no Docker engine answers.
    """
    docker = _docker()
    try:
        api = _get_client().api
        found = api.containers(all=True, filters={"label": f"{_LABEL}=1"})
    except docker.errors.DockerException as e:
        raise ResourceUnavailable(f"no Docker engine answers: {e}") from e
    host = socket.gethostname()
    now = time.time()
    removed: list[str] = []
    for c in found:
        labels = c.get("Labels") or {}
        if older_than and now - float(c.get("Created", now)) < older_than:
            continue
        if manager_id is not None:
            if labels.get(f"{_LABEL}.manager") != manager_id:
                continue
        elif not _owner_dead(labels, host):
            continue
        cid = c["Id"][:12]
        if not dry_run:
            try:
                api.remove_container(c["Id"], force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                log.warning("removing orphan container %s failed: %s", cid, e)
                continue
        removed.append(cid)
    if removed:
        log.info("%s %d orphan container(s): %s", "would remove" if dry_run else "removed", len(removed), removed)
    return removed


def gc_main(args: Sequence[str] | None = None) -> int:
    """``agentfly-gym resources gc [--manager ID] [--older-than SECONDS] [--dry-run]``.

    Prints one removed container id per line.  Returns 0 on success, 1 when no Docker engine answers.
    """
    parser = argparse.ArgumentParser(prog="agentfly-gym resources gc",
                                     description="Remove agentfly containers whose manager process has died.")
    parser.add_argument("--manager", default=None, help="remove this manager id's containers, alive or not")
    parser.add_argument("--older-than", type=float, default=0.0, metavar="SECONDS",
                        help="only containers created at least this long ago")
    parser.add_argument("--dry-run", action="store_true", help="list, do not remove")
    ns = parser.parse_args(list(args) if args is not None else None)
    try:
        ids = reap_orphans(ns.manager, older_than=ns.older_than, dry_run=ns.dry_run)
    except ResourceUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for cid in ids:
        print(cid)
    print(f"{'would remove' if ns.dry_run else 'removed'} {len(ids)} container(s)", file=sys.stderr)
    return 0

