"""The Docker container backend: :class:`~.container.DockerContainer` and its ``create(spec, labels)``.

Modules: :mod:`.container` (the resource), :mod:`.files` (``put_files`` / ``get_file`` as tar streams),
:mod:`.ports` (published ports on 127.0.0.1), :mod:`.engine` (docker-py; :class:`.engine.DockerEngine`, one
client, one thread pool and one disk watchdog per resource manager, in its ``services``: every docker-py call
blocks, so the event loop never waits on the engine), :mod:`.exec_stream` (an exec's output over the Engine
API), :mod:`.disk` (the kernel-enforced disk and inode limit: the writable layer on a
loop-mounted file system), :mod:`.watchdog` (the disk limit where neither that nor a quota can be had).

Containers run with (``ContainerSpec`` field -> Docker setting):

* ``cpus`` -> ``nano_cpus``; ``memory`` -> ``mem_limit`` = ``memswap_limit`` (no swap beyond the
  limit, so a memory hog is OOM-killed inside it); ``pids`` -> ``pids_limit`` (stops fork bombs);
* ``disk`` -> where the manager runs as root beside a local overlay2 engine (the usual case, e.g. the
  engine of ``scripts/docker-engine.sh``), the container's writable layer lives on an ext4 file system of
  ``disk`` bytes with one inode per 8 KiB (:mod:`.disk`, ``limits_enforced["disk"] == "volume"``): the
  kernel refuses a write or a new file past it (``ENOSPC``), at any speed.  Else ``storage_opt={"size":
  disk}`` where the engine's storage driver supports it (overlay2 on xfs with ``pquota``, btrfs, zfs;
  probed once per manager; no inode limit).  Elsewhere
  ``ulimits`` ``fsize=disk`` (no file grows past it: ``EFBIG``) and a host-side watchdog that sums the
  container's writable layer (``GraphDriver.Data.UpperDir``, when the engine is local) every
  :data:`.watchdog.DISK_POLL` seconds and kills the container once it exceeds ``disk``: its exec then raises
  :class:`~agentfly_gym.errors.ResourceDied` saying so, and the pool replaces it;
* ``network=False`` -> networking disabled (a private network namespace with loopback only, like
  ``network_mode="none"`` but with no network sandbox for the engine to build on each start) and
  ``/etc/hosts`` a read-only bind of :data:`.etc_hosts.HOSTS_FILE`; ``True`` -> the default bridge;
* ``ports`` -> each published on ``127.0.0.1`` at a host port the engine picks, read back after
  start into ``DockerContainer.published_ports`` (``ContainerResource.endpoint(port)``);
* ``mounts`` -> typed bind mounts (docker-py ``Mount``), read-only where ``Mount.read_only``; a missing
  source is refused (ConfigError), never created; ``env``, ``user``, ``workdir``;
* always: the container log capped (``json-file``, ``max-size`` :data:`.container.LOG_MAX_SIZE`, one
  file kept: about 2 MB on the host, whatever the container writes to its stdout);
  ``init=True`` (docker-init reaps zombies as PID 1), ``security_opt=["no-new-privileges"]``,
  ``cap_drop=["ALL"]`` with :data:`.container.CAP_ADD` added back, and the manager's ownership labels
  (:mod:`..ownership`: ``agentfly=1``, ``agentfly.manager``, ``agentfly.pool``, ``agentfly.pid``,
  ``agentfly.pid_start``, ``agentfly.host``), so a dead owner's containers can be reaped.

Images must provide ``/bin/sh`` and ``timeout`` (coreutils).  The project's base image
(:mod:`..images`) has them.

Episode isolation: ``reset()`` (on every re-acquisition) replaces the container with a fresh one
of the same image and settings, so nothing written in one episode (``/root``, ``/etc``,
``/usr/local``, a ``.pth`` in site-packages) is seen by the next; ``park()`` (when the pool keeps the
instance idle) does it at once, so no process of the last episode keeps running while idle and the
next acquisition finds a fresh container ready.

Cleanup: :meth:`DockerContainer.adestroy` removes the container (``manager.aclose()`` closes
every pool); :meth:`DockerContainer.destroy` is called at interpreter exit and on SIGTERM by
the manager's teardown (:mod:`agentfly_gym.resources.teardown`); what a killed process left is
removed by :func:`..reaper.reap_docker_orphans` (``agentfly-gym resources gc``).
"""

from .container import CAP_ADD, DockerContainer, create
from .engine import docker_available

__all__ = ["CAP_ADD", "DockerContainer", "create", "docker_available"]
