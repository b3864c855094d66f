"""Starting a local Ray from the manager: ``ray.init`` with SIGTERM held until the start has finished."""

from __future__ import annotations

from typing import Any

from .. import teardown
from . import _compat

__all__ = ["start_ray"]


def start_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs, log_to_driver=False)`` with SIGTERM held until it has finished (see
    :func:`~agentfly_gym.resources.teardown.hold_sigterm`).

    ``ray.init`` first replaces the process's SIGTERM handler with one that raises ``SystemExit``, and a
    SIGTERM during the seconds its start takes then stops it half-way and orphans the dashboard's helper
    processes.  During the start the handlers Ray installs are only recorded (:func:`._compat.sigterm_handlers_to`;
    Ray has no public option for this); afterwards the application's own handler is back in charge
    (``agentfly-gym rollout`` cancels the run and writes its summary), else Ray's.  A SIGTERM that came
    meanwhile is delivered then.
    """
    import ray

    with teardown.hold_sigterm() as hold, _compat.sigterm_handlers_to(hold.keep):
        ray.init(log_to_driver=False, **kwargs)
