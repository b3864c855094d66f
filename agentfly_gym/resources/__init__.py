"""The unified resource system: specs, the Resource lifecycle, pools, the manager, backends."""

from .base import Resource, ResourceStatus
from .inprocess import InProcessResource
from .manager import ResourceManager
from .pool import PoolMetrics, ResourcePool
from .protocol import Manager
from .scope import RolloutScope
from .select import default_manager
from .spec import ContainerSpec, InProcessSpec, ModelAPISpec, ModelServiceSpec, Mount, ResourceSpec

__all__ = [
    "ContainerSpec", "InProcessResource", "InProcessSpec", "Manager", "ModelAPISpec", "ModelServiceSpec", "Mount",
    "PoolMetrics", "Resource", "ResourceManager", "ResourcePool", "ResourceSpec", "ResourceStatus",
    "RolloutScope", "default_manager",
]
