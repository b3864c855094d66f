"""R2E local tasks: an sdist download that does not complete (a full disk) leaves nothing a later build reuses.

pip itself is replaced here by a stand-in that writes a cut-off archive and fails as pip does on a full disk:
the tests must not download from a package index, and a full disk cannot be made on demand.
"""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from agentfly_gym.envs.r2egym import local_tasks
from agentfly_gym.envs.r2egym.local_tasks import BugSpec, TaskBuildError

SPEC = BugSpec(package="tinypkg", version="1.0", file="tinypkg/__init__.py", old="x", new="y",
               hidden_tests=("tests/test_x.py",), problem_statement="p")


def _sdist_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"x = 1\n" * 2000
        info = tarfile.TarInfo("tinypkg-1.0/tinypkg/__init__.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_download_cut_off_by_a_full_disk_leaves_no_archive(tmp_path, monkeypatch):
    whole = _sdist_bytes()

    def pip_on_a_full_disk(cmd, **kwargs):
        folder = cmd[cmd.index("-d") + 1]
        with open(f"{folder}/tinypkg-1.0.tar.gz", "wb") as f:
            f.write(whole[: len(whole) // 3])
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: [Errno 28] No space left on device")

    monkeypatch.setattr(local_tasks.subprocess, "run", pip_on_a_full_disk)
    dest = tmp_path / "sdists"
    with pytest.raises(TaskBuildError, match="No space left on device"):
        local_tasks._download(SPEC, dest, lambda _: None)
    assert list(dest.iterdir()) == []  # the cut-off archive was returned (and kept for later builds) before

    def pip(cmd, **kwargs):
        folder = cmd[cmd.index("-d") + 1]
        with open(f"{folder}/tinypkg-1.0.tar.gz", "wb") as f:
            f.write(whole)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(local_tasks.subprocess, "run", pip)
    got = local_tasks._download(SPEC, dest, lambda _: None)
    assert got == dest / "tinypkg-1.0.tar.gz"
    assert got.read_bytes() == whole
    assert [p.name for p in dest.iterdir()] == ["tinypkg-1.0.tar.gz"]


def test_an_empty_archive_left_by_an_earlier_version_is_not_reused(tmp_path, monkeypatch):
    dest = tmp_path / "sdists"
    dest.mkdir()
    (dest / "tinypkg-1.0.tar.gz").write_bytes(b"")
    calls = []

    def pip(cmd, **kwargs):
        calls.append(cmd)
        with open(f"{cmd[cmd.index('-d') + 1]}/tinypkg-1.0.tar.gz", "wb") as f:
            f.write(_sdist_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(local_tasks.subprocess, "run", pip)
    got = local_tasks._download(SPEC, dest, lambda _: None)
    assert len(calls) == 1
    assert got.stat().st_size > 0


def test_a_second_build_of_one_folder_waits_for_the_first(tmp_path):
    """Two processes building the same task folder (two test workers) would write the same temporary files: a build
    waits while another holds the folder's lock, then goes on (here with nothing to build: it lists the set)."""
    import fcntl
    import threading

    (tmp_path / "rows").mkdir()
    with open(tmp_path / ".build.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the other builder
        result = []
        builder = threading.Thread(target=lambda: result.append(local_tasks.build_local_tasks(tmp_path, bugs=[],
                                                                                              log=None)))
        builder.start()
        builder.join(0.5)  # a window in which an unlocked build (well under 0.1 s here) would have finished
        assert builder.is_alive()
        assert not (tmp_path / "tasks.jsonl").exists()
        fcntl.flock(held, fcntl.LOCK_UN)
    builder.join(60)
    assert result == [tmp_path / "tasks.jsonl"]
    assert (tmp_path / "tasks.jsonl").read_text() == ""
