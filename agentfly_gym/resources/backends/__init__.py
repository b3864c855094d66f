"""Backends turn a spec into an unstarted :class:`~agentfly_gym.resources.Resource`; this module is
their one registry, and the guide to adding one.

How a resource is made::

    manager.pool(spec)  ->  ResourcePool  ->  manager._build(spec)
        ->  create_resource(spec, labels)          (this module)
        ->  <backend module>.create(spec, labels)  ->  an unstarted Resource; the pool starts it

The contract of a backend
-------------------------
A backend is one function, ``create(spec, labels) -> Resource``:

* ``spec``: the frozen spec (:mod:`agentfly_gym.resources.spec`) of the pool being served;
* ``labels``: ``dict[str, str]`` the manager computed once (owner process, host, manager id, see
  :func:`agentfly_gym.resources.containers.ownership.owner_labels`) plus ``agentfly.pool`` (the
  spec key).  Pass them to ``Resource.__init__(spec, labels=labels)``; a backend whose instances
  outlive a crash (containers, folders, servers) stores them where a reaper finds them;
* returns an **unstarted** instance quickly: no blocking I/O, no process, no container yet;
* raises :class:`~agentfly_gym.errors.ResourceUnavailable` when it cannot run here (a missing
  program or package), :class:`~agentfly_gym.errors.ConfigError` for a spec it refuses.

It never sees the manager, the pool or other instances.  The instance implements the lifecycle of
:class:`~agentfly_gym.resources.Resource`: ``start``, ``reset``, ``status``, ``adestroy``, keeping
``self._status`` (a :class:`~agentfly_gym.resources.base.ResourceStatus`) current as it goes, e.g.
``READY`` at the end of ``start`` and ``STOPPED`` in ``adestroy``: ``repr``, ``describe()`` and
``agentfly-gym resources`` read it (and
``park``, ``destroy`` for exit-time cleanup, ``describe``); container backends implement
:class:`~agentfly_gym.resources.containers.api.ContainerResource` too, so tools and environments run
unchanged on them.  Pools (:mod:`agentfly_gym.resources.pool`) do the rest: capacity, waiting,
reuse, health checks, replacement; the manager's teardown (:mod:`agentfly_gym.resources.teardown`)
calls ``destroy`` at exit and on SIGTERM.

Adding a backend
----------------
1. Write a module with the resource class and ``create(spec, labels)``; import heavy or optional
   dependencies inside ``create`` or later, so importing the library stays cheap.
2. Register it, by ``(kind, name)``::

       register_backend("container", "podman", "my_pkg.podman:create")

   ``kind`` is the spec's ``kind`` (``"container"``, ``"inprocess"``, ``"model_service"``,
   ``"model_api"``, or a new spec class's).  ``name`` is ``""`` for a kind with one backend; for a
   spec with a ``backend`` field (``ContainerSpec``) it is the value that selects this backend,
   e.g. ``ContainerSpec(image=..., backend="podman")``.  ``"auto"`` is resolved by the kind's
   resolver (:func:`register_resolver`; containers: Docker when an engine answers, else the
   sandbox).
3. Test it as ``tests/test_backend_contract.py`` does: a real spec through a real manager.

No backend imports an environment, the manager or the pool; environments never import a backend
module: a spec field says what a backend needs (e.g. ``ContainerSpec.sandbox_image``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import ConfigError, ResourceUnavailable
from ...utils.imports import load_object

if TYPE_CHECKING:
    from ..base import Resource
    from ..spec import ResourceSpec

__all__ = ["BackendFactory", "backend_names", "create_resource", "register_backend", "register_resolver",
           "resolve_backend_name"]

BackendFactory = Callable[["ResourceSpec", dict[str, str]], "Resource"]
"""``create(spec, labels) -> Resource`` (unstarted)."""

_Entry = str | Callable

_lock = threading.Lock()
# (kind, backend name) -> "module:attr" of create(spec, labels), or the callable itself
_BACKENDS: dict[tuple[str, str], _Entry] = {
    ("inprocess", ""): "agentfly_gym.resources.backends.inprocess_backend:create",
    ("model_service", ""): "agentfly_gym.resources.backends.model_service:create",
    ("model_api", ""): "agentfly_gym.resources.backends.model_api:create",
    ("container", "docker"): "agentfly_gym.resources.containers.docker:create",
    ("container", "sandbox"): "agentfly_gym.resources.containers.sandbox.container:create",
}
# kind -> "module:attr" of resolve(spec) -> backend name, used when spec.backend == "auto"
_RESOLVERS: dict[str, _Entry] = {
    "container": "agentfly_gym.resources.containers.choice:resolve_backend",
}


def register_backend(kind: str, name: str, factory: str | BackendFactory) -> None:
    """Route specs of ``kind`` whose ``backend`` is ``name`` (``""`` for a kind without that field)
    to ``factory``: a ``"module:attr"`` path (imported on first use) or the callable.

    Registering an existing ``(kind, name)`` replaces it.

    Raises:
        ConfigError: ``kind`` is empty, ``name`` is ``"auto"`` (that is the resolver's), or
            ``factory`` is neither a string nor callable.
    """
    if not kind or not isinstance(kind, str) or not isinstance(name, str):
        raise ConfigError(f"register_backend: kind={kind!r} and name={name!r} must be strings, kind not empty")
    if name == "auto":
        raise ConfigError("register_backend: 'auto' is chosen by the kind's resolver; use register_resolver")
    if not isinstance(factory, str) and not callable(factory):
        raise ConfigError(f"register_backend: factory={factory!r} must be 'module:attr' or a callable")
    with _lock:
        _BACKENDS[(kind, name)] = factory


def register_resolver(kind: str, resolver: str | Callable[[ResourceSpec], str]) -> None:
    """Choose the backend of ``kind`` specs whose ``backend`` is ``"auto"``: ``resolver(spec)``
    returns a registered name (``"module:attr"`` or the callable)."""
    if not isinstance(resolver, str) and not callable(resolver):
        raise ConfigError(f"register_resolver: resolver={resolver!r} must be 'module:attr' or a callable")
    with _lock:
        _RESOLVERS[kind] = resolver


def backend_names(kind: str) -> list[str]:
    """The registered backend names of ``kind`` (``[""]`` for a kind with one backend), sorted."""
    with _lock:
        return sorted(n for k, n in _BACKENDS if k == kind)


def _load(entry: _Entry, what: str) -> Callable:
    if callable(entry):
        return entry
    return load_object(entry, what=what, import_error=ResourceUnavailable)


def resolve_backend_name(spec: ResourceSpec) -> str:
    """The backend name that will build ``spec``: its ``backend`` field, ``"auto"`` resolved by the
    kind's resolver (may probe, e.g. ping a Docker engine once per process), ``""`` for a kind
    without that field.

    Raises:
        ConfigError: ``"auto"`` for a kind without a resolver.
        ResourceUnavailable: the resolver's module cannot be imported.
    """
    name = getattr(spec, "backend", "") or ""
    if name != "auto":
        return name
    with _lock:
        resolver = _RESOLVERS.get(spec.kind)
    if resolver is None:
        raise ConfigError(f"backend='auto' has no resolver for {spec.kind!r} resources; name a backend: "
                          f"{backend_names(spec.kind)}")
    return _load(resolver, f"the {spec.kind!r} backend resolver")(spec)


def create_resource(spec: ResourceSpec, labels: dict[str, str]) -> Resource:
    """An unstarted resource for ``spec`` from its registered backend, given ``labels``.

    Raises:
        ConfigError: no backend is registered for ``spec.kind`` and the spec's backend name.
        ResourceUnavailable: the backend exists but cannot run here (its module or a program it
            needs is missing).
    """
    name = resolve_backend_name(spec)
    with _lock:
        entry = _BACKENDS.get((spec.kind, name))
    if entry is None:
        known = backend_names(spec.kind)
        if not known:
            raise ConfigError(f"no backend for resource kind {spec.kind!r}; register one with register_backend")
        raise ConfigError(f"no {spec.kind!r} backend named {name!r}; registered: {known}")
    what = f"the {name!r} {spec.kind} backend" if name else f"the {spec.kind!r} backend"
    return _load(entry, what)(spec, labels)
