"""The Docker container resource: :class:`DockerContainer` and the backend's ``create(spec, labels)``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ....errors import (
    ResourceDied,
    ResourceError,
    ResourceStartError,
)
from ...base import ResourceStatus
from ..api import ContainerResource, mount_sources
from ..ownership import LABEL, owner_labels
from ...spec import ContainerSpec
from .disk import UpperDir, layer_dir, mount_layer_volume, overlay_paths
from .engine import DockerEngine, docker_module
from .etc_hosts import hosts_mount, hosts_source
from .commands import DockerExec
from .files import DockerFiles
from .ports import port_bindings, read_published_ports

__all__ = ["CAP_ADD", "DockerContainer", "create"]

log = logging.getLogger(__name__)

CAP_ADD: tuple[str, ...] = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
"""Capabilities added back after ``cap_drop=["ALL"]``: what root inside needs for ordinary tools
(``cp -a``/``chown``/``chmod`` of others' files, ``kill`` of other users' processes, ``su``/``setpriv``
to drop to a user).  No ``NET_*``, ``SYS_*``, ``MKNOD`` or ``SETPCAP``; with ``no-new-privileges``
a non-root user cannot gain any of them."""

_STATE_DIR = "/.agentfly"

LOG_MAX_SIZE = "1m"
"""Cap of a container's log (what its main process writes to stdout/stderr, e.g. ``> /proc/1/fd/1``):
the ``json-file`` driver keeps at most this much in its current file plus one rotated file, so the
engine never holds more than about 2 MB of it on the host, however much the container writes."""

# ------------------------------------------------------------------------------- shell scripts

# Run as root right after start: reports the tools present and the user's uid/gid.
_SETUP = r"""
if command -v timeout >/dev/null 2>&1; then echo timeout=1; else echo timeout=0; fi
if [ -n "${AFG_USER:-}" ]; then echo "uid=$(id -u "$AFG_USER")"; echo "gid=$(id -g "$AFG_USER")"; fi
echo setup-ok
"""



# ------------------------------------------------------------------------------- the container



class DockerContainer(DockerExec, DockerFiles, ContainerResource):
    """One Docker container for a :class:`ContainerSpec`, labelled with its manager's id.

    Lifecycle (all blocking engine calls run on a thread pool):

    * ``start()``: checks the image exists locally (images named ``agentfly/...`` are never pulled;
      others are pulled once), creates and starts the container with the spec's limits (see the
      module docstring), then runs a setup step that checks the tools and the spec's user.
    * ``park()`` (the pool keeps the instance idle): makes the container fresh in the background: every
      process of the episode ends and the whole writable file system is as right after ``start()``.  Where
      this process is root beside a local overlay2 engine (it sees the engine's mounts) the same container
      is killed, its writable layer emptied while unmounted and started again (about 0.2 s on an idle
      machine, against 0.4 s or more for a new container with its disk volume); elsewhere it is removed and
      a new one started in its place.  ``restarts_in_place`` counts the former.
    * ``reset()``: waits for that, or does it now (an instance handed straight to a waiter, or used
      since): the whole writable file system and every process are as right after ``start()``,
      whatever the episode wrote.  Raises
      :class:`~agentfly_gym.errors.ResourceError` if it fails, so the pool replaces the instance.
    * ``status()``: ``UNHEALTHY`` when the container is gone, not running (OOM-killed, killed from outside) or
      went past its disk limit.
    * ``adestroy()`` (and its synchronous twin ``destroy()``): ``docker rm -f``; idempotent, never raises.
    """

    backend_name = "docker"

    def __init__(self, spec: ContainerSpec, *, labels: dict[str, str] | None = None) -> None:
        # without a manager's labels (a container made by hand) this process is still named as owner
        labels = {**owner_labels(f"afg-{os.getpid()}-{uuid.uuid4().hex[:8]}"), f"{LABEL}.pool": spec.key,
                  **(labels or {})}
        super().__init__(spec, labels=labels)
        self.spec: ContainerSpec = spec
        self.name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"{labels[f'{LABEL}.manager']}-{self.id}")
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
        self._park_kill: concurrent.futures.Future | None = None
        self.disk_mode: str | None = None  # "storage-opt", "watchdog", "fsize" or None (no limit)
        self._upper_dir: str | None = None
        self._layer: tuple[UpperDir, str] | None = None  # (upper, merged folder) when restartable in place
        self._log_path: str | None = None  # the engine's json-file log of the container, once started (emptied
        # on a restart in place)
        self.restarts_in_place = 0
        self._death_reason: str | None = None
        self.published_ports: dict[int, tuple[str, int]] = {}
        self._own_engine: DockerEngine | None = None  # made by hand (no manager's services): closed on release

    @property
    def upper_dir(self) -> str | None:
        """The host folder of the container's writable layer (overlay2), which the disk watchdog measures; None:
        not known (another storage driver, a remote engine) or no container."""
        return self._upper_dir

    def mark_dead(self, reason: str) -> None:
        """Record why the container is being killed from outside (the disk watchdog): every later call on it
        raises :class:`~agentfly_gym.errors.ResourceDied` with ``reason``, until it is replaced."""
        self._death_reason = reason

    @property
    def engine(self) -> DockerEngine:
        """The Docker engine access of the manager that built this container (client, thread pool, watchdog)."""
        if self.services is not None:
            return self.services.get(DockerEngine)
        if self._own_engine is None:
            self._own_engine = DockerEngine()
        return self._own_engine

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await self.engine.in_thread(fn, *args)

    # -- lifecycle
    async def start(self) -> None:
        """Create and start the container.

        Raises:
            ConfigError: a mount's source does not exist on the host or its target is not absolute (Docker's
                legacy ``binds`` would create a root-owned empty folder for a missing source).
            ResourceStartError, ResourceUnavailable: the image is missing or the engine refused.
        """
        mount_sources(self.spec)
        self._status = ResourceStatus.STARTING
        t0 = time.monotonic()
        try:
            await self._in_thread(self._start_sync)
        except BaseException:
            self._status = ResourceStatus.UNHEALTHY
            raise
        self.start_duration = time.monotonic() - t0
        self._status = ResourceStatus.READY

    def _start_sync(self) -> None:
        docker = docker_module()
        engine = self.engine
        client = engine.client()
        api = client.api
        spec = self.spec
        self._death_reason = None
        self._upper_dir = None
        image_id: str | None = None
        try:
            image_id = api.inspect_image(spec.image).get("Id")
        except docker.errors.ImageNotFound:
            if spec.image.startswith("agentfly/"):
                raise ResourceStartError(
                    f"image {spec.image!r} is not built here; build it with `agentfly-gym images build` "
                    "(agentfly_gym.images.build.build_image) first") from None
            try:
                client.images.pull(spec.image)
            except docker.errors.APIError as e:
                raise ResourceStartError(f"image {spec.image!r} is not here and pulling it failed: {e}") from e
        except docker.errors.APIError as e:
            raise ResourceStartError(f"docker engine error looking up image {spec.image!r}: {e}") from e
        def host_config(storage_opt: bool, net_off: bool) -> Any:
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
                network_mode="bridge" if spec.network else None if net_off else "none",
                security_opt=["no-new-privileges"],
                cap_drop=["ALL"],
                cap_add=list(CAP_ADD),
                # typed bind mounts: the engine refuses a missing source instead of creating it
                mounts=[docker.types.Mount(target=m.target, source=src, type="bind", read_only=m.read_only)
                        for m, src in zip(spec.mounts, mount_sources(spec))] + (hosts_mount(spec, hosts) if net_off else [])
                       or None,
                init=True,
                port_bindings=port_bindings(spec.ports),
                runtime=spec.runtime,
                log_config=docker.types.LogConfig(type="json-file", config={"max-size": LOG_MAX_SIZE, "max-file": "1"}),
                **extra,
            )

        env = {k: v for k, v in spec.env} if spec.env else {}
        self._generation += 1
        name = self.name if self._generation == 1 else f"{self.name}-{self._generation}"

        net_off = not spec.network and engine.hosts_bind_ok is not False
        hosts = hosts_source()  # the file bound as /etc/hosts when net_off

        def create(storage_opt: bool) -> dict[str, Any]:
            nonlocal net_off

            def call() -> dict[str, Any]:
                return api.create_container(
                    spec.image, command=list(spec.command), name=name, labels=self.labels, environment=env or None,
                    working_dir=spec.workdir or None, user=spec.user or None, host_config=host_config(storage_opt, net_off),
                    hostname="agentfly", detach=True, tty=False, stdin_open=False, ports=list(spec.ports) or None,
                    network_disabled=net_off)
            try:
                return call()
            except docker.errors.APIError as e:
                if not net_off or hosts not in str(e.explanation or e):
                    raise
                # an engine that cannot see this host's files (remote, or in a VM): the "none" network instead
                log.info("the Docker engine cannot bind %s (%s); containers without a network use --network none",
                         hosts, e.explanation or e)
                engine.hosts_bind_ok, net_off = False, False
                return call()

        # the kernel-enforced limit of disk and inodes (see .disk) where it can be had, else the engine's quota
        try_volume = bool(spec.disk) and os.geteuid() == 0 and engine.layer_volume_ok is not False
        use_opt = bool(spec.disk) and engine.storage_opt_ok is not False and not try_volume
        try:
            try:
                created = create(use_opt)
            except docker.errors.APIError as e:
                if not use_opt or not re.search(r"storage.?opt|quota|not supported", str(e.explanation or e), re.I):
                    raise
                log.info("the Docker engine cannot limit a container's disk (%s); using RLIMIT_FSIZE and a watchdog",
                         e.explanation or e)
                engine.storage_opt_ok, use_opt = False, False
                created = create(False)
            else:
                if use_opt:
                    engine.storage_opt_ok = True
        except docker.errors.APIError as e:
            raise ResourceStartError(f"creating a container of {spec.image!r} failed: {e.explanation or e}") from e
        cid = created["Id"]
        try:
            info = api.inspect_container(cid)
        except docker.errors.APIError:
            info = {}
        graph = info.get("GraphDriver") or {}
        volume = False
        layer: Path | None = None
        if try_volume:
            layer = layer_dir(graph)
            volume = layer is not None and mount_layer_volume(layer, spec.disk)
            if engine.layer_volume_ok is None or volume:
                engine.layer_volume_ok = volume
        self._layer = self._layer_paths(info, layer)
        if volume:
            self.disk_mode = "volume"
        elif spec.disk and not use_opt:
            upper = (graph.get("Data") or {}).get("UpperDir")
            self._upper_dir = upper if upper and os.path.isdir(upper) else None
            self.disk_mode = "watchdog" if self._upper_dir else "fsize"
        else:
            self.disk_mode = "storage-opt" if spec.disk else None
        with self._lock:
            if self._released:  # released (e.g. start timeout) while the engine was creating it
                self._remove_sync(cid)
                raise ResourceStartError(f"{self.id} was released during start")
            self.container_id = cid
        self._start_container(cid)
        # what the setup script learns depends only on the image and the user: asked once per pair (an exec
        # round trip per start saved), and again for an image that was not inspected
        setup_key = (image_id, spec.user) if image_id else None
        info = engine.image_facts.get(setup_key) if setup_key else None
        if info is None:
            res = self._exec_sync(["/bin/sh", "-c", _SETUP, "sh"], timeout=120, workdir="/",
                                  env={"AFG_USER": spec.user} if spec.user else None, user="root",
                                  max_output=10_000, use_timeout=False)
            if res.exit_code != 0 or "setup-ok" not in res.output:
                raise ResourceStartError(
                    f"{self.id}: setting up the container of {spec.image!r} failed (exit {res.exit_code}); "
                    f"the image needs /bin/sh, cp and timeout: {res.output[-2000:]}")
            info = dict(line.split("=", 1) for line in res.output.splitlines() if "=" in line)
            if setup_key and ("uid" in info or not spec.user):
                engine.image_facts[setup_key] = info
        self._has_timeout = info.get("timeout") == "1"
        if "uid" in info:
            try:
                self._owner = (int(info["uid"]), int(info["gid"]))
            except (KeyError, ValueError):
                raise ResourceStartError(f"{self.id}: user {spec.user!r} does not exist in {spec.image!r}") from None
        if self.disk_mode == "watchdog":
            engine.watchdog().watch(self)
        self._fresh = True

    def _layer_paths(self, info: dict[str, Any], layer: Path | None) -> tuple[UpperDir, str] | None:
        """``(upper, merged)``: the container's writable layer as made (its host folder, the root folder's mode, owner
        and attributes) and the host folder of its mounted root, when this process can restart the container in
        place (see :meth:`_restart_in_place_sync`); else None.

        ``info`` is the created container's ``inspect_container``.  Never for a container with a volume (an image's
        ``VOLUME``, which the engine makes anonymous and keeps across a restart) or a tmpfs mount: what an episode
        writes there is not in the writable layer, and only a new container gets them new."""
        if self.engine.restart_in_place_ok is False or os.geteuid() != 0:
            return None
        if any(m.get("Type") not in ("bind", None) for m in info.get("Mounts") or []):
            return None
        paths = (str(layer / "diff"), str(layer / "merged")) if layer is not None else \
            overlay_paths(info.get("GraphDriver") or {})
        if paths is None:
            return None
        try:
            return UpperDir.record(paths[0]), paths[1]
        except OSError:
            return None

    def _start_container(self, cid: str) -> None:
        """``docker start`` of the created (or stopped) container ``cid``, then its published ports.

        Raises:
            ResourceStartError: the engine refused.
        """
        docker = docker_module()
        api = self.engine.client().api
        try:
            api.start(cid)
        except docker.errors.APIError as e:
            raise ResourceStartError(f"starting a container of {self.spec.image!r} failed: {e.explanation or e}") from e
        if self._layer is not None:
            # restarting in place wipes the writable layer while it is unmounted: only where this process sees the
            # engine's mounts (the same mount namespace) can it tell that it is
            seen = os.path.ismount(self._layer[1])
            if self.engine.restart_in_place_ok is None or not seen:
                self.engine.restart_in_place_ok = seen
            if not seen:
                self._layer = None
        self.published_ports = read_published_ports(api, cid, self.spec.ports)

    def _restart_in_place_sync(self, cid: str) -> bool:
        """Make container ``cid`` fresh without making a new one: kill it (every process of the episode with
        its pid namespace), empty its writable layer while the engine has it unmounted (and its log), start it
        again.

        What a start makes anew is as after ``start()``: processes, ``/dev`` and ``/dev/shm``, the IPC and
        network namespaces, ``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf`` (the engine writes
        them on each start); everything else written (the whole file system but read-write ``spec.mounts``)
        was in the emptied layer.  False, with the container stopped or as it was, when it cannot be done
        here (no host access to the layer, the container gone, the layer still mounted, the wipe failed):
        the caller then replaces the container.

        Raises:
            ResourceStartError: the engine refused to start it again.
        """
        if self._layer is None or self.engine.restart_in_place_ok is False:
            return False
        docker = docker_module()
        api = self.engine.client().api
        upper, merged = self._layer
        self.published_ports = {}
        try:
            api.kill(cid)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: not running (it died, e.g. OOM-killed): emptied and started all the same
                return False
        try:
            api.wait(cid, timeout=60)
        except Exception:  # noqa: BLE001 - not stopped in time, or gone: replaced instead
            return False
        if os.path.ismount(merged) or not upper.renew():
            return False
        if self._log_path is None:  # the engine names it at the first start
            with contextlib.suppress(docker.errors.APIError):
                self._log_path = api.inspect_container(cid).get("LogPath") or None
        if self._log_path:  # what the episode's processes wrote to the container's output goes too
            with contextlib.suppress(OSError):
                os.truncate(self._log_path, 0)
        self._death_reason = None
        self._start_container(cid)
        self.restarts_in_place += 1
        self._fresh = True
        return True

    def _replace_sync(self) -> None:
        """Make the instance a fresh container: the same container restarted in place with an emptied writable
        layer where this process can do it (:meth:`_restart_in_place_sync`), else the current container removed
        (every process with it) and a new one made in its place."""
        kill, self._park_kill = self._park_kill, None
        if kill is not None:
            kill.result()  # never raises (_kill_sync)
        with self._lock:
            if self._released:
                raise ResourceDied(f"{self.id} was released")
            cid = self.container_id
            self._fresh = False
        if cid is not None and self._restart_in_place_sync(cid):
            return
        with self._lock:
            if self._released:
                raise ResourceDied(f"{self.id} was released")
            cid, self.container_id = self.container_id, None
            self.published_ports = {}
        if cid is None:
            self._start_sync()
            return
        if self.spec.ports:  # fixed host ports: the old container holds them until it is gone
            self._remove_sync(cid)
            self._start_sync()
            return
        # the old container is removed while the fresh one is made (the two engine calls overlap instead of
        # adding up); the replacement returns once both are done, so the instance still counts one container
        removal = threading.Thread(target=self._remove_sync, args=(cid,), name="afg-docker-remove", daemon=True)
        removal.start()
        try:
            self._start_sync()
        finally:
            removal.join()

    async def park(self) -> None:
        """The pool keeps this instance idle: end the episode's processes now (the container is killed), get a fresh
        container ready in the background (:meth:`DockerEngine.park_pool`, a few at a time).

        Never raises; a failure shows in the next :meth:`reset`.
        """
        if self._released or self._park_future is not None or self._fresh:
            return
        # the episode's processes end now, whenever the refresh gets its turn (which waits for this kill first: a
        # late kill would hit the container restarted in place, whose id is the same)
        self._park_kill = self.engine.pool().submit(self._kill_sync, self.container_id)
        if self._status == ResourceStatus.UNHEALTHY:  # the pool replaces it on the next acquisition: only end it
            return
        fut = self.engine.park_pool().submit(self._replace_sync)
        self._park_future = fut
        with contextlib.suppress(BaseException):
            await asyncio.shield(asyncio.wrap_future(fut))

    def _kill_sync(self, cid: str | None) -> None:
        """SIGKILL container ``cid`` (every process in it); never raises (gone or stopped already: nothing to do)."""
        if cid is None:
            return
        try:
            self.engine.client().api.kill(cid)
        except Exception:  # noqa: BLE001, S110 - not running or gone: the refresh makes a fresh one either way
            pass

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
            if fut is not None and not fut.cancel():  # a refresh not begun is done here and now instead
                await asyncio.shield(asyncio.wrap_future(fut))
            if not self._fresh or self.container_id is None:
                await asyncio.shield(self._in_thread(self._replace_sync))
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
        if self._park_future is not None and not self._park_future.done():  # being refreshed: reset() tells
            return self._status
        if self._death_reason is not None:
            self._status = ResourceStatus.UNHEALTHY
            return self._status
        if self.container_id is None:
            self._status = ResourceStatus.UNHEALTHY
            return self._status
        try:
            state = await self._in_thread(self._state_sync)
        except Exception:  # noqa: BLE001 - an engine that cannot say: the container is not known running
            state = None
        # not State.OOMKilled: the engine sets it when a container with an OOM-killed process stops, and keeps it
        # after a restart in place, where it says nothing about the fresh container
        if state is None or state.get("Status") != "running":
            self._status = ResourceStatus.UNHEALTHY
        return self._status

    def _state_sync(self) -> dict[str, Any] | None:
        docker = docker_module()
        try:
            return self.engine.client().api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return None

    async def adestroy(self) -> None:
        fut = self._park_future
        if fut is not None and not fut.cancel():  # let a refresh in flight finish, so its container is removed too
            with contextlib.suppress(BaseException):
                await asyncio.shield(asyncio.wrap_future(fut))
        try:
            await self._in_thread(self.destroy)
        except Exception:  # never raises
            log.warning("releasing %r failed", self, exc_info=True)
        if self._own_engine is not None:
            self._own_engine.close()

    def destroy(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            cid, self.container_id = self.container_id, None
            self.published_ports = {}
        self._status = ResourceStatus.STOPPED
        if cid is not None:
            self._remove_sync(cid)

    def _remove_sync(self, cid: str) -> None:
        try:
            self.engine.client().api.remove_container(cid, force=True, v=True)
        except Exception as e:  # noqa: BLE001 - best-effort removal; all but NotFound is logged
            if type(e).__name__ != "NotFound":
                log.warning("removing container %s failed: %s", cid[:12], e)

    # -- the container API
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


def create(spec: ContainerSpec, labels: dict[str, str]) -> DockerContainer:
    """The ``("container", "docker")`` backend: an unstarted :class:`DockerContainer` for ``spec``
    whose container will carry ``labels`` (see :mod:`.ownership`).

    Raises:
        ResourceUnavailable: docker-py is not installed.
    """
    docker_module()
    return DockerContainer(spec, labels=labels)
