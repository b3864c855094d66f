"""Where a pooled instance lives in a Ray cluster: the Ray resources reserved for it (by a placement group of its
own with ``hosting="node"``, by its host actor with ``hosting="instance"``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import ConfigError
from ..spec import ResourceSpec

__all__ = ["RayPlacement", "PlacementTable", "resolve_placement", "parse_placements"]


@dataclasses.dataclass(frozen=True)
class RayPlacement:
    """The Ray resources one instance reserves on its node.

    An instance (a simulator, an engine, a container's driver, a server) is reserved these resources; Ray
    picks a node that has them free and the instance lives there, so custom node resources such as
    ``{"docker": 1}``, ``{"sandbox": 1}``, ``{"webshop": 1}`` or ``{"scienceworld": 4}`` (declared with
    ``ray start --resources='{"docker": 8}'``) decide which nodes host which instances and how many.

    Attributes:
        num_cpus: CPU cores reserved for scheduling (fractional allowed); 0 reserves none.
        num_gpus: GPUs reserved.
        memory: bytes of memory reserved for scheduling, or None.
        resources: custom resources, name -> amount (amounts > 0).
        scheduling_strategy: ``"DEFAULT"`` (pack) or ``"SPREAD"`` (spread instances over nodes; with node
            hosting: the node with the fewest of the pool's instances that has room).
    """

    num_cpus: float = 0.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: Mapping[str, float] | tuple = ()
    scheduling_strategy: str = "DEFAULT"

    def __post_init__(self) -> None:
        try:
            res = dict(self.resources)
        except (TypeError, ValueError):
            raise ConfigError(f"placement resources={self.resources!r} must map resource names to amounts, "
                              'e.g. {"docker": 1}') from None
        for name, amount in res.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"placement resource name {name!r} must be a non-empty string")
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
                raise ConfigError(f"placement resource {name!r}={amount!r} must be a number > 0")
        object.__setattr__(self, "resources", tuple(sorted(res.items())))
        for field in ("num_cpus", "num_gpus"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"placement {field}={v!r} must be a number >= 0")
        if self.memory is not None and (not isinstance(self.memory, int) or self.memory <= 0):
            raise ConfigError(f"placement memory={self.memory!r} must be None or a positive number of bytes")
        if self.scheduling_strategy not in ("DEFAULT", "SPREAD"):
            raise ConfigError(f"scheduling_strategy={self.scheduling_strategy!r} is not one of 'DEFAULT', 'SPREAD'")

    @classmethod
    def of(cls, value: RayPlacement | Mapping[str, Any]) -> RayPlacement:
        """A placement from itself or from a mapping of its fields (as parsed from JSON).

        Raises:
            ConfigError: an unknown field or a bad value.
        """
        if isinstance(value, RayPlacement):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"placement {value!r} must be a RayPlacement or a mapping of its fields")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ConfigError(f"unknown placement field(s) {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**value)

    def actor_options(self) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options(...)``."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            opts["memory"] = self.memory
        if self.resources:
            opts["resources"] = dict(self.resources)
        if self.scheduling_strategy != "DEFAULT":
            opts["scheduling_strategy"] = self.scheduling_strategy
        return opts


PlacementTable = Mapping[str, RayPlacement | Mapping[str, Any]] | Callable[[ResourceSpec], RayPlacement]


def resolve_placement(table: PlacementTable | None, spec: ResourceSpec) -> RayPlacement:
    """The placement of ``spec``'s instances.

    ``table`` is a callable ``spec -> RayPlacement`` or a mapping looked up by, in order, the spec's
    key (``"inprocess:0123456789ab"``), its ``name``, its kind (``"container"``, ``"inprocess"``,
    ``"model_service"``, ``"model_api"``) and ``"*"``; nothing found means ``RayPlacement()`` (no CPU
    reserved, any node).
    """
    if table is None:
        return RayPlacement()
    if callable(table):
        return RayPlacement.of(table(spec))
    for k in (spec.key, spec.name, spec.kind, "*"):
        if k and k in table:
            return RayPlacement.of(table[k])
    return RayPlacement()


def parse_placements(text: str) -> dict[str, RayPlacement]:
    """Placements from JSON text, e.g. ``'{"container": {"resources": {"docker": 1}}, "*": {"num_cpus": 0.5}}'``.

    Raises:
        ConfigError: not a JSON object of objects, or a bad placement.
    """
    from ...utils.jsonargs import json_object

    data = json_object(text, "AGENTFLY_GYM_RAY_PLACEMENT (spec kind/name/key -> placement fields)")
    return {str(k): RayPlacement.of(v) for k, v in data.items()}
