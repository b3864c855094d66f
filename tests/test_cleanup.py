"""No simulator or engine process outlives the Python process that started it.

Each case runs a real child Python process that starts real Stockfish engines and a
ScienceWorld JVM through the library, then ends it in a different way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from proctools import alive, default_sigint, wait_gone

CHILD = textwrap.dedent("""
    import sys, time, gymnasium, agentfly_gym
    from agentfly_gym.resources import teardown
    teardown.install()         # the application's choice: SIGTERM tears down (making an env installs nothing)
    chess = gymnasium.make("agentfly/Chess-v0", mode="play", engine_depth=1)
    chess.reset(seed=0)
    sw = gymnasium.make("agentfly/ScienceWorld-v0", max_instances=1)
    sw.reset(seed=0)
    pids = [r.obj.pid for e in (chess, sw) for r in e.unwrapped.scope.resources.values()]
    print(*pids, flush=True)
    how = sys.argv[1]
    if how == "exit":
        sys.exit(0)            # no close(): the exit hook must clean up
    if how == "error":
        raise RuntimeError("the user's script crashed")
    time.sleep(600)            # killed by the test
""")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "error", "sigterm", "sigint"])
def test_no_process_outlives_its_python(how):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ),
                            preexec_fn=default_sigint)
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read()
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2
    assert all(alive(p) for p in pids)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigint":
        proc.send_signal(signal.SIGINT)
    proc.wait(60)
    left = wait_gone(pids, 20)
    assert not left, f"processes {left} of {pids} (engine, JVM) outlived their Python ({how}): {proc.stderr.read()[-2000:]}"
    if how == "sigterm":
        assert proc.returncode == -signal.SIGTERM


def test_install_is_idempotent_and_leaves_an_application_handler_alone():
    """teardown.install() is the one place the SIGTERM handler is installed (the application calls it:
    ``agentfly-gym``, the rollout runner, a script): twice is once, and an application's own handler stays."""
    code = textwrap.dedent("""
        import signal
        from agentfly_gym.resources import teardown
        assert teardown.install() and teardown.install()
        assert signal.getsignal(signal.SIGTERM) is teardown._on_sigterm
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        mine = lambda s, f: None
        signal.signal(signal.SIGTERM, mine)
        assert teardown.install() is False and signal.getsignal(signal.SIGTERM) is mine
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
