"""Task rows for :func:`~agentfly_gym.tools.make_tool_env`: a list of dicts, a JSONL / JSON / Parquet file, or a
Hugging Face ``datasets.Dataset``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataNotFoundError

__all__ = ["load_tasks", "RESERVED_FIELDS"]

#: Row fields the reward function gets from the environment, so a row may not hold them.
RESERVED_FIELDS = ("completion",)


def _read_file(path: Path) -> list[Any]:
    if not path.is_file():
        raise DataNotFoundError(f"task file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ConfigError(f"{path}, line {n}: not JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ConfigError(f"{path}: a JSON task file must hold a list of objects, got {type(data).__name__}")
        return data
    raise ConfigError(f"task file {str(path)!r}: unknown format {suffix!r}; use .jsonl, .json or .parquet")


def load_tasks(tasks: Any, *, prompt_key: str = "prompt", id_key: str = "id") -> list[dict[str, Any]]:
    """The task rows of ``tasks`` as a list of dicts, each with a non-empty str ``row[prompt_key]``.

    Args:
        tasks: a list (or other iterable) of dicts; a path (str or ``os.PathLike``) to a ``.jsonl``, ``.json`` or
            ``.parquet`` file of such rows; or a Hugging Face ``datasets.Dataset``.
        prompt_key: the field holding the task's prompt (the first user message).
        id_key: the field holding a row's id (a row without it is named by its index).

    Returns:
        The rows (copies), in order.

    Raises:
        ConfigError: no rows, a row that is not a dict, without a str prompt, holding a reserved field
            (:data:`RESERVED_FIELDS`), or two rows with one id.
        DataNotFoundError: the file does not exist.
    """
    if isinstance(tasks, (str, os.PathLike)):
        rows = _read_file(Path(tasks))
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
    out, ids = [], {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConfigError(f"task row {i} must be a dict, got {type(row).__name__}: {row!r:.80}")
        row = dict(row)
        prompt = row.get(prompt_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"task row {i} needs a non-empty str {prompt_key!r} (the prompt); its fields: {sorted(row)}")
        bad = [k for k in RESERVED_FIELDS if k in row]
        if bad:
            raise ConfigError(f"task row {i} holds reserved field(s) {bad} (the reward function gets them from the "
                              "environment); rename them")
        tid = str(row.get(id_key, i))
        if tid in ids:
            raise ConfigError(f"task rows {ids[tid]} and {i} share the id {tid!r}")
        ids[tid] = i
        out.append(row)
    return out
