"""R2E-Gym tasks: the :class:`R2ETask` record and loaders for R2E-Gym dataset rows.

Rows use R2E-Gym's public column names (the R2E-Gym / R2E-Gym-Lite / R2E-Gym-Subset data
sets): ``repo_name``, ``docker_image``, ``commit_hash``, ``problem_statement``,
``expected_output_json``, ``parsed_commit_content``, ``modified_files``,
``relevant_files``, ``prompt``, ... .  Loading a JSONL or Parquet file of such rows gives
tasks that run in the row's own image, as upstream does: the repository is at
``/testbed``, the hidden tests are the image's ``/r2e_tests`` and ``run_tests.sh``, and a
run is graded by parsing its ``pytest -rA`` summary against ``expected_output_json``.

The local task set built by :mod:`.local_tasks` uses the same rows plus extra fields
(``task_id``, ``patch``, ``hidden_tests``, ``run_tests``, ``repo_dir``, ``hidden_dir``,
``source``); such tasks bring their repository and hidden tests from the host and run in
one generic image.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DataNotFoundError

__all__ = ["R2ETask", "load_tasks", "task_from_row"]


@dataclasses.dataclass
class R2ETask:
    """One software-engineering task.

    Attributes:
        task_id: unique id (local tasks: ``"<package>-<version>-<bug>"``; upstream rows:
            ``"<repo_name>@<commit_hash[:12]>"``).
        repo_name: the project, e.g. ``"six"`` or ``"pandas"``.
        problem_statement: the issue the agent must resolve (symptoms, not the fix).
        expected: ``{test name: "PASSED"|"FAILED"|"ERROR"}`` of the hidden tests on the
            fixed repository (``expected_output_json``).
        docker_image: the row's image (upstream rows), or None for local tasks.
        commit_hash: the fixing commit (upstream) or a digest of the injected bug (local).
        gold_patch: the fix as a unified diff (``a/``/``b/`` prefixes, applies with
            ``patch -p1`` or ``git apply``), or None when the row has none.
        modified_files: files the gold patch touches (relative to the repo root).
        local: True for tasks whose repository and hidden tests come from the host.
        repo_dir: local tasks: the folder holding the buggy repository (hidden tests removed).
        hidden_dir: local tasks: the folder holding the hidden test files, at their repo paths.
        hidden_tests: local tasks: repo-relative paths of the hidden test files.
        run_tests: local tasks: the ``run_tests.sh`` script that runs the hidden tests.
        row: the original row (all columns).
    """

    task_id: str
    repo_name: str
    problem_statement: str
    expected: dict[str, str]
    docker_image: str | None = None
    commit_hash: str = ""
    gold_patch: str | None = None
    modified_files: list[str] = dataclasses.field(default_factory=list)
    local: bool = False
    repo_dir: Path | None = None
    hidden_dir: Path | None = None
    hidden_tests: list[str] = dataclasses.field(default_factory=list)
    run_tests: str = ""
    row: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def issue(self) -> str:
        """The problem statement without R2E-Gym's ``[ISSUE]...[/ISSUE]`` wrapper where present."""
        s = self.problem_statement
        if "[ISSUE]" in s and "[/ISSUE]" in s:
            return s.split("[ISSUE]", 1)[1].rsplit("[/ISSUE]", 1)[0].strip()
        return s.strip()


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return [v]
    return [str(x) for x in v]


def task_from_row(row: dict[str, Any], *, base_dir: Path | None = None) -> R2ETask:
    """An :class:`R2ETask` from one dataset row (R2E-Gym columns, plus our local-task fields).

    Raises:
        ConfigError: a required column (``problem_statement``, ``expected_output_json``,
            and ``docker_image`` for non-local rows) is missing or malformed.
    """
    for col in ("problem_statement", "expected_output_json"):
        if col not in row or row[col] is None:
            raise ConfigError(f"R2E-Gym row lacks the column {col!r} (columns: {sorted(row)})")
    try:
        expected = json.loads(row["expected_output_json"]) if isinstance(row["expected_output_json"], str) \
            else dict(row["expected_output_json"])
    except json.JSONDecodeError as e:
        raise ConfigError(f"expected_output_json is not valid JSON: {e}") from None
    local = bool(row.get("repo_dir"))
    repo_name = str(row.get("repo_name") or row.get("repo") or "")
    commit = str(row.get("commit_hash") or "")
    task_id = str(row.get("task_id") or f"{repo_name}@{commit[:12]}")
    if not local and not row.get("docker_image"):
        raise ConfigError(f"R2E-Gym row {task_id!r} has no docker_image (and no local repo_dir)")
    base = base_dir or Path(".")
    return R2ETask(
        task_id=task_id,
        repo_name=repo_name,
        problem_statement=str(row["problem_statement"]),
        expected={str(k): str(v) for k, v in expected.items()},
        docker_image=None if local else str(row["docker_image"]),
        commit_hash=commit,
        gold_patch=row.get("patch") or None,
        modified_files=_as_list(row.get("modified_files")),
        local=local,
        repo_dir=(base / row["repo_dir"]) if local else None,
        hidden_dir=(base / row["hidden_dir"]) if local and row.get("hidden_dir") else None,
        hidden_tests=_as_list(row.get("hidden_tests")),
        run_tests=str(row.get("run_tests") or ""),
        row=dict(row),
    )


def load_tasks(path: str | os.PathLike) -> list[R2ETask]:
    """Tasks from a ``.jsonl``/``.json`` file or a ``.parquet`` file (or a folder holding ``tasks.jsonl``).

    Relative ``repo_dir``/``hidden_dir`` of local tasks are resolved against the file's folder.

    Raises:
        DataNotFoundError: the file does not exist.
        ConfigError: an unsupported file type, or a malformed row.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tasks.jsonl"
    if not p.exists():
        raise DataNotFoundError(f"R2E-Gym task file {p} not found; build the local task set with "
                                f"agentfly_gym.envs.r2egym.build_local_tasks() or pass a JSONL/Parquet file of R2E-Gym rows")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(p).to_pylist()
    elif p.suffix in (".jsonl", ".json"):
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".json" and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        raise ConfigError(f"R2E-Gym task file {p} must be .jsonl, .json or .parquet")
    tasks = [task_from_row(r, base_dir=p.parent) for r in rows]
    if not tasks:
        raise ConfigError(f"R2E-Gym task file {p} holds no rows")
    return tasks
