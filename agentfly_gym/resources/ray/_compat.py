"""What the Ray manager needs of Ray that Ray offers no public API for (version-guarded).

Read in Ray 2.60 (:data:`CHECKED_RAY`, the version requirements/lock.txt pins); tests/test_ray_compat.py fails
when the installed or the pinned Ray is another version, or when the Ray code relied on below changed shape.
Everything else of Ray the manager uses is public (``ray.init``, actors, ``ray.nodes``,
``ray.get_runtime_context``).

1. **Ray's SIGTERM handlers during ``ray.init``** (:func:`sigterm_handlers_to`).  ``ray.init`` installs a
   handler of its own: the driver's (``sys.exit``) at its very start, then, when it starts a local cluster, the
   head node's (kill Ray's processes, then ``sys.exit(1)``), both through
   ``ray._private.utils.set_sigterm_handler``.  Ray has no option to leave SIGTERM alone or to install its
   handler after the start; blocking the signal (``pthread_sigmask``) would be inherited by every Ray process
   the start spawns.  So while ``ray.init`` runs that one function is replaced by the caller's recorder, and
   the caller decides afterwards which handler is in charge (:func:`~agentfly_gym.resources.teardown.hold_sigterm`).
2. **Which clients' processes have ended** (:func:`job_is_dead`, :func:`live_worker_ids`): the cluster's job and
   worker tables in the control store (GCS), read through ``ray._private.state.state`` (the accessor
   ``ray.nodes()`` itself reads the node table with).  The public ``ray.util.state`` reads the same tables
   through the dashboard's HTTP server, which a cluster need not run (``include_dashboard=False``).

On a Ray version not in :data:`CHECKED_RAY` the functions still try (each caller tolerates their failure: the
SIGTERM hold becomes a plain ``ray.init``, a liveness round is skipped) and a warning says once that the
version was not checked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ...utils.versions import is_checked, warn_once

__all__ = ["CHECKED_RAY", "RELIED_ON_SOURCES", "check_version", "job_is_dead", "live_worker_ids", "sigterm_handlers_to"]

log = logging.getLogger(__name__)

#: Ray versions whose code this module was read against (prefixes of ``ray.__version__``).
CHECKED_RAY = ("2.60.",)

#: sha256 (first 16 hex digits) of ``inspect.getsource`` of the Ray code relied on here, as of the checked
#: versions; tests/test_ray_compat.py fails when one changes (then re-read it, update this module and the digests).
RELIED_ON_SOURCES = {
    "ray._private.utils.set_sigterm_handler": "ed3972732fec1baa",
    "ray._private.node.Node._register_shutdown_hooks": "4ff0d6b6d8d3be21",
    "ray._private.state.GlobalState.job_table": "c828930bff148196",
    "ray._private.state.GlobalState.workers": "2961ad75f6c8e7c5",
}

_warned: set[str] = set()


def check_version(ray: Any) -> bool:
    """Whether ``ray`` (the module) is a checked version; warns once per unchecked version."""
    version = str(getattr(ray, "__version__", "?"))
    if is_checked(version, CHECKED_RAY):
        return True
    warn_once(_warned, version, log, "Ray %s is installed; agentfly_gym.resources.ray._compat was checked against Ray "
              "%s only (SIGTERM during ray.init, the liveness of a pool's clients may misbehave)",
              version, ", ".join(v + "x" for v in CHECKED_RAY))
    return False


@contextlib.contextmanager
def sigterm_handlers_to(record: Callable[[Any], None]) -> Iterator[bool]:
    """Within the block, each SIGTERM handler Ray installs through ``set_sigterm_handler`` is passed to
    ``record`` instead of ``signal.signal``.  Yields whether the redirection is in place (False where this Ray
    has no such function; Ray then installs its handlers itself).  Not thread-safe: call from the main thread,
    around ``ray.init`` only."""
    import ray

    check_version(ray)
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "set_sigterm_handler", None)
    if original is None:
        yield False
        return
    utils.set_sigterm_handler = record
    try:
        yield True
    finally:
        utils.set_sigterm_handler = original


def _state() -> Any:
    import ray
    from ray._private.state import state

    check_version(ray)
    return state


def job_is_dead() -> dict[str, bool]:
    """Job id (hex) -> whether the control store records the job as dead (its driver ended).  Blocking."""
    return {j["JobID"]: bool(j["IsDead"]) for j in _state().job_table()}


def live_worker_ids() -> set[str]:
    """The ids (hex) of the cluster's live worker processes (tasks' and actors'; not drivers).  Blocking."""
    return set(_state().workers())
