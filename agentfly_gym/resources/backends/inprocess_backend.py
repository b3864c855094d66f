"""Backend for :class:`~agentfly_gym.resources.spec.InProcessSpec`."""

from __future__ import annotations

from ..inprocess import InProcessResource


def create(spec, manager) -> InProcessResource:
    return InProcessResource(spec, labels={"agentfly.manager": manager.id, "agentfly.pool": spec.key})
