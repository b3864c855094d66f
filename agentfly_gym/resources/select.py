"""Which manager a process makes by default: the setting ``AGENTFLY_GYM_MANAGER``.

=====================  ==========================================================================
``AGENTFLY_GYM_MANAGER``  manager made by ``default_manager()`` and the verl plugin
=====================  ==========================================================================
unset or ``local``     :class:`~agentfly_gym.resources.ResourceManager` (pools in this process)
``ray``                :class:`~agentfly_gym.resources.ray.RayResourceManager` (joins the Ray job
                       this process runs in, or starts a local Ray)
``auto``               ``ray`` when this process runs inside a Ray job (a Ray worker, or a driver
                       that called ``ray.init``), else ``local``
=====================  ==========================================================================

With ``ray``: ``AGENTFLY_GYM_RAY_PLACEMENT`` (JSON, spec kind/name/key -> :class:`RayPlacement` fields,
e.g. ``{"container": {"resources": {"docker": 1}}}``) places instances, ``AGENTFLY_GYM_RAY_GLOBAL``
(``cluster`` or ``node``) says how many copies of a global resource (the WebShop server) run, and
``AGENTFLY_GYM_RAY_NAMESPACE`` overrides the namespace of the pools (default: the job's), and
``AGENTFLY_GYM_RAY_HOSTING`` (``node`` or ``instance``) chooses one host process per node and pool (the default)
or one per instance.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from ..errors import ConfigError
from .defaults import loop_default, set_loop_default
from .manager import ResourceManager
from .protocol import Manager

__all__ = ["default_manager", "manager_kind", "in_ray_job", "manager_from_environment", "SETTING"]

SETTING = "AGENTFLY_GYM_MANAGER"
_KINDS = ("local", "ray", "auto")


def in_ray_job() -> bool:
    """True when this process is a Ray worker or a driver connected to Ray (never imports Ray to find out)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported ray
        return False


def manager_kind() -> str:
    """``"local"`` or ``"ray"``: what ``AGENTFLY_GYM_MANAGER`` asks for in this process now.

    Raises:
        ConfigError: the setting has another value.
    """
    value = os.environ.get(SETTING, "local").strip().lower() or "local"
    if value not in _KINDS:
        raise ConfigError(f"{SETTING}={value!r} is not one of {list(_KINDS)}")
    if value == "auto":
        return "ray" if in_ray_job() else "local"
    return value


def manager_from_environment(**kwargs: Any) -> Manager:
    """A new manager of the kind :func:`manager_kind` names, configured from the environment variables above.

    Keyword arguments go to the manager's constructor (they override the environment).
    """
    if manager_kind() == "local":
        return ResourceManager(**kwargs)
    from .ray.manager import RayResourceManager  # Ray is imported on first use, not at import
    from .ray.placement import parse_placements

    placement = os.environ.get("AGENTFLY_GYM_RAY_PLACEMENT")
    if placement and "placement" not in kwargs:
        kwargs["placement"] = parse_placements(placement)
    scope = os.environ.get("AGENTFLY_GYM_RAY_GLOBAL")
    if scope and "global_scope" not in kwargs:
        kwargs["global_scope"] = scope
    ns = os.environ.get("AGENTFLY_GYM_RAY_NAMESPACE")
    if ns and "namespace" not in kwargs:
        kwargs["namespace"] = ns
    hosting = os.environ.get("AGENTFLY_GYM_RAY_HOSTING")
    if hosting and "hosting" not in kwargs:
        kwargs["hosting"] = hosting.strip().lower()
    return RayResourceManager(**kwargs)


def default_manager() -> Manager:
    """The default manager of the running event loop (one per loop, created on first use).

    Environments made without an explicit ``manager=`` use it, so all of them in one
    loop share pools.  Must be called from inside a running loop.  ``AGENTFLY_GYM_MANAGER=ray``
    (or ``auto`` inside a Ray job) makes it a cluster-wide
    :class:`~agentfly_gym.resources.ray.RayResourceManager` (the table above).
    """
    loop = asyncio.get_running_loop()
    m = loop_default(loop)
    if m is None:
        m = manager_from_environment()  # AGENTFLY_GYM_MANAGER: local (default), ray, auto
        set_loop_default(loop, m)
    return m
