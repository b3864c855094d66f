"""scripts/docker-engine.sh, run with stand-in ``docker`` and ``dockerd`` executables on PATH.

The real engine of this machine is shared and must not be restarted by a test, so the script starts a
stand-in ``dockerd`` (a shell script of that name, which is what the script checks in /proc/PID/comm) that
records the files it has open and then waits; the stand-in ``docker info`` answers once it has started.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from proctools import wait_gone

REPO = Path(__file__).resolve().parent.parent


def test_dockerd_does_not_inherit_the_start_lock(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ready, fds, shim = tmp_path / "ready", tmp_path / "fds", tmp_path / "shim.pid"
    # like dockerd, it leaves a child (a container shim) that outlives it when it crashes
    (bin_dir / "dockerd").write_text(f"#!/bin/bash\nsleep 60 &\necho $! >> {shim}\nls -l /proc/$$/fd > {fds}\n"
                                     f"touch {ready}\nwhile :; do sleep 0.2; done\n")
    (bin_dir / "docker").write_text(f"#!/bin/bash\n[[ -f {ready} ]]\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    pidfile = tmp_path / "dockerd.pid"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", AGENTFLY_DOCKERD_PIDFILE=str(pidfile),
               AGENTFLY_DOCKERD_LOG=str(tmp_path / "dockerd.log"), AGENTFLY_DOCKERD_WAIT="5")
    try:
        r = subprocess.run(["bash", str(REPO / "scripts" / "docker-engine.sh"), "start"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "ready" in r.stdout, r.stdout + r.stderr
        held = fds.read_text()
        assert f"{pidfile}.lock" not in held, held  # held by the stand-in dockerd before the fix
        # dockerd crashes, its shim lives on: a new start is not refused by a lock the shim inherited
        ready.unlink()
        dead = int(pidfile.read_text())
        os.kill(dead, signal.SIGKILL)
        pidfile.unlink()  # its zombie may linger here (a container's init need not reap it): it is gone
        assert not wait_gone([dead], 10)
        r = subprocess.run(["bash", str(REPO / "scripts" / "docker-engine.sh"), "start"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        pids = (pidfile.read_text().split() if pidfile.exists() else []) + (shim.read_text().split() if shim.exists() else [])
        for pid in pids:  # the second stand-in dockerd and both shims
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
