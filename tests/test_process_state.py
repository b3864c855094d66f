"""Process-wide state belongs to a resource manager or to the application, not to modules.

An AST count pins how many module globals the package rebinds and how many ``os.register_at_fork`` hooks it
registers, so that growth is visible in review; the other tests check what replaced them: constructing and
using an environment installs no signal handler, a manager owns (and closes) its Docker client and thread
pool, the Ray host gets its environment through Ray instead of changing ``os.environ``.
"""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentfly_gym", "plugins")

# Each rebinding of a module global, by module.  teardown: the process's exit hook and SIGTERM handler (the
# application's, one place); engine: whether a Docker engine answers (a fact about the host, cached);
# scienceworld: a warning logged once per process; verl runtime: the worker's runtime (verl makes a new agent
# loop per trajectory, so what they share is per process), swapped in one function.
GLOBAL_REBINDINGS = {
    "agentfly_gym/resources/teardown.py": 3,
    "agentfly_gym/resources/containers/docker/engine.py": 1,
    "agentfly_gym/envs/scienceworld/simulator.py": 1,
    "plugins/verl/agentfly_gym_verl/runtime.py": 1,
}
# The one fork hook: agentfly_gym/utils/forks.py (what a forked child forgets, documented there).
FORK_HOOKS = {"agentfly_gym/utils/forks.py": 1}


def _package_trees():
    for d in PACKAGES:
        for p in sorted((ROOT / d).rglob("*.py")):
            if ".venv" in p.parts or "build" in p.parts:
                continue
            yield p.relative_to(ROOT).as_posix(), ast.parse(p.read_text(encoding="utf-8"), filename=str(p))


def _count(match) -> dict[str, int]:
    out: dict[str, int] = {}
    for rel, tree in _package_trees():
        n = sum(1 for node in ast.walk(tree) if match(node))
        if n:
            out[rel] = n
    return out


def _is_register_at_fork(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "register_at_fork") or \
        (isinstance(f, ast.Name) and f.id == "register_at_fork")


def test_module_globals_rebound_are_pinned():
    """``global`` statements in the package (23 before the managers owned their state): a new one is a
    decision to write down here, with where it lives and why."""
    found = _count(lambda node: isinstance(node, ast.Global))
    assert found == GLOBAL_REBINDINGS, (
        f"`global` statements changed: {found} (pinned: {GLOBAL_REBINDINGS}); process-wide state belongs to a "
        "resource manager (agentfly_gym.resources.services) or to the application")
    assert sum(found.values()) == 6


def test_fork_hooks_live_in_one_place():
    """``os.register_at_fork`` calls (5 before): only agentfly_gym/utils/forks.py registers one."""
    found = _count(_is_register_at_fork)
    assert found == FORK_HOOKS, (f"register_at_fork calls: {found}; register what a forked child must forget "
                                 "with agentfly_gym.utils.forks.forget_in_child instead")


def test_the_ray_host_never_changes_os_environ():
    """The Ray host's setting (``AGENTFLY_GYM_MANAGER=local``) travels in the actor's ``runtime_env``."""
    for rel, tree in _package_trees():
        if not rel.startswith("agentfly_gym/resources/ray/"):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                assert not (isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ"), \
                    f"{rel}:{node.lineno} assigns to os.environ"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert not (ast.unparse(node.func.value) == "os.environ"
                            and node.func.attr in ("update", "setdefault", "pop", "clear")), \
                    f"{rel}:{node.lineno} changes os.environ"
    pytest.importorskip("ray")
    from agentfly_gym.resources.ray.host import host_actor_options
    from agentfly_gym.resources.ray.placement import RayPlacement

    opts = host_actor_options(RayPlacement())
    assert opts["runtime_env"] == {"env_vars": {"AGENTFLY_GYM_MANAGER": "local"}}


SIGNALS_CHILD = textwrap.dedent("""
    import signal, gymnasium, agentfly_gym
    before = signal.getsignal(signal.SIGTERM)
    env = gymnasium.make("agentfly/Chess-v0", mode="play", engine_depth=1)
    after_make = signal.getsignal(signal.SIGTERM)
    env.reset(seed=0)           # the default manager is made here, on the background loop
    env.step("Action: e2e4")
    after_use = signal.getsignal(signal.SIGTERM)
    env.close()
    print(before is signal.SIG_DFL, after_make is before, after_use is before)
""")


def test_making_and_using_an_env_installs_no_signal_handler():
    """Signal handlers are the application's: ``gymnasium.make``, ``reset`` and ``step`` leave SIGTERM's handler
    as it was (making an env used to install the library's teardown handler)."""
    out = subprocess.run([sys.executable, "-c", SIGNALS_CHILD], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True"] * 3, (out.stdout, out.stderr[-2000:])


def test_the_application_installs_the_teardown_handler_and_a_run_puts_back_what_was_there():
    """``teardown.install()`` is how an application asks for the SIGTERM teardown; the runner's
    ``sigterm_teardown()`` installs it for the block only, and leaves an installed one or the application's own
    handler alone."""
    from agentfly_gym.resources import teardown

    saved = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with teardown.sigterm_teardown() as installed:
            assert installed
            assert signal.getsignal(signal.SIGTERM) is teardown._on_sigterm
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert teardown.install()
        with teardown.sigterm_teardown() as installed:
            assert installed
        assert signal.getsignal(signal.SIGTERM) is teardown._on_sigterm  # installed before the block: kept

        def mine(signum, frame):
            return None

        signal.signal(signal.SIGTERM, mine)
        with teardown.sigterm_teardown() as installed:
            assert not installed
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, saved)


async def test_a_manager_owns_and_closes_its_docker_engine_access():
    """The Docker client, thread pool and disk watchdog are a manager's (``manager.services``), made on first
    use and closed with the manager; two managers share none of them (they used to be module globals)."""
    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.resources.containers.docker.engine import DockerEngine

    a, b = ResourceManager(), ResourceManager()
    ea, eb = a.services.get(DockerEngine), b.services.get(DockerEngine)
    assert ea is a.services.get(DockerEngine)
    assert ea is not eb
    pool = ea.pool()
    assert await ea.in_thread(lambda x: x + 1, 1) == 2
    watchdog = ea.watchdog()
    await a.aclose()
    assert DockerEngine not in a.services
    with pytest.raises(RuntimeError):  # the thread pool was shut down with its manager
        pool.submit(print)
    assert watchdog._stop.is_set()
    assert await eb.in_thread(lambda: 3) == 3  # the other manager's is untouched
    b.close()
    await asyncio.sleep(0)
