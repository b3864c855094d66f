"""Containers: the API every container backend implements, and the backends (Docker, the sandbox)."""

from .api import DEFAULT_MAX_OUTPUT, ContainerResource, ExecResult

__all__ = ["DEFAULT_MAX_OUTPUT", "ContainerResource", "ExecResult"]
