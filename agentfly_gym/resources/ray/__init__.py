"""One resource manager for a whole Ray cluster (needs ``pip install 'agentfly-gym[ray]'``).

:class:`RayResourceManager` has the API of :class:`~agentfly_gym.resources.ResourceManager`; its per-spec
pools are named Ray actors shared by every process of a Ray job, so a cap holds cluster-wide, and each
instance lives on a node chosen by Ray resources (:class:`RayPlacement`), held by the pool's host actor on that
node (one per node and pool; ``hosting="instance"``: one per instance).

The setting ``AGENTFLY_GYM_MANAGER`` chooses the manager that :func:`~agentfly_gym.resources.default_manager`
and the verl plugin make (see :mod:`agentfly_gym.resources.select`).  Ray itself is imported on first use,
not at import.
"""

from .placement import RayPlacement, parse_placements, resolve_placement
from .manager import RayPool, RayResource, RayResourceManager, RayRolloutScope

__all__ = ["RayPlacement", "RayPool", "RayResource", "RayResourceManager", "RayRolloutScope", "parse_placements",
           "resolve_placement"]
