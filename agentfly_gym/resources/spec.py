"""Resource specifications: frozen, hashable descriptions of what a rollout needs.

A spec says *what* resource is wanted; the resource manager decides when an
instance is started, reused, reset and released.  Two equal specs share one pool
(:attr:`ResourceSpec.key`).  Four kinds exist, after the AgentFly paper's unified
resource engine: containers, local model services, external model APIs and
in-process objects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import ConfigError
from ..limits import check_int
from .backends import backend_names

__all__ = [
    "ResourceSpec",
    "ContainerSpec",
    "Mount",
    "ModelServiceSpec",
    "ModelAPISpec",
    "InProcessSpec",
    "parse_bytes",
]

_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(value: int | str | None, *, field: str = "memory") -> int | None:
    """Parse a size such as ``512m``, ``2g``, ``"1048576"`` or ``1048576`` into bytes.

    Units are binary (k = 1024 bytes) as in ``docker run --memory``.

    Raises:
        ConfigError: the value is not a positive size.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{field}={value!r} is not a size; use bytes (int) or a string like '512m'", field=field)
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*", str(value).lower())
        if not m:
            raise ConfigError(f"{field}={value!r} is not a size; use bytes (int) or a string like '512m' or '2g'",
                              field=field)
        n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if n <= 0:
        raise ConfigError(f"{field}={value!r} must be a positive size", field=field)
    return n


def _freeze(value: Any) -> Any:
    """Turn mappings and lists into sorted tuples so that a spec stays hashable."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, set):
        return tuple(sorted(_freeze(v) for v in value))
    return value


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def check_max_idle_time(value: Any) -> None:
    """Raise ConfigError unless ``value`` is ``None`` or a number of seconds > 0 (a spec's ``max_idle_time``;
    envs that build their specs later check it with this at construction)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ConfigError(f"max_idle_time={value!r} must be None or a number of seconds > 0", field="max_idle_time")


def _check_seconds(name: str, value: Any, *, zero_ok: bool = False) -> None:
    """Raise ConfigError unless ``value`` is a finite number of seconds > 0 (>= 0 with ``zero_ok``)."""
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{name}={value!r} must be a number of seconds {'>= 0' if zero_ok else '> 0'}", field=name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceSpec:
    """Base of all specs: pool settings shared by every kind.

    Attributes:
        max_instances: pool capacity, the most live instances (in use, idle or starting) at once.
        min_idle: instances the pool keeps started and idle ahead of demand (pre-warming), at most
            ``max_instances``.
        max_uses: recycle an instance after this many acquisitions (as asyncpg's ``max_queries``);
            ``None`` never recycles.
        max_idle_time: seconds an idle instance may wait before it is released; ``None`` keeps it.
        start_timeout: seconds a start may take before it fails with ``ResourceStartError``.
        name: a label for logs and metrics; not part of the pool key.
    """

    kind: ClassVar[str] = "abstract"

    max_instances: int = 1
    min_idle: int = 0
    max_uses: int | None = None
    max_idle_time: float | None = None
    start_timeout: float = 300.0
    name: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        check_int("max_instances", self.max_instances)
        check_int("min_idle", self.min_idle, minimum=0, maximum=self.max_instances, unit="at most max_instances")
        check_int("max_uses", self.max_uses, optional=True)
        check_max_idle_time(self.max_idle_time)
        if self.start_timeout <= 0:
            raise ConfigError(f"start_timeout={self.start_timeout!r} must be > 0 seconds", field="start_timeout")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            frozen = _freeze(v)
            if frozen is not v:
                object.__setattr__(self, f.name, frozen)

    @property
    def key(self) -> str:
        """The pool key: ``"<kind>:<12 hex digits>"``, a digest of every field that takes part in equality."""
        payload = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.compare}
        digest = hashlib.sha256(json.dumps([self.kind, payload], sort_keys=True, default=repr).encode()).hexdigest()
        return f"{self.kind}:{digest[:12]}"

    @property
    def label(self) -> str:
        """A short human-readable label: ``name`` if set, else the key."""
        return self.name or self.key

    def to_dict(self) -> dict[str, Any]:
        """The spec's fields as plain JSON-able data, with ``kind``."""
        d = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d["kind"] = self.kind
        return d


@dataclasses.dataclass(frozen=True)
class Mount:
    """A host path mounted into a container or sandbox at ``target``; ``read_only`` by default."""

    source: str
    target: str
    read_only: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContainerSpec(ResourceSpec):
    """An isolated Linux container (Docker) or daemon-less sandbox (bubblewrap).

    Attributes:
        image: the image name (Docker) or a rootfs folder (sandbox).
        sandbox_image: what the sandbox backend runs instead of ``image`` (``"host"``, a rootfs
            folder or an image name with a rootfs on disk), so one spec serves both backends, e.g.
            ``image="agentfly/r2egym", sandbox_image="host", backend="auto"``; ``None``: ``image``.
        cpus: CPU limit in cores (fractional allowed).
        memory: memory limit in bytes (``"512m"`` style strings are parsed).
        disk: limit in bytes on what the container may write (``"10g"`` style strings are parsed;
            ``None`` for no limit).  Sandbox: the private writable state lives on a file system of
            this size (a loop-mounted ext4 image; writes past it fail with ``ENOSPC``).  Docker: the
            container's writable layer on such a file system where the manager is root beside a local
            overlay2 engine (disk and inodes, one per 8 KiB, enforced by the kernel), else the
            engine's ``--storage-opt size`` where its storage driver supports it, else no file may
            grow past it (``RLIMIT_FSIZE``) and a host-side watchdog stops the container's processes
            once its writable layer exceeds it.  ``describe()["limits_enforced"]["disk"]`` says which.
        pids: process-count limit (stops fork bombs).
        network: whether the container gets a network; off by default.
        mounts: host paths to mount.
        env: environment variables, as a mapping.
        workdir: working directory for ``exec``.
        user: user to run as where the image has it ("" means the image's default).
        backend: ``"docker"``, ``"sandbox"``, ``"auto"`` (``"sandbox"`` for ``image="host"`` or a
            folder, else docker when an engine answers), or another name registered with
            :func:`agentfly_gym.resources.backends.register_backend`.
        command: the keep-alive command of the container.
        ports: TCP ports a server inside listens on, each published on 127.0.0.1 of the host at a
            free port the engine picks (``ContainerResource.endpoint(port)`` gives ``(host, port)``;
            a fresh container after ``reset()`` may get another).  Needs ``network=True`` (a
            published port needs a network; Docker's default bridge, which can also reach out).
        runtime: Docker only: the OCI runtime the engine runs the container with (``docker run --runtime``),
            e.g. ``"runsc"`` for gVisor, whose user-space kernel stands between model code and the host's
            kernel (the engine must know it: ``dockerd --add-runtime runsc=/usr/bin/runsc``, which
            ``scripts/docker-engine.sh`` passes where ``runsc`` is installed; Debian package ``runsc``).
            ``None``: the engine's default (runc).  Refused with ``backend="sandbox"`` (``ConfigError``).
            Docker only: with ``backend="sandbox"`` the spec is refused at once (``ConfigError``); with
            ``backend="auto"`` a choice of the sandbox fails at acquisition (``ResourceUnavailable``).
        max_idle_time: as for every spec, but 300 seconds by default (asyncpg's default for idle
            connections): a container (on Docker, the fresh one made when it went idle) that no
            rollout acquires again within 5 minutes is removed, so none outlives the last env that used
            it by more than that, while envs made one after another (a training loop) still reuse warm
            containers.  ``None`` keeps idle containers until the manager closes.
    """

    kind: ClassVar[str] = "container"

    max_idle_time: float | None = 300.0

    image: str
    sandbox_image: str | None = None
    cpus: float = 1.0
    memory: int | str | None = "1g"
    disk: int | str | None = "10g"
    pids: int = 256
    network: bool = False
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] | tuple = ()
    workdir: str = "/"
    user: str = ""
    backend: str = "auto"
    command: tuple[str, ...] = ("sleep", "infinity")
    ports: tuple[int, ...] = ()
    runtime: str | None = None

    def __post_init__(self) -> None:
        _check_ports(self.ports, self.network, self.backend)
        if self.runtime is not None:
            if not isinstance(self.runtime, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.runtime):
                raise ConfigError(f"runtime={self.runtime!r} must be None or an OCI runtime name known to the "
                                  "Docker engine, e.g. 'runsc' (gVisor)")
            if self.backend == "sandbox":
                raise ConfigError(f"runtime={self.runtime!r} is a Docker option; the sandbox backend has none "
                                  "(use backend='docker')")
        if not isinstance(self.image, str) or not self.image:
            raise ConfigError(f"image={self.image!r} must be a non-empty image name", field="image")
        if self.sandbox_image is not None and (not isinstance(self.sandbox_image, str) or not self.sandbox_image):
            raise ConfigError(f"sandbox_image={self.sandbox_image!r} must be None or a non-empty image name or folder",
                              field="sandbox_image")
        known = ["auto", *backend_names(self.kind)]
        if self.backend not in known:
            raise ConfigError(f"backend={self.backend!r} is not one of {', '.join(map(repr, known))}", field="backend")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float)) or not self.cpus > 0:
            raise ConfigError(f"cpus={self.cpus!r} must be a number of cores > 0", field="cpus")
        check_int("pids", self.pids)
        object.__setattr__(self, "memory", parse_bytes(self.memory))
        object.__setattr__(self, "disk", parse_bytes(self.disk, field="disk"))
        if isinstance(self.command, str):
            object.__setattr__(self, "command", (self.command,))
        for m in self.mounts:
            if not isinstance(m, Mount):
                raise ConfigError(f"mounts must hold Mount objects, got {m!r}", field="mounts")
        super().__post_init__()


SANDBOX_PORTS_REFUSAL = (
    "the 'sandbox' container backend cannot publish ports={ports!r}: its network namespace is private "
    "(unreachable from the host; with network=True it only reaches out, through a user-mode network); use "
    "backend='docker' (ports published on 127.0.0.1 at engine-chosen host ports)")
"""Why the sandbox backend refuses ``ContainerSpec.ports`` (``.format(ports=...)``); one wording for the spec's
check (``backend="sandbox"``, a ``ConfigError``) and the backend's (``"auto"`` resolved to it at acquisition)."""


def _check_ports(ports: Any, network: bool, backend: str = "auto") -> None:
    """Validate ``ContainerSpec.ports``: distinct integers in 1..65535, a network to publish them on, and a
    backend that can publish them (the sandbox cannot; ``"auto"`` is checked when it is resolved)."""
    if isinstance(ports, (str, int)) or not isinstance(ports, (tuple, list)):
        raise ConfigError(f"ports={ports!r} must be a tuple of TCP port numbers, e.g. (8000,)", field="ports")
    for p in ports:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536:
            raise ConfigError(f"ports entry {p!r} must be an integer port number in 1..65535", field="ports")
    if len(set(ports)) != len(ports):
        raise ConfigError(f"ports={ports!r} lists a port twice", field="ports")
    if ports and not network:
        raise ConfigError(f"ports={tuple(ports)!r} needs network=True: a container without a network "
                          "cannot publish a port to the host")
    if ports and backend == "sandbox":
        raise ConfigError(SANDBOX_PORTS_REFUSAL.format(ports=tuple(ports)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelServiceSpec(ResourceSpec):
    """A local OpenAI-compatible inference server started as a resource.

    Attributes:
        engine: ``"vllm"`` (``vllm serve``, GPU) or ``"transformers"`` (``transformers serve``, CPU).
        model: model name or local folder.
        tensor_parallel_size: GPUs per server (vLLM).
        gpu_memory_utilization: fraction of GPU memory vLLM may use, in (0, 1].
        max_model_len: context length in tokens, ``None`` for the model's default.
        port: TCP port on 127.0.0.1; ``None`` picks a free one.
        extra_args: further command-line arguments, passed verbatim.
    """

    kind: ClassVar[str] = "model_service"

    engine: str
    model: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = ()
    start_timeout: float = 900.0

    def __post_init__(self) -> None:
        if self.engine not in ("vllm", "transformers"):
            raise ConfigError(f"engine={self.engine!r} is not one of 'vllm', 'transformers'", field="engine")
        if not self.model:
            raise ConfigError("model must name a model or a local model folder", field="model")
        check_int("tensor_parallel_size", self.tensor_parallel_size)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]",
                              field="gpu_memory_utilization")
        check_int("max_model_len", self.max_model_len, optional=True, unit="tokens")
        check_int("port", self.port, optional=True, maximum=65535, unit="a TCP port")
        super().__post_init__()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelAPISpec(ResourceSpec):
    """An external OpenAI-compatible endpoint (e.g. an LLM judge).

    The key is read from the environment variable named by ``api_key_env`` when the
    resource starts; it is never stored in the spec or logged.  ``max_instances``
    bounds the number of concurrent requests.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name sent with each request.
        api_key_env: name of the environment variable that holds the key, or ``None``.
        max_retries: retries on HTTP 429 and 5xx, with exponential backoff.
        backoff: first backoff delay in seconds (>= 0, doubled each retry; a 429 or 5xx answer's ``Retry-After``
            replaces it, up to 60 s).
        request_timeout: seconds per HTTP request (> 0).

    Raises:
        ConfigError: a base URL that is not http(s), an empty model name, a bad variable name, or retries,
            backoff or timeout out of range.
    """

    kind: ClassVar[str] = "model_api"

    base_url: str
    model: str
    api_key_env: str | None = None
    max_retries: int = 3
    backoff: float = 0.5
    request_timeout: float = 120.0

    def __post_init__(self) -> None:
        if not re.match(r"^https?://", self.base_url or ""):
            raise ConfigError(f"base_url={self.base_url!r} must start with http:// or https://", field="base_url")
        if not self.model:
            raise ConfigError("model must be a non-empty model name", field="model")
        if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ConfigError(f"api_key_env={self.api_key_env!r} must be an environment variable name",
                              field="api_key_env")
        check_int("max_retries", self.max_retries, minimum=0)
        _check_seconds("backoff", self.backoff, zero_ok=True)
        _check_seconds("request_timeout", self.request_timeout)
        super().__post_init__()


@dataclasses.dataclass(frozen=True, kw_only=True)
class InProcessSpec(ResourceSpec):
    """An object built in this process by ``factory(**kwargs)`` (a chess engine, a simulator).

    Each instance gets its own worker thread: every call into the object runs there, one
    at a time, so blocking, non-thread-safe objects are driven without blocking the event
    loop.  Optional methods of the object are used when present: ``reset()`` (called when
    the pool hands a used instance out again), ``healthy() -> bool`` (health check) and
    ``close()`` (when the pool destroys the instance).

    With ``isolation="process"`` the object is built and driven in a child process instead (see
    :mod:`agentfly_gym.resources.isolated`): the same calls, arguments and results pickled, the child
    killed with its parent, a crashed child reported as ``ResourceDied``.  Use it for objects that hold
    the GIL for long (a search index, a reward model) or may crash the interpreter.

    Attributes:
        factory: ``"package.module:callable"``.
        kwargs: keyword arguments for the factory (a mapping; stored as sorted pairs).
        close_timeout: seconds ``close()`` may take before the instance is abandoned.
        isolation: ``"thread"`` (default: the object lives in this process, driven from its own thread)
            or ``"process"`` (a child process, driven from that thread).
    """

    kind: ClassVar[str] = "inprocess"

    factory: str
    kwargs: Mapping[str, Any] | tuple = ()
    close_timeout: float = 30.0
    isolation: str = "thread"

    def __post_init__(self) -> None:
        if not isinstance(self.factory, str) or not re.fullmatch(r"[\w.]+:[\w.]+", self.factory):
            raise ConfigError(f"factory={self.factory!r} must look like 'package.module:callable'", field="factory")
        if self.isolation not in ("thread", "process"):
            raise ConfigError(f"isolation={self.isolation!r} is not 'thread' or 'process'", field="isolation")
        super().__post_init__()

    @property
    def factory_kwargs(self) -> dict[str, Any]:
        """The factory's keyword arguments as a dict."""
        return {k: v for k, v in self.kwargs}
