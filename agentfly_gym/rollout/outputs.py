"""Run output folders: one writer at a time, whole files only, nothing completed is ever lost.

A run writes ``trajectories.parquet``, ``trajectories.jsonl``, ``steps.parquet`` (step mode) and
``summary.json`` (:data:`RUN_FILES`) into its output folder.  They are first written into a staging folder
inside it (``.staging-*``), each flushed to disk (``fsync``), then renamed into place (``summary.json`` last),
so a reader never sees a half-written file, and a run that dies while writing leaves the previous files
untouched (the staging folder is removed by the next run into that folder).

While a run writes, it holds an exclusive lock (``fcntl.flock``) on ``.agentfly-gym.lock`` in the folder;
a second process that tries the same folder is refused (:class:`OutputBusyError`), and the message names
the holder (pid and command).

A folder that already holds a run (any of :data:`RUN_FILES`) is refused unless the caller says what to do
(``if_exists``, the names pandas' ``DataFrame.to_sql`` uses):

``"fail"`` (default)
    refused with :class:`OutputExistsError` before anything runs;
``"replace"`` (CLI ``--overwrite``)
    the old files stay until the new run is complete, then are replaced;
``"append"`` (CLI ``--append``)
    the new trajectories are added after the old ones; trajectory and group ids continue after the old ones
    (so GRPO groups of different runs never share an id), and ``summary.json`` describes every trajectory in
    the folder, with each run's own summary under ``"runs"``.

An interrupted run (Ctrl-C, SIGTERM) never replaces a complete run: when the folder holds one, the
trajectories the interrupted run finished are saved in the sub-folder ``interrupted/`` instead (one such
run is kept there, the latest); when the folder holds nothing or only an earlier interrupted run, they are
saved in the folder itself (``"interrupted": true`` in ``summary.json``).

A file that cannot be written (a full disk, a file size limit) raises :class:`OutputWriteError`, which names
the file and says what the folder still holds: nothing is published half-written, the folder's earlier files
stay as they were (so a later ``--append`` can read them), and the run's trajectories stay in memory on the
error (``.trajectories``) for a caller to save elsewhere.  A folder whose run cannot be read back (a corrupt
or truncated ``trajectories.parquet``) is refused for ``"append"`` before anything runs
(:class:`UnreadableRunError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import AgentFlyError, ConfigError
from ..utils.files import atomic_path, fsync_dir

__all__ = ["RUN_FILES", "IF_EXISTS", "LOCK_NAME", "folder_lock", "INTERRUPTED_DIR", "OutputExistsError", "OutputBusyError",
           "OutputWriteError", "UnreadableRunError", "RunOutput", "check_output_dir", "holds_run", "fresh_run_dir",
           "run_output"]

log = logging.getLogger(__name__)

#: The files of one run, in the order they are published (``summary.json`` last: it marks a complete set).
RUN_FILES = ("trajectories.parquet", "trajectories.jsonl", "steps.parquet", "summary.json")
#: What a folder that already holds a run gets: refused, replaced when the new run completes, or appended to.
IF_EXISTS = ("fail", "replace", "append")
#: The lock file inside an output folder (kept; its content names the current writer while one holds it).
LOCK_NAME = ".agentfly-gym.lock"
#: Where an interrupted run's files go when the folder holds a complete run.
INTERRUPTED_DIR = "interrupted"
_STAGING_PREFIX = ".staging-"


class OutputExistsError(ConfigError):
    """The output folder already holds a run and neither replacing nor appending was asked for."""


class OutputBusyError(ConfigError):
    """Another process is writing the output folder (it holds the folder's lock)."""


class UnreadableRunError(OutputExistsError):
    """The output folder's run cannot be read back (a corrupt or truncated file): it cannot be appended to."""


class OutputWriteError(AgentFlyError, OSError):
    """A run's files could not be written (a full disk, a file size limit, an I/O error).

    Nothing half-written was published and the folder's earlier files are unchanged (the message says what
    it holds).  Attributes: ``path`` (the file that could not be written), ``folder``, ``trajectories`` and
    ``summary`` (what was to be saved: this run's trajectories, kept for a caller to save elsewhere).
    """

    def __init__(self, message: str, *, path: Path, folder: Path, trajectories: Sequence[Any],
                 summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.path, self.folder, self.trajectories, self.summary = path, folder, list(trajectories), summary


def holds_run(folder: str | Path) -> bool:
    """True when ``folder`` holds any of :data:`RUN_FILES`."""
    folder = Path(folder)
    return any((folder / name).exists() for name in RUN_FILES)


def _holds_complete_run(folder: Path) -> bool:
    """A run whose ``summary.json`` does not say ``"interrupted": true`` (files without a readable summary
    count as complete: data this code cannot judge is never replaced by a partial run)."""
    if not holds_run(folder):
        return False
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return True
    return not (isinstance(summary, dict) and summary.get("interrupted") is True)


def fresh_run_dir(root: str | Path = "runs") -> Path:
    """A new, empty folder ``root/<UTC date-time>`` (``-2``, ``-3``... when taken), created here."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    for i in range(1, 10_000):
        path = root / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"no free run folder name under {str(root)!r}")  # pragma: no cover


def _holder(folder: Path) -> str:
    try:
        info = json.loads((folder / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process (it has not said which yet)"
    return f"process {info['pid']} ({info.get('command', '?')}, since {info.get('since', '?')})"


def _lock(folder: Path, *, record: bool) -> int:
    """An exclusive, non-blocking ``flock`` on the folder's lock file; returns its descriptor.

    Raises:
        OutputBusyError: another process holds it.
    """
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutputBusyError(f"output folder {str(folder)!r} is being written by {_holder(folder)}; wait for it "
                              f"to finish or choose another --output-dir") from None
    if record:
        info = {"pid": os.getpid(), "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
                "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    return fd


def _unlock(fd: int, *, record: bool) -> None:
    try:
        if record:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def folder_lock(folder: str | Path) -> Iterator[None]:
    """Hold the folder's lock (:data:`LOCK_NAME`, the one a run holds; the pid and command recorded) for the
    block: what other writers of an output folder (``agentfly-gym eval``) take to keep a second process out.

    Raises:
        OutputBusyError: another process holds it (the message names that process).
    """
    fd = _lock(Path(folder), record=True)
    try:
        yield
    finally:
        _unlock(fd, record=True)


def _check_policy(folder: Path, if_exists: str, mode: str | None, *, read: bool = True) -> None:
    if if_exists not in IF_EXISTS:
        raise ConfigError(f"if_exists={if_exists!r} is not one of {IF_EXISTS}")
    if not holds_run(folder):
        return
    if if_exists == "fail":
        raise OutputExistsError(f"output folder {str(folder)!r} already holds a run; pass --overwrite to replace it "
                                f"once the new run is complete, --append to add to it, or choose another "
                                f"--output-dir (in code: if_exists='replace' or 'append')")
    if if_exists == "append" and mode is not None:
        try:
            old_mode = json.loads((folder / "summary.json").read_text()).get("mode", "chain")
        except (OSError, ValueError, AttributeError):
            old_mode = None
        if old_mode is None or not (folder / "trajectories.parquet").exists():
            raise OutputExistsError(f"output folder {str(folder)!r}: cannot append to a run without a readable "
                                    f"summary.json and trajectories.parquet; use --overwrite or another --output-dir")
        if old_mode != mode:
            raise OutputExistsError(f"output folder {str(folder)!r} holds a {old_mode}-mode run; a {mode}-mode run "
                                    f"cannot be appended to it")
        if read:
            _check_readable(folder)


def _check_readable(folder: Path) -> None:
    """Read the folder's trajectory (and step) rows back as an append will, so that a corrupt file is refused
    before anything runs rather than after the run, when the merged files are written.

    Raises:
        UnreadableRunError: a file does not load (truncated, not Parquet, malformed rows).
    """
    from .step import load_step_rows
    from .trajectory import SchemaVersionError, load_trajectories

    for name, load in (("trajectories.parquet", load_trajectories), ("steps.parquet", load_step_rows)):
        path = folder / name
        if not path.exists():
            continue
        try:
            load(path)
        except SchemaVersionError:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid, OSError, a malformed row's ValueError / KeyError...
            jsonl = ""
            if name == "trajectories.parquet" and (folder / "trajectories.jsonl").exists():
                try:
                    n = len(load_trajectories(folder / "trajectories.jsonl"))
                    jsonl = f" (its trajectories.jsonl still loads: {n} trajectories)"
                except Exception:  # noqa: BLE001 - only says whether the JSONL loads
                    jsonl = " (its trajectories.jsonl does not load either)"
            raise UnreadableRunError(
                f"output folder {str(folder)!r}: {name} is not a readable run output ({type(e).__name__}: {e}), so "
                f"this run cannot be appended to it{jsonl}; nothing was run.  Restore the file (or move the folder's "
                f"files away) and run again, pass --overwrite to replace that run once this one is complete, "
                f"or choose another --output-dir") from None


def check_output_dir(folder: str | Path, if_exists: str = "fail", *, mode: str | None = None) -> Path:
    """Create ``folder`` and check that a run may write it now: writable, not locked by another process,
    and its existing run (if any) allowed by ``if_exists`` (see the module docstring).  Holds nothing.

    Raises:
        ConfigError: ``if_exists`` is not one of :data:`IF_EXISTS`, or the folder cannot be written.
        OutputExistsError: the folder holds a run and ``if_exists="fail"`` (or it cannot be appended to).
        UnreadableRunError: ``if_exists="append"`` and the folder's run does not load (a corrupt file).
        OutputBusyError: another process is writing it.
    """
    return _check_output_dir(Path(folder), if_exists, mode, read=True)


def _check_output_dir(out: Path, if_exists: str, mode: str | None, *, read: bool) -> Path:
    """:func:`check_output_dir`; ``read=False`` leaves reading an appended-to run to the caller (under the lock)."""
    if_exists = if_exists or "fail"
    if if_exists not in IF_EXISTS:
        raise ConfigError(f"if_exists={if_exists!r} is not one of {IF_EXISTS}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".agentfly-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"output_dir={str(out)!r} cannot be written: {e}") from None
    _unlock(_lock(out, record=False), record=False)
    _check_policy(out, if_exists, mode, read=read)
    return out


_ID_NUMBER = re.compile(r"(\d+)\D*$")


def _next_number(ids: Sequence[str]) -> int:
    """One more than the largest number in ``ids`` (``traj-00007`` -> 8), or ``len(set(ids))``."""
    nums = [int(m.group(1)) for m in map(_ID_NUMBER.search, ids) if m]
    return max(nums) + 1 if nums else len(set(ids))


@dataclasses.dataclass
class RunOutput:
    """The writer of one run's output folder (a context manager holding the folder's lock).

    Args:
        folder: the output folder (created).
        if_exists: ``"fail"``, ``"replace"`` or ``"append"`` (see the module docstring).
        mode: the run's mode (``"chain"``/``"step"``); appending to a run of another mode is refused.

    Attributes (set on entry):
        next_index, next_group: the first trajectory and group numbers this run should use (0 unless appending).

    Raises (on entry):
        OutputBusyError, OutputExistsError (UnreadableRunError), ConfigError: see :func:`check_output_dir`.
    """

    folder: Path
    if_exists: str = "fail"
    mode: str | None = None
    next_index: int = 0
    next_group: int = 0
    _fd: int | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.if_exists = self.if_exists or "fail"

    def __enter__(self) -> RunOutput:
        _check_output_dir(self.folder, self.if_exists, self.mode, read=False)  # the run is read under the lock
        self._fd = _lock(self.folder, record=True)
        try:
            for stale in (*self.folder.glob(f"{_STAGING_PREFIX}*"),
                          *(self.folder / INTERRUPTED_DIR).glob(f"{_STAGING_PREFIX}*")):
                shutil.rmtree(stale, ignore_errors=True)  # left by a run killed while writing (we hold the lock)
            _check_policy(self.folder, self.if_exists, self.mode)  # the decisive check, under the lock
            if self.if_exists == "append" and holds_run(self.folder):
                import pyarrow.parquet as pq

                table = pq.read_table(self.folder / "trajectories.parquet", columns=["trajectory_id", "group_id"])
                self.next_index = _next_number(table.column("trajectory_id").to_pylist())
                self.next_group = _next_number(table.column("group_id").to_pylist())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _unlock(fd, record=True)

    def save(self, trajectories: Sequence[Any], summary: dict[str, Any], *, interrupted: bool = False) -> dict[str, Path]:
        """Write this run's ``trajectories`` (and step rows in step mode) and ``summary`` (see the module
        docstring for where and how).  Returns the written paths by kind (``parquet``, ``jsonl``, ``steps``,
        ``summary``).

        Raises:
            OutputWriteError: a file cannot be written (a full disk...); nothing half-written is published, the
                files already in the folder are untouched, and the error names the file and what the folder holds.
        """
        if self._fd is None:
            raise RuntimeError("RunOutput.save outside its `with` block")
        dest = self.folder
        append = self.if_exists == "append"
        if interrupted and _holds_complete_run(self.folder):
            dest, append = self.folder / INTERRUPTED_DIR, False
            log.warning("the run was interrupted and %s holds a complete run: the finished trajectories go to %s",
                        self.folder, dest)
        own, own_summary = list(trajectories), summary
        stage: Path | None = None
        try:
            dest.mkdir(parents=True, exist_ok=True)
            if append and holds_run(dest):
                trajectories, summary = _merged(dest, own, summary)
            stage = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=dest))
            return self._publish(trajectories, summary, stage, dest)
        except OSError as e:
            raise _write_error(e, stage, dest, own, own_summary, self.mode) from e
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)

    def _publish(self, trajectories: Sequence[Any], summary: dict[str, Any], stage: Path, dest: Path) -> dict[str, Path]:
        """Write the files into ``stage``, then rename them into ``dest`` (``summary.json`` last)."""
        from .trajectory import save_trajectories

        staged = save_trajectories(trajectories, stage)
        if self.mode == "step":
            from .step import save_step_rows

            staged.update(save_step_rows(trajectories, stage))
        staged["summary"] = stage / "summary.json"
        with atomic_path(staged["summary"]) as tmp, open(tmp, "w") as f:  # each staged file is fsynced
            json.dump(summary, f, indent=2, default=str)
        order = {name: i for i, name in enumerate(RUN_FILES)}
        paths: dict[str, Path] = {}
        for kind, path in sorted(staged.items(), key=lambda kv: order[kv[1].name]):
            os.replace(path, dest / path.name)
            paths[kind] = dest / path.name
        for name in RUN_FILES:  # files of the replaced run this run does not write (steps.parquet of a step run)
            if name not in {p.name for p in paths.values()}:
                (dest / name).unlink(missing_ok=True)
        fsync_dir(dest)
        return paths


def _folder_holds(folder: Path) -> str:
    """What ``folder`` holds, in words, for an error message."""
    if not holds_run(folder):
        return f"{folder} holds no run files (nothing half-written was left there)"
    try:
        summary = json.loads((folder / "summary.json").read_text())
        n = f"{int(summary['trajectories'])} trajectories"
        state = ", interrupted" if summary.get("interrupted") is True else ""
    except (OSError, ValueError, KeyError, TypeError):
        n, state = "files without a readable summary.json", ""
    return f"{folder} still holds its earlier run ({n}{state}), unchanged"


def _write_error(e: OSError, stage: Path | None, dest: Path, own: list[Any], summary: dict[str, Any],
                 mode: str | None) -> OutputWriteError:
    """An :class:`OutputWriteError` for ``e``, naming the file that failed: the first of the run's files, in the
    order they are written, that the staging folder does not hold complete (or the folder itself)."""
    names = ["trajectories.parquet", "trajectories.jsonl"] + (["steps.parquet"] if mode == "step" else []) + \
        ["summary.json"]
    failed = dest
    if stage is not None and stage.is_dir():
        missing = [n for n in names if not (stage / n).exists()]
        failed = dest / missing[0] if missing else dest / "summary.json"
    reason = e.strerror or str(e)
    errno_text = f"[Errno {e.errno}] " if e.errno else ""
    return OutputWriteError(
        f"could not write {failed} ({errno_text}{reason}): {len(own)} trajectories of this run were not saved.  "
        f"Nothing half-written was published: {_folder_holds(dest)}.  Free space (or choose another --output-dir) "
        f"and run again", path=failed, folder=dest, trajectories=own, summary=summary)


def _merged(folder: Path, new: list[Any], summary: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The folder's trajectories (with their step rows) followed by ``new``, and a summary of them all."""
    from .summary import summarize
    from .trajectory import load_trajectories

    old = load_trajectories(folder / "trajectories.parquet")
    if (folder / "steps.parquet").exists():
        from .step import load_step_rows

        by_id: dict[str, list[dict[str, Any]]] = {}
        for row in load_step_rows(folder / "steps.parquet"):
            by_id.setdefault(row["trajectory_id"], []).append(row)
        for t in old:
            t.steps = by_id.get(t.trajectory_id, [])
    try:
        previous = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        previous = {}
    runs = list(previous.get("runs") or ([{k: v for k, v in previous.items() if k != "runs"}] if previous else []))
    runs.append(summary)
    everything = old + new
    merged = summarize(everything, sum(float(r.get("wall_s", 0.0)) for r in runs))
    merged["resources"] = summary.get("resources", merged["resources"])  # per run: this run's pools
    merged["mode"] = summary.get("mode")
    merged["interrupted"] = any(bool(r.get("interrupted")) for r in runs)
    merged["config"] = summary.get("config")
    merged["runs"] = runs
    return everything, merged


@contextlib.contextmanager
def run_output(folder: str | Path | None, if_exists: str = "fail", *, mode: str | None = None) -> Iterator[RunOutput | None]:
    """``RunOutput(folder, ...)`` as a context, or ``None`` when ``folder`` is None (nothing is written)."""
    if folder is None:
        yield None
        return
    with RunOutput(Path(folder), if_exists, mode) as out:
        yield out
