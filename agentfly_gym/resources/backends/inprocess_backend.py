"""Backend for :class:`~agentfly_gym.resources.spec.InProcessSpec`."""

from __future__ import annotations

from ..inprocess import InProcessResource
from ..spec import InProcessSpec


def create(spec: InProcessSpec, labels: dict[str, str]) -> InProcessResource:
    """The ``("inprocess", "")`` backend: an unstarted :class:`InProcessResource` for ``spec``."""
    return InProcessResource(spec, labels=labels)
