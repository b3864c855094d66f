"""Task rows for :func:`~agentfly_gym.tools.make_tool_env`: a list of dicts, a JSONL / JSON / Parquet file, or a
Hugging Face ``datasets.Dataset``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataNotFoundError

__all__ = ["load_tasks", "check_fields", "row_names", "RESERVED_FIELDS"]

#: Row fields the reward function gets from the environment, so a row may not hold them.
RESERVED_FIELDS = ("completion",)


def _read_file(path: Path) -> tuple[list[Any], list[str]]:
    """The rows of a task file and, for each, where it is (``"tasks.jsonl, line 4"``; lines and rows count from 1)."""
    if not path.is_file():
        raise DataNotFoundError(f"task file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        return rows, [f"{path}, row {i}" for i in range(1, len(rows) + 1)]
    if suffix in (".jsonl", ".ndjson"):
        rows, where = [], []
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ConfigError(f"{path}, line {n}: not JSON ({e.msg})") from None
                    where.append(f"{path}, line {n}")
        return rows, where
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ConfigError(f"{path}: a JSON task file must hold a list of objects, got {type(data).__name__}")
        return data, [f"{path}, item {i}" for i in range(1, len(data) + 1)]
    raise ConfigError(f"task file {str(path)!r}: unknown format {suffix!r}; use .jsonl, .json or .parquet")


def row_names(n: int) -> list[str]:
    """How messages name the rows of a list of ``n`` task rows: ``"task row 1"`` for the first (counted from 1,
    as a file's lines are; the reset option ``index`` stays a 0-based position)."""
    return [f"task row {i}" for i in range(1, n + 1)]


def check_fields(rows: Sequence[Mapping[str, Any]], fields: Iterable[str], where: Sequence[str] | None = None,
                 *, reader: str = "the reward") -> None:
    """Check that every row holds each of ``fields`` (the arguments ``reader`` takes without a default).

    Args:
        rows: the task rows.
        fields: field names every row must hold.
        where: how to name each row in a message (default :func:`row_names`).
        reader: who reads the fields, for the message.

    Raises:
        ConfigError: the first row that lacks a field; the message names the row (from 1, or its file line), the
            missing fields and the fields it has.
    """
    fields = list(fields)
    if not fields:
        return
    where = list(where) if where is not None else row_names(len(rows))
    for name, row in zip(where, rows):
        missing = [f for f in fields if f not in row]
        if missing:
            raise ConfigError(f"{name} lacks the field(s) {missing} that {reader} reads (its arguments without a "
                              f"default: {fields}); the row's fields: {sorted(row)}. Add them to every row, or give "
                              "the reward's argument a default")


def load_tasks(tasks: Any, *, prompt_key: str = "prompt", id_key: str = "id",
               required: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The task rows of ``tasks`` as a list of dicts, each with a non-empty str ``row[prompt_key]``.

    Args:
        tasks: a list (or other iterable) of dicts; a path (str or ``os.PathLike``) to a ``.jsonl``, ``.json`` or
            ``.parquet`` file of such rows; or a Hugging Face ``datasets.Dataset``.
        prompt_key: the field holding the task's prompt (the first user message).
        id_key: the field holding a row's id (a row without it gets its 0-based position as its id).
        required: fields every row must hold (those the reward reads; see :func:`check_fields`).

    Returns:
        The rows (copies), in order.

    Raises:
        ConfigError: no rows, a row that is not a dict, without a str prompt, holding a reserved field
            (:data:`RESERVED_FIELDS`), lacking a ``required`` field, or two rows with one id.  Messages name a row
            by its line in a ``.jsonl`` file, else by its place counted from 1 (``task row 1`` is the first).
        DataNotFoundError: the file does not exist.
    """
    where: list[str] | None = None
    if isinstance(tasks, (str, os.PathLike)):
        rows, where = _read_file(Path(tasks))
    elif type(tasks).__module__.split(".")[0] == "datasets" and hasattr(tasks, "to_list"):
        rows = tasks.to_list()  # a datasets.Dataset (an IterableDataset has no to_list: iterated below)
    elif isinstance(tasks, Mapping):
        raise ConfigError("tasks must be a list of dicts (one per task), a file path or a datasets.Dataset, not one "
                          "dict; wrap it: tasks=[{...}]")
    elif isinstance(tasks, Iterable):
        rows = list(tasks)
    else:
        raise ConfigError(f"tasks must be a list of dicts, a .jsonl/.json/.parquet path or a datasets.Dataset, got "
                          f"{type(tasks).__name__}")
    if not rows:
        raise ConfigError("tasks holds no rows")
    where = where or row_names(len(rows))
    out, ids = [], {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where[i]} must be a dict, got {type(row).__name__}: {row!r:.80}")
        row = dict(row)
        prompt = row.get(prompt_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{where[i]} needs a non-empty str {prompt_key!r} (the prompt); its fields: {sorted(row)}")
        bad = [k for k in RESERVED_FIELDS if k in row]
        if bad:
            raise ConfigError(f"{where[i]} holds reserved field(s) {bad} (the reward function gets them from the "
                              "environment); rename them")
        tid = str(row.get(id_key, i))
        if tid in ids:
            raise ConfigError(f"{where[ids[tid]]} and {where[i]} share the id {tid!r}")
        ids[tid] = i
        out.append(row)
    check_fields(out, required, where)
    return out
