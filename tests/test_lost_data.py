"""Runs never lose or corrupt data: a self-play run stopped by SIGTERM saves its finished games, a full disk
while saving is a clear error that leaves the folder's earlier run readable (and other runs in the process
running), ``--append`` onto an unreadable run is refused before anything runs, and ``agentfly-gym dataset``
refuses to replace a file without ``--overwrite``, as ``rollout`` does.

Real CLI subprocesses and real environments (Chess-v0 puzzles, ChessSelfPlay-v0 with Stockfish as the expert
opponent).  The full disk is a file size limit (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored, so a write past
it fails with ``EFBIG`` as a write to a full disk fails with ``ENOSPC``) set in the child process only: a
small file system cannot be mounted without root.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from proctools import live_processes, mark_tree, wait_gone

from agentfly_gym.rollout import Trajectory, load_trajectories
from agentfly_gym.rollout.outputs import LOCK_NAME, RunOutput, UnreadableRunError, check_output_dir

QUICK = ["--env", "Chess-v0", "--policy", "random", "--tokenizer", "qwen3", "--max-turns", "3", "--no-progress"]


def _cli(*args: str, limit: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentfly_gym", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ), preexec_fn=_file_size_limit(limit) if limit else None)


def _file_size_limit(limit: int):
    def preexec() -> None:  # a write past `limit` bytes fails with EFBIG (a full disk's ENOSPC, here in this child)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def _visible(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def _traj(i: int) -> Trajectory:
    return Trajectory(trajectory_id=f"traj-{i:05d}", group_id=f"group-{i:05d}", env_id="agentfly/Chess-v0",
                      task_id=f"task-{i}", seed=i, mode="chain", prompt_ids=[1, 2, 3], reward=float(i), terminated=True)


@pytest.mark.slow
def test_sigterm_saves_the_finished_games_of_a_selfplay_run(tmp_path, monkeypatch):
    """``rollout --env ChessSelfPlay-v0`` had no SIGTERM handling of its own: the teardown handler stopped the
    engines and the process died with nothing saved.  Now SIGTERM cancels the run as in single-agent runs: the
    games the ``-v`` log reported finished are saved (two trajectories each, ``interrupted``), exit 143, and no
    Stockfish is left."""
    out = tmp_path / "games"
    marker = mark_tree(monkeypatch)
    proc = subprocess.Popen([sys.executable, "-m", "agentfly_gym", "-v", "rollout", "--env", "ChessSelfPlay-v0",
                             "--policy", "random", "--opponent", "expert", "--tokenizer", "qwen3", "-n", "1000",
                             "--concurrency", "2", "--max-turns", "3", "--no-progress", "--output-dir", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    finished = re.compile(r"game (game-\d+) finished")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120 and proc.poll() is None:
        if sum(1 for x in list(lines) if finished.search(x)) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "".join(lines)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 143 and "Traceback" not in err, err
    logged = sorted({m.group(1) for m in map(finished.search, lines) if m})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["games"]["games"] == len(logged) >= 2, summary
    saved = load_trajectories(out / "trajectories.parquet")
    assert sorted({t.group_id for t in saved}) == logged
    assert len(saved) == 2 * len(logged)
    assert len(load_trajectories(out / "trajectories.jsonl")) == len(saved)
    assert not wait_gone(live_processes(["stockfish"], marker=marker), 20)


def test_a_full_disk_while_saving_is_a_clear_error_and_keeps_the_earlier_run(tmp_path):
    """``--append`` whose merged files cannot be written (the file size limit stands in for a full disk): a
    one-paragraph error naming the file and what the folder still holds, no traceback, the earlier run's files
    byte for byte as they were and no temporary file left; a later append reads them and adds to them."""
    out = tmp_path / "run"
    with RunOutput(out, "fail", "chain") as run:
        run.save([_traj(0), _traj(1)], {"trajectories": 2, "mode": "chain"})
    before = _visible(out)
    limit = max(len(b) for b in before.values()) + 2048  # the earlier files fit; the merged 12-trajectory ones not
    r = _cli("rollout", *QUICK, "-n", "10", "--seed", "1", "--append", "--output-dir", str(out), limit=limit)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"could not write {out / 'trajectories.parquet'}" in r.stderr, r.stderr
    assert "10 trajectories of this run were not saved" in r.stderr, r.stderr
    assert f"{out} still holds its earlier run (2 trajectories), unchanged" in r.stderr, r.stderr
    assert _visible(out) == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [LOCK_NAME]
    check_output_dir(out, "append", mode="chain")  # what a later --append checks first: every file loads
    with RunOutput(out, "append", "chain") as run:
        run.save([_traj(2), _traj(3)], {"trajectories": 2, "mode": "chain"})
    assert [t.trajectory_id for t in load_trajectories(out / "trajectories.parquet")] == \
        [f"traj-{i:05d}" for i in range(4)]


def test_a_run_that_cannot_save_does_not_stop_other_runs(tmp_path, test_data):
    """Two runs in one process (a trainer's loop): the one whose save fails raises ``OutputWriteError`` (an
    ``OSError``) carrying its trajectories for the caller to save elsewhere; the other one, writing small files,
    completes and saves."""
    script = textwrap.dedent(f"""
        import asyncio, json
        from agentfly_gym.rollout.policies.factory import make_policy
        from agentfly_gym.rollout.runner import RolloutConfig, run_rollouts

        async def main():
            policy, chat = make_policy("random", tokenizer="qwen3", seed=0)
            big = RolloutConfig(["Chess-v0"], num_trajectories=24, max_turns=3, seed=0, output_dir={str(tmp_path / "big")!r})
            small = RolloutConfig(["Chess-v0"], num_trajectories=1, max_turns=1, seed=5,
                                  output_dir={str(tmp_path / "small")!r})
            got = await asyncio.gather(run_rollouts(big, policy, chat, progress=False),
                                       run_rollouts(small, policy, chat, progress=False), return_exceptions=True)
            e = got[0]
            print(json.dumps({{"error": type(e).__name__, "oserror": isinstance(e, OSError),
                              "path": str(getattr(e, "path", "")), "kept": len(getattr(e, "trajectories", [])),
                              "small": len(got[1].trajectories) if not isinstance(got[1], BaseException) else repr(got[1])}}))
        asyncio.run(main())
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ), preexec_fn=_file_size_limit(40_000))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # which of the two files passes the size limit first depends on the 24 rollouts' content (one shared policy)
    assert got["path"] in {str(tmp_path / "big" / name) for name in ("trajectories.parquet", "trajectories.jsonl")}, got
    assert {k: v for k, v in got.items() if k != "path"} == {"error": "OutputWriteError", "oserror": True, "kept": 24,
                                                             "small": 1}, got
    assert not any(p.name.startswith(".staging-") for p in (tmp_path / "big").iterdir())
    assert len(load_trajectories(tmp_path / "small" / "trajectories.parquet")) == 1


def test_a_length_estimate_that_cannot_be_saved_costs_no_trajectories(tmp_path):
    """The rollout-length estimate (``lengths=`` a JSON path) was saved before the run's trajectories, and a
    ``TaskRunner`` saved it before returning its batch: a full disk there (a 64-byte file size limit here) lost
    every trajectory of the call with an ``OSError``.  Now the trajectories come back (and a run saves them), and
    the estimate's failure is a warning."""
    script = textwrap.dedent(f"""
        import asyncio, json
        from agentfly_gym.rollout.policies.factory import make_policy
        from agentfly_gym.rollout.runner import RolloutConfig, run_rollouts
        from agentfly_gym.rollout.tasks import TaskRunner, TaskRow

        policy, chat = make_policy("random", tokenizer="qwen3", seed=0)
        with TaskRunner(policy, chat, max_turns=1, lengths={str(tmp_path / "tasks.json")!r}) as runner:
            played = runner.play([TaskRow("Chess-v0", seed=0), TaskRow("Chess-v0", seed=1)])
        config = RolloutConfig(["Chess-v0"], num_trajectories=2, max_turns=1, seed=0,
                               lengths={str(tmp_path / "run.json")!r})
        result = asyncio.run(run_rollouts(config, policy, chat, progress=False))
        print(json.dumps([len(played), len(result.trajectories)]))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ), preexec_fn=_file_size_limit(64))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [2, 2]
    assert r.stderr.count("could not save the rollout-length estimate") == 2, r.stderr


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_append_onto_an_unreadable_run_is_refused_before_anything_runs(tmp_path, damage):
    """A truncated or overwritten ``trajectories.parquet`` used to surface as pyarrow's ``ArrowInvalid`` traceback
    (when the run opened the folder, or after the whole run, when the merged files were written).  Now the check
    before the run refuses it: it says the file is not a readable run output and how to go on."""
    with RunOutput(tmp_path, "fail", "chain") as out:
        out.save([_traj(0), _traj(1)], {"trajectories": 2, "mode": "chain"})
    parquet = tmp_path / "trajectories.parquet"
    if damage == "truncated":  # a copy cut short
        parquet.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])
    else:
        parquet.write_bytes(b"not parquet at all\n" * 50)
    with pytest.raises(UnreadableRunError, match=r"trajectories\.parquet is not a readable run output.*--overwrite"):
        check_output_dir(tmp_path, "append", mode="chain")
    r = _cli("rollout", *QUICK, "-n", "2", "--append", "--output-dir", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "not a readable run output" in r.stderr
    assert "its trajectories.jsonl still loads: 2 trajectories" in r.stderr
    assert "nothing was run" in r.stderr


def test_dataset_refuses_to_replace_a_file_without_overwrite(tmp_path):
    """``agentfly-gym dataset -o X`` replaced an existing X silently while ``rollout`` asks for ``--overwrite``:
    now both refuse without it (exit 2, X unchanged), and ``--overwrite`` replaces X."""
    from agentfly_gym_verl.dataset import build_dataset, dataset_main

    from agentfly_gym.errors import ConfigError

    x = tmp_path / "train.parquet"
    assert dataset_main(["Chess", "-o", str(x), "-n", "4", "--no-check"]) == 0
    before = x.read_bytes()
    assert dataset_main(["Chess", "-o", str(x), "-n", "8", "--seed", "3", "--no-check"]) == 2
    assert x.read_bytes() == before
    with pytest.raises(ConfigError, match="already exists; pass --overwrite"):
        build_dataset("Chess", None, 8, x, check=False)
    assert dataset_main(["Chess", "-o", str(x), "-n", "8", "--seed", "3", "--no-check", "--overwrite"]) == 0
    assert x.read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet"]  # no temporary file left
