"""The Ray internals :mod:`agentfly_gym.resources.ray._compat` relies on are those it was read against.

Fails loudly on a Ray it was not checked with (installed or pinned in requirements/lock.txt), when a function it
relies on changed, or when ``ray.init`` installs a SIGTERM handler another way than through the one function
:func:`~agentfly_gym.resources.ray._compat.sigterm_handlers_to` redirects.  Then re-read the code named in
``_compat.RELIED_ON_SOURCES`` against the new Ray, update ``_compat`` and its digests.  No Ray cluster is
started here: tests/test_ray_manager.py exercises the same code on a real cluster (SIGTERM during the start,
the leases of a SIGKILLed client).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import re
import signal
from pathlib import Path

from agentfly_gym.resources.ray import _compat

REPO = Path(__file__).resolve().parents[1]
FIX = "check agentfly_gym/resources/ray/_compat.py against it and update CHECKED_RAY / RELIED_ON_SOURCES"


def _resolve(qual: str):
    parts = qual.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    for p in parts[i:]:
        obj = getattr(obj, p)
    return obj


def test_installed_and_pinned_ray_are_checked_versions():
    import ray

    assert ray.__version__.startswith(_compat.CHECKED_RAY), f"Ray {ray.__version__} is installed; {FIX}"
    pins = re.findall(r"^ray==(\S+)", (REPO / "requirements" / "lock.txt").read_text(), flags=re.M)
    assert pins, "requirements/lock.txt pins no ray"
    assert all(p.startswith(_compat.CHECKED_RAY) for p in pins), f"requirements/lock.txt pins Ray {pins}; {FIX}"


def test_relied_on_ray_code_is_unchanged():
    changed = {qual: hashlib.sha256(inspect.getsource(_resolve(qual)).encode()).hexdigest()[:16]
               for qual in _compat.RELIED_ON_SOURCES}
    changed = {q: d for q, d in changed.items() if d != _compat.RELIED_ON_SOURCES[q]}
    assert not changed, f"Ray code relied on changed (new digests {changed}); {FIX}"


def test_ray_init_installs_its_sigterm_handlers_only_through_set_sigterm_handler():
    from ray._private import node, worker

    init = inspect.getsource(worker.init)
    assert "ray._private.utils.set_sigterm_handler(" in init, f"ray.init no longer calls set_sigterm_handler; {FIX}"
    hooks = inspect.getsource(node.Node._register_shutdown_hooks)
    assert "ray._private.utils.set_sigterm_handler(" in hooks, f"Ray's head node sets SIGTERM another way; {FIX}"
    for module in (worker, node):
        assert "signal.signal(" not in inspect.getsource(module), f"{module.__name__} calls signal.signal; {FIX}"


def test_sigterm_handlers_are_recorded_not_installed():
    import ray._private.utils as ray_utils

    before = signal.getsignal(signal.SIGTERM)
    recorded = []

    def handler(signum, frame):  # what Ray would install
        raise SystemExit(signum)

    with _compat.sigterm_handlers_to(recorded.append) as redirected:
        assert redirected
        ray_utils.set_sigterm_handler(handler)  # as ray.init calls it
        assert signal.getsignal(signal.SIGTERM) is before
    assert recorded == [handler]
    assert ray_utils.set_sigterm_handler is not recorded.append  # put back


def test_an_unchecked_ray_version_warns(monkeypatch, caplog):
    import ray

    assert _compat.check_version(ray)
    monkeypatch.setattr(ray, "__version__", "2.99.0")
    with caplog.at_level(logging.WARNING, logger=_compat.__name__):
        assert not _compat.check_version(ray)
    assert "Ray 2.99.0" in caplog.text
    assert "checked against Ray 2.60.x" in caplog.text

