"""The agentfly-gym command, run as a real subprocess as a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from proctools import default_sigint, live_processes, mark_tree, wait_gone
from waiting import wait_until


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentfly_gym", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def test_envs_lists_every_environment():
    r = cli("envs")
    assert r.returncode == 0, r.stderr
    for name in ("Chess-v0", "ScienceWorld-v0", "ALFWorld-v0", "WebShop-v0", "R2EGym-v0"):
        assert name in r.stdout


@pytest.mark.parametrize("argv", [["-vvv", "envs"], ["envs", "-vv"], ["envs", "--verbose", "-v"]])
def test_verbosity_flags_are_accepted_anywhere(argv):
    r = cli(*argv)
    assert r.returncode == 0 and "Chess-v0" in r.stdout, r.stderr


@pytest.mark.parametrize("args, message", [
    (["--env", "Checkers-v0"], "unknown environment"),
    (["--env", "Chess-v0", "-n", "0"], "num_trajectories"),
    (["--env", "Chess-v0", "--env-kwargs", "{bad"], "not JSON"),
    (["--env", "Chess-v0", "--env-kwargs", '{"Chess-v0": {"modee": "play"}}'], "modee"),
    (["--env", "Chess-v0", "--temperature", "-1"], "temperature"),
    (["--env", "Chess-v0", "--policy", "gpt-17"], "policy"),
    (["--env", "Chess-v0", "--output-dir", "/proc/agentfly-nope"], "cannot be written"),
])
def test_bad_rollout_arguments_are_clear_errors(args, message):
    r = cli("rollout", "--policy", "random", "--tokenizer", "qwen3", "--no-progress", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["sigterm", "double-ctrl-c"])
def test_interrupt_saves_finished_trajectories_and_cleans_up(tmp_path, signals, monkeypatch):
    """Two quick WebShop episodes finish; two games against a Stockfish thinking 900 s a move (its step and
    reset timeouts above that) cannot end in under 15 minutes, far past the wait for the WebShop episodes
    (with 60 s a move, Chess's default 60 s step timeout ended a game first when a loaded machine made the
    WebShop episodes slower than that), so SIGTERM (or Ctrl-C pressed twice, the second one once the first one's
    save is logged, during the tear-down), sent as soon as the CLI's ``-v`` log reports both WebShop trajectories
    finished, must save exactly those two and stop every process (the signal stops the engine's search at once)."""
    out = tmp_path / "run"
    kwargs = {"Chess-v0": {"mode": "play", "engine_depth": None, "engine_movetime": 900.0, "skill_level": 20,
                           "step_timeout": 1800.0, "reset_timeout": 1800.0},
              "WebShop-v0": {}}
    marker = mark_tree(monkeypatch)  # the CLI's processes carry it, even once orphaned: other runs do not count
    before = live_processes(["java", "stockfish"], marker=marker)
    proc = subprocess.Popen([sys.executable, "-m", "agentfly_gym", "-v", "rollout", "--env", "WebShop-v0", "--env",
                             "Chess-v0", "--policy", "random", "--tokenizer", "qwen3", "-n", "4",
                             "--max-turns", "100", "--no-progress", "--env-kwargs", json.dumps(kwargs),
                             "--output-dir", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    finished = re.compile(r"trajectory traj-\d+ \((agentfly/[\w-]+)\) finished")
    t0 = time.monotonic()
    done: list[str] = []
    while time.monotonic() - t0 < 300 and proc.poll() is None:
        done = [m.group(1) for m in map(finished.search, list(lines)) if m]
        if len(done) >= 2:
            break
        time.sleep(0.2)
    assert done == ["agentfly/WebShop-v0"] * 2, "".join(lines)
    assert live_processes(["stockfish"], marker=marker) - before, "the chess games should still be running"
    repeated = False
    for i, sig in enumerate(signals):
        if i:  # the second Ctrl-C once the first one's save is done, while the games are torn down
            wait_until(lambda: any("rollout interrupted: saved" in x for x in list(lines)) or proc.poll() is not None,
                       120, "the first signal's save")
            repeated = proc.poll() is None
        proc.send_signal(sig)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    # the shell's convention, 128 + the signal: 143 for SIGTERM (it was 130 for both), 130 for Ctrl-C
    assert proc.returncode == 128 + signals[0], "".join(lines)
    if repeated:  # the second one reached the CLI while it was stopping: it said so, or (on a loaded machine) it
        # arrived once the CLI had finished stopping; either way it gives no traceback and changes nothing saved
        out_text = "".join(lines)
        assert "already stopping" in out_text or "Traceback" not in out_text, out_text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True, summary
    assert (summary["trajectories"], summary["errors"]) == (2, 0), summary
    assert (out / "trajectories.parquet").exists()
    assert not wait_gone(live_processes(["java", "stockfish"], marker=marker) - before, 20)


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_scienceworld_without_tracebacks(tmp_path, monkeypatch):
    """A terminal's Ctrl-C sends SIGINT to the whole foreground process group.  The JVMs used to be in it and
    died at once, and every rollout's py4j client printed "Answer from Java side is empty" tracebacks; now they
    live in their own group and the CLI stops them in order: exit 130, no traceback, no JVM left."""
    marker = mark_tree(monkeypatch)
    before = live_processes(["java"], marker=marker)
    proc = subprocess.Popen([sys.executable, "-m", "agentfly_gym", "-v", "rollout", "--env", "ScienceWorld-v0",
                             "--policy", "random", "-n", "1000", "--concurrency", "4", "--max-turns", "400",
                             "--no-progress", "--output-dir", str(tmp_path / "run")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=dict(os.environ),
                            preexec_fn=default_sigint)  # a test run in the background has SIGINT ignored
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    wait_until(lambda: live_processes(["java"], marker=marker) - before, 300, "the rollouts' JVMs")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300 and proc.poll() is None and not any("finished" in x for x in list(lines)):
        time.sleep(0.1)
    # one trajectory finished: the other rollouts (concurrency 4) are mid-episode, on the live JVMs; 1,000 episodes
    # planned, so that the run cannot end before the Ctrl-C
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # say how far the stop got (its -v log), then end it
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the CLI did not exit within 120 s of the Ctrl-C; its log:\n" + "".join(lines)[-6000:])
    reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Answer from Java side is empty" not in err, err
    assert not wait_gone(live_processes(["java"], marker=marker) - before, 20)


def test_a_refused_run_leaves_no_default_output_folder(tmp_path):
    """Without --output-dir a run gets a new runs/<UTC date-time>; a run refused before writing anything (an
    unknown policy) removes it again instead of leaving empty folders behind."""
    r = subprocess.run([sys.executable, "-m", "agentfly_gym", "rollout", "--env", "Chess-v0", "--policy", "gpt-17",
                        "--no-progress"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ))
    assert r.returncode == 2 and "policy" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # five CLI runs, each a Python start-up with the imports
def test_append_without_a_seed_plays_new_episodes(tmp_path):
    """``--append`` without ``--seed`` continues the seeds after the run's (the first batch's episodes are not
    replayed, as they were when the seed restarted at 0); an explicit ``--seed`` is honoured, with a one-line
    warning when it replays seeds already there.  Three short random-policy Chess runs."""
    import pyarrow.parquet as pq

    out = str(tmp_path / "run")
    quick = ["rollout", "--env", "Chess-v0", "--policy", "random", "--tokenizer", "qwen3", "--max-turns", "1",
             "--no-progress", "--output-dir", out]

    def seeds() -> list[int]:
        return pq.read_table(f"{out}/trajectories.parquet", columns=["seed"]).column("seed").to_pylist()

    for extra in (["-n", "2", "--group-size", "2"], ["-n", "1", "--append"]):
        r = cli(*quick, *extra)
        assert r.returncode == 0 and "WARNING" not in r.stderr, r.stderr
    assert seeds() == [0, 0, 1]
    r = cli(*quick, "-n", "1", "--append", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert seeds() == [0, 0, 1, 1]
    warning = [line for line in r.stderr.splitlines() if "WARNING" in line]
    assert len(warning) == 1 and "--seed 1 replays 1 seed(s)" in warning[0] and "(next: 2)" in warning[0], r.stderr
    # a seed out of range is refused before anything plays (it was an OverflowError after the episodes, losing them)
    for bad, says in ((["--seed", "-5"], "--seed=-5 must be an integer"),
                      (["--seed", str(2**63 - 1), "-n", "2"], "past 2**63 - 1")):
        r = cli(*quick, "--append", *bad)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert seeds() == [0, 0, 1, 1]
