"""The unified resource system: specs, the Resource lifecycle, pools, the manager, backends."""

from typing import TYPE_CHECKING

from ..utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on first
    # use (agentfly_gym.utils.lazy), so a command that only needs teardown or a spec imports no pool or manager
    from .base import Resource, ResourceStatus
    from .inprocess import InProcessResource
    from .manager import ResourceManager
    from .pool import PoolMetrics, ResourcePool
    from .protocol import Manager
    from .scope import RolloutScope
    from .select import default_manager
    from .spec import ContainerSpec, InProcessSpec, ModelAPISpec, ModelServiceSpec, Mount, ResourceSpec

__getattr__, __dir__ = lazy_exports(__name__, {
    "Resource": "base", "ResourceStatus": "base", "InProcessResource": "inprocess", "ResourceManager": "manager",
    "PoolMetrics": "pool", "ResourcePool": "pool", "Manager": "protocol", "RolloutScope": "scope",
    "default_manager": "select", "ContainerSpec": "spec", "InProcessSpec": "spec", "ModelAPISpec": "spec",
    "ModelServiceSpec": "spec", "Mount": "spec", "ResourceSpec": "spec",
})

__all__ = [
    "ContainerSpec", "InProcessResource", "InProcessSpec", "Manager", "ModelAPISpec", "ModelServiceSpec", "Mount",
    "PoolMetrics", "Resource", "ResourceManager", "ResourcePool", "ResourceSpec", "ResourceStatus",
    "RolloutScope", "default_manager",
]
