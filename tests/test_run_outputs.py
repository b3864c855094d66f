"""Run output folders (agentfly_gym.rollout.outputs): concurrent runs, interrupted runs, overwrite and append.

The end-to-end test runs the real CLI as subprocesses (random policy, real Chess env and Stockfish), as a user
would: two runs started together into one folder, a run refused while another writes the folder, a run
interrupted with SIGINT while a complete run is in the folder, and ``--overwrite`` twice (``make demo``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from proctools import default_sigint, live_processes, mark_tree, wait_gone

from agentfly_gym.rollout import Trajectory, load_trajectories
from agentfly_gym.rollout.outputs import (INTERRUPTED_DIR, LOCK_NAME, OutputBusyError, OutputExistsError, RunOutput,
                                          check_output_dir)
from agentfly_gym.rollout.step import load_step_rows

QUICK = ["--env", "Chess-v0", "--policy", "random", "--tokenizer", "qwen3", "-n", "4", "--max-turns", "3",
         "--no-progress"]


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agentfly_gym", "rollout", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ), preexec_fn=default_sigint)


def _every_file_loads(folder: Path) -> dict[str, int]:
    """Rows of every visible trajectory/step file under ``folder`` (each must load), by relative path."""
    rows = {}
    for path in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts) or not path.is_file():
            continue
        if path.name == "steps.parquet":
            rows[str(path.relative_to(folder))] = len(load_step_rows(path))
        elif path.suffix in (".parquet", ".jsonl"):
            rows[str(path.relative_to(folder))] = len(load_trajectories(path))
        elif path.name == "summary.json":
            json.loads(path.read_text())
    return rows


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


@pytest.mark.slow
def test_concurrent_and_interrupted_runs_lose_nothing(tmp_path, monkeypatch):
    out = tmp_path / "run"
    # 1. two runs started together into one folder: one writes it, the other is refused by the lock (or, if
    #    they did not overlap, appends); never a corrupt file, never a run's trajectories lost without a word
    first = [_cli(*QUICK, "--seed", str(seed), "--append", "--output-dir", str(out)) for seed in (0, 100)]
    results = [(p.pid, *p.communicate(timeout=300), p.returncode) for p in first]
    ok = 0
    for (pid, stdout, stderr, rc), other in zip(results, reversed(results)):
        if rc == 2:
            assert "is being written by" in stderr and "Traceback" not in stderr, stderr
            assert f"process {other[0]} " in stderr or "has not said which yet" in stderr, stderr
        else:
            assert rc == 0, stderr
            ok += 1
    assert ok >= 1
    rows = _every_file_loads(out)
    assert rows == {"trajectories.jsonl": 4 * ok, "trajectories.parquet": 4 * ok}, rows
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == 4 * ok
    assert summary["interrupted"] is False
    ids = [t.trajectory_id for t in load_trajectories(out / "trajectories.parquet")]
    assert len(set(ids)) == len(ids)
    complete = _snapshot(out)

    # 2. a plain run into a folder that holds a run is refused before anything runs
    p = _cli(*QUICK, "--output-dir", str(out))
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 2 and "already holds a run" in stderr and "--overwrite" in stderr, stderr

    # 3. a slow --overwrite run (games against a Stockfish thinking 60 s a move) holds the folder: a second run
    #    is refused with a message naming it; then it is interrupted: the complete run stays as it was
    marker = mark_tree(monkeypatch)
    kwargs = {"Chess-v0": {"mode": "play", "engine_depth": None, "engine_movetime": 60.0, "skill_level": 20}}
    slow = _cli("--env", "Chess-v0", "--policy", "random", "--tokenizer", "qwen3", "-n", "2", "--max-turns", "100",
                "--no-progress", "--env-kwargs", json.dumps(kwargs), "--overwrite", "--output-dir", str(out))
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(slow.stderr), daemon=True)
    reader.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300 and slow.poll() is None:
        if f'"pid": {slow.pid},' in (out / LOCK_NAME).read_text() and live_processes(["stockfish"], marker=marker):
            break
        time.sleep(0.2)
    assert slow.poll() is None, "".join(err)
    busy = _cli(*QUICK, "--append", "--output-dir", str(out))
    _, stderr = busy.communicate(timeout=300)
    assert busy.returncode == 2 and f"process {slow.pid} (" in stderr and "agentfly_gym" in stderr, stderr
    slow.send_signal(signal.SIGINT)
    slow.wait(timeout=120)
    reader.join(timeout=10)
    assert slow.returncode == 130, "".join(err)
    assert _snapshot(out) == complete  # nothing completed earlier is lost
    partial = json.loads((out / INTERRUPTED_DIR / "summary.json").read_text())
    assert partial["interrupted"] is True
    assert partial["trajectories"] == 0
    assert not list(out.rglob(".staging-*"))
    assert not list(out.rglob(".*.tmp-*"))
    assert _every_file_loads(out) == {**rows, "interrupted/trajectories.jsonl": 0,
                                      "interrupted/trajectories.parquet": 0}
    assert not wait_gone(live_processes(["stockfish"], marker=marker), 20)

    # 4. --overwrite into a folder holding a run (what `make demo` does the second time) succeeds
    p = _cli(*QUICK, "--seed", "2", "--overwrite", "--output-dir", str(out))
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["seed"] == 2
    assert summary["trajectories"] == 4
    assert "runs" not in summary
    assert _every_file_loads(out)["trajectories.parquet"] == 4


def _traj(i: int, *, steps: bool = False) -> Trajectory:
    t = Trajectory(trajectory_id=f"traj-{i:05d}", group_id=f"group-{i:05d}", env_id="agentfly/Chess-v0",
                   task_id=f"task-{i}", seed=i, mode="step" if steps else "chain", prompt_ids=[1, 2, 3],
                   reward=float(i), terminated=True)
    if steps:
        from agentfly_gym.rollout.step import StepRow

        t.steps = [StepRow(trajectory_id=t.trajectory_id, group_id=t.group_id, step=0, prompt_ids=[1],
                           response_ids=[2, 3], response_mask=[1, 1], response_logprobs=[-0.5, -0.25], reward=1.0,
                           episode_return=1.0, anchor_obs="o", action="a", done=True)]
    return t


def test_replace_keeps_the_old_run_until_the_new_one_is_written(tmp_path, monkeypatch):
    """A write that fails half-way (the disk fills while the new run's files are written; the failure is injected
    into pyarrow's writer, as a full disk cannot be made here) leaves the old run's files as they were."""
    import pyarrow.parquet as pq

    with RunOutput(tmp_path, "fail", "chain") as out:
        out.save([_traj(0), _traj(1)], {"trajectories": 2, "interrupted": False})
    before = _snapshot(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with RunOutput(tmp_path, "replace", "chain") as out, pytest.raises(OSError, match="No space"):
        out.save([_traj(5)], {"trajectories": 1, "interrupted": False})
    assert _snapshot(tmp_path) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [LOCK_NAME]


def test_append_continues_ids_and_keeps_step_rows(tmp_path):
    with RunOutput(tmp_path, "fail", "step") as out:
        assert (out.next_index, out.next_group) == (0, 0)
        out.save([_traj(0, steps=True), _traj(1, steps=True)], {"trajectories": 2, "wall_s": 1.0, "mode": "step"})
    with RunOutput(tmp_path, "append", "step") as out:
        assert (out.next_index, out.next_group) == (2, 2)
        out.save([_traj(2, steps=True)], {"trajectories": 1, "wall_s": 2.0, "mode": "step", "resources": {}})
    assert [t.trajectory_id for t in load_trajectories(tmp_path / "trajectories.jsonl")] == \
        ["traj-00000", "traj-00001", "traj-00002"]
    assert [r["trajectory_id"] for r in load_step_rows(tmp_path / "steps.parquet")] == \
        ["traj-00000", "traj-00001", "traj-00002"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trajectories"] == 3
    assert summary["wall_s"] == 3.0
    assert len(summary["runs"]) == 2
    with pytest.raises(OutputExistsError, match="step-mode run"):
        check_output_dir(tmp_path, "append", mode="chain")
    with RunOutput(tmp_path, "replace", "chain") as out:  # a chain run replacing a step run leaves no steps file
        out.save([_traj(9)], {"trajectories": 1, "mode": "chain"})
    assert not (tmp_path / "steps.parquet").exists()


def test_a_second_writer_in_this_process_is_refused(tmp_path):
    with RunOutput(tmp_path, "fail", "chain"):
        with pytest.raises(OutputBusyError, match=rf"process {os.getpid()} \("):
            RunOutput(tmp_path, "append", "chain").__enter__()
    with RunOutput(tmp_path, "fail", "chain"):  # released on exit
        pass
