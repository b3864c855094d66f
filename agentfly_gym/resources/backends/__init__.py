"""Backends: build an unstarted :class:`~agentfly_gym.resources.Resource` for a spec.

Backend modules are imported lazily, so that ``docker`` or an HTTP client are only
needed by those who use containers or model services.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ...errors import ConfigError, ResourceUnavailable

if TYPE_CHECKING:
    from ..base import Resource
    from ..manager import ResourceManager
    from ..spec import ResourceSpec

__all__ = ["create_resource", "register_backend"]

# kind -> "module:callable(spec, manager) -> Resource"
_BACKENDS: dict[str, str] = {
    "inprocess": "agentfly_gym.resources.backends.inprocess_backend:create",
    "container": "agentfly_gym.resources.containers.choice:create",
    "model_service": "agentfly_gym.resources.backends.model_service:create",
    "model_api": "agentfly_gym.resources.backends.model_api:create",
}


def register_backend(kind: str, factory_path: str) -> None:
    """Route specs of ``kind`` to ``factory_path`` (``"module:callable(spec, manager)"``)."""
    _BACKENDS[kind] = factory_path


def create_resource(spec: ResourceSpec, manager: ResourceManager) -> Resource:
    """An unstarted resource for ``spec``, labelled with the manager id.

    Raises:
        ConfigError: no backend handles ``spec.kind``.
        ResourceUnavailable: the backend exists but cannot run here.
    """
    path = _BACKENDS.get(spec.kind)
    if path is None:
        raise ConfigError(f"no backend for resource kind {spec.kind!r}; known: {sorted(_BACKENDS)}")
    mod_name, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise ResourceUnavailable(f"the backend for {spec.kind!r} resources is not available: {e}") from e
    return getattr(mod, attr)(spec, manager)
