"""Containers: isolated Linux environments for tools and environments, on Docker or in a sandbox.

One concern per module:

* :mod:`.api`: :class:`ContainerResource` and :class:`ExecResult`, what tools and environments use
  (``exec``, ``put_files``, ``get_file``) and the reset contract every backend keeps;
* :mod:`.output`: an exec's output, head and tail kept with one truncation marker on every backend;
* :mod:`.ownership`: the labels naming a resource's owner, whether that owner is alive, and reaping
  what dead owners left on both backends (``agentfly-gym resources gc``);
* :mod:`.choice`: which backend ``ContainerSpec(backend="auto")`` gets;
* :mod:`.docker`: the Docker backend (docker-py against a Docker engine);
* :mod:`.sandbox`: the daemon-less backend (bubblewrap; cgroups, rootfs, bwrap and disk volume in
  their own modules);
* :mod:`.images`: building the project's images offline (``agentfly-gym images build``).

Backends are registered in :mod:`agentfly_gym.resources.backends`, which says how to add one.
"""

from .api import DEFAULT_MAX_OUTPUT, ContainerResource, ExecResult

__all__ = ["DEFAULT_MAX_OUTPUT", "ContainerResource", "ExecResult"]
