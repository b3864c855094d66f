"""The ALFWorld game files: data location, splits, task types and the index of solvable games.

Layout (the one ALFWorld's ``alfworld-download`` writes under ``$ALFWORLD_DATA``)::

    <root>/json_2.1.1/<split>/<task>/<trial>/game.tw-pddl     PDDL domain, problem, grammar, "solvable"
    <root>/json_2.1.1/<split>/<task>/<trial>/traj_data.json   task_type, pddl_params, turk_annotations
    <root>/logic/alfred.pddl, alfred.twl2

Which games count, as in ALFWorld's ``AlfredTWEnv.collect_game_files``
(``alfworld/agents/environment/alfred_tw_env.py``): trials whose folder path contains
``movable`` or ``Sliced`` are not supported, trials of an unselected task type are skipped,
and games without a ``solvable`` key or with ``"solvable": false`` are skipped.  On the
standard data this gives 140 games for ``valid_seen`` and 134 for ``valid_unseen``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...data.paths import cache_dir, resolve_data_dir
from ...errors import ConfigError

__all__ = [
    "HOW_TO_GET",
    "SPLIT_ALIASES",
    "TASK_TYPES",
    "GameIndex",
    "GameRecord",
    "load_index",
    "parse_task_types",
    "resolve_alfworld_root",
]

log = logging.getLogger(__name__)

#: ALFWorld's six task types by id, as ``TASK_TYPES`` in ``alfred_tw_env.py``.
TASK_TYPES: dict[int, str] = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}

#: split name -> folder names tried in order under ``json_2.1.1``.  ``train`` is ``train`` in
#: upstream's download and ``valid_train`` in the project's shared data; ALFWorld's own
#: names for the evaluation sets (``eval_in_distribution`` / ``eval_out_of_distribution``) work too, and so do
#: the names common to every env: ``validation`` (``valid_seen``) and ``test`` (``valid_unseen``).
SPLIT_ALIASES: dict[str, tuple[str, ...]] = {
    "train": ("train", "valid_train"),
    "valid_train": ("valid_train", "train"),
    "valid_seen": ("valid_seen",),
    "eval_in_distribution": ("valid_seen",),
    "valid_unseen": ("valid_unseen",),
    "eval_out_of_distribution": ("valid_unseen",),
    "validation": ("valid_seen",),
    "test": ("valid_unseen",),
}

HOW_TO_GET = ("Download the ALFWorld game files with `agentfly-gym data download alfworld` or "
              "`pip install alfworld==0.4.2 && alfworld-download` "
              "(it writes json_2.1.1/ and logic/ under $ALFWORLD_DATA, default ~/.cache/alfworld).")

_INDEX_VERSION = 1


def resolve_alfworld_root(data_dir: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data root (the folder holding ``json_2.1.1/``).

    Order: ``data_dir``, ``$ALFWORLD_DATA``, ``$AGENTFLY_GYM_DATA/alfworld``, ``~/.cache/alfworld``, then
    the sample shipped in the package (24 games per split, all six task types; see
    ``agentfly_gym/samples/README.md``).

    Raises:
        DataNotFoundError: no candidate holds ``json_2.1.1``; the message says to run
            ``alfworld-download`` and where to point the library.
    """
    # a folder counts when it holds at least one game (an interrupted download may leave json_2.1.1/ empty)
    return resolve_data_dir("alfworld", data_dir, must_contain="json_2.1.1/*/*/*/game.tw-pddl", how_to_get=HOW_TO_GET)


def parse_task_types(task_types: int | str | Iterable[int | str] | None) -> tuple[str, ...]:
    """Normalise a task-type filter to a sorted tuple of task-type names.

    Args:
        task_types: ``None`` (all six), one id (1-6) or name, or an iterable of them; ids may be
            given as ints or digit strings (ALFWorld's config uses ids, ``env.task_types``).

    Raises:
        ConfigError: an unknown id or name, or an empty selection.
    """
    if task_types is None:
        return tuple(sorted(TASK_TYPES.values()))
    if isinstance(task_types, (int, str)):
        task_types = [task_types]
    names: set[str] = set()
    valid = ", ".join(f"{i}={n}" for i, n in TASK_TYPES.items())
    for t in task_types:
        if isinstance(t, bool):
            raise ConfigError(f"task type {t!r} is not valid; use an id or name: {valid}")
        if isinstance(t, str) and t.strip().isdigit():
            t = int(t.strip())
        if isinstance(t, int):
            if t not in TASK_TYPES:
                raise ConfigError(f"task type id {t!r} is not valid; use one of {valid}")
            names.add(TASK_TYPES[t])
        elif isinstance(t, str) and t.strip() in TASK_TYPES.values():
            names.add(t.strip())
        else:
            raise ConfigError(f"task type {t!r} is not valid; use an id or name: {valid}")
    if not names:
        raise ConfigError(f"task_types selects nothing; use ids or names from: {valid}")
    return tuple(sorted(names))


@dataclasses.dataclass(frozen=True)
class GameRecord:
    """One solvable game.

    Attributes:
        task_id: ``"<split folder>/<task folder>/<trial folder>"``, unique within a data root.
        game_file: absolute path of ``game.tw-pddl``.
        task_type: one of :data:`TASK_TYPES`' names.
    """

    task_id: str
    game_file: Path
    task_type: str

    @property
    def task_type_id(self) -> int:
        return next(i for i, n in TASK_TYPES.items() if n == self.task_type)


@dataclasses.dataclass(frozen=True)
class GameIndex:
    """The solvable games of one split, in a stable (sorted) order.

    Attributes:
        split: the split name asked for; ``folder``: the folder it resolved to.
        games: the games of the selected task types.
        skipped: counts of trials left out, by reason (``unsupported`` for movable/Sliced
            trials, ``unsolvable``, ``no_game_file``, ``no_solvable_key``, ``task_type``).
    """

    split: str
    folder: Path
    games: tuple[GameRecord, ...]
    skipped: dict[str, int]

    def __len__(self) -> int:
        return len(self.games)

    def by_task_id(self, task_id: str) -> GameRecord:
        """The game whose ``task_id`` is ``task_id``.

        Raises:
            ConfigError: no such game in this index (the message shows a few valid ids).
        """
        for g in self.games:
            if g.task_id == task_id:
                return g
        examples = ", ".join(repr(g.task_id) for g in self.games[:3])
        raise ConfigError(f"task_id={task_id!r} is not a solvable game of split {self.split!r} with the selected "
                          f"task types ({len(self.games)} games, e.g. {examples})")

    def counts(self) -> dict[str, int]:
        """Number of games per task type."""
        out: dict[str, int] = {}
        for g in self.games:
            out[g.task_type] = out.get(g.task_type, 0) + 1
        return out


def _split_folder(root: Path, split: str) -> Path:
    base = root / "json_2.1.1"
    if not isinstance(split, str) or split not in SPLIT_ALIASES:
        present = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        raise ConfigError(f"split={split!r} is not valid; use one of {sorted(SPLIT_ALIASES)} "
                          f"(folders present under {base}: {present})")
    for name in SPLIT_ALIASES[split]:
        if (base / name).is_dir():
            return base / name
    raise ConfigError(f"split={split!r}: none of the folders {list(SPLIT_ALIASES[split])} exists under {base}. "
                      + HOW_TO_GET)


def _scan(folder: Path) -> tuple[list[dict[str, str]], dict[str, int]]:
    """All trials of ``folder`` (every task type), with reasons for skipped ones."""
    entries: list[dict[str, str]] = []
    skipped = {"unsupported": 0, "no_game_file": 0, "no_solvable_key": 0, "unsolvable": 0}
    for dirpath, _dirs, files in os.walk(folder, followlinks=True):  # symlinked trial folders count
        if "traj_data.json" not in files:
            continue
        rel = Path(dirpath).relative_to(folder)
        if "movable" in rel.as_posix() or "Sliced" in rel.as_posix():  # relative, so the root's name cannot match
            skipped["unsupported"] += 1
            continue
        if "game.tw-pddl" not in files:
            skipped["no_game_file"] += 1
            continue
        try:
            with open(os.path.join(dirpath, "traj_data.json"), encoding="utf-8") as f:
                task_type = json.load(f)["task_type"]
            with open(os.path.join(dirpath, "game.tw-pddl"), encoding="utf-8") as f:
                game = json.load(f)
        except (OSError, ValueError, KeyError) as e:
            log.warning("ALFWorld: skipping unreadable trial %s: %s", dirpath, e)
            skipped["no_game_file"] += 1
            continue
        if "solvable" not in game:
            skipped["no_solvable_key"] += 1
            continue
        if not game["solvable"]:
            skipped["unsolvable"] += 1
            continue
        entries.append({"rel": rel.as_posix(), "task_type": task_type})
    entries.sort(key=lambda e: e["rel"])
    return entries, skipped


_memory_cache: dict[tuple[str, int], tuple[list[dict[str, str]], dict[str, int]]] = {}
_memory_lock = threading.Lock()


def _cached_scan(folder: Path, *, use_disk_cache: bool) -> tuple[list[dict[str, str]], dict[str, int]]:
    """Scan ``folder`` once per process and, where writable, once per machine (JSON under the cache dir).

    The cache is keyed by the folder's path and modification time.
    """
    folder = folder.resolve()
    mtime = folder.stat().st_mtime_ns
    key = (str(folder), mtime)
    with _memory_lock:
        hit = _memory_cache.get(key)
    if hit is not None:
        return hit
    path = cache_dir("alfworld", "index", hashlib.sha256(str(folder).encode()).hexdigest()[:16] + ".json")
    result = None
    if use_disk_cache and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") == _INDEX_VERSION and data.get("folder") == str(folder) and data.get("mtime_ns") == mtime:
                result = (data["entries"], data["skipped"])
        except (OSError, ValueError, KeyError):
            result = None
    if result is None:
        result = _scan(folder)
        if use_disk_cache:
            _write_json_atomic(path, {"version": _INDEX_VERSION, "folder": str(folder), "mtime_ns": mtime,
                                      "entries": result[0], "skipped": result[1]})
    with _memory_lock:
        _memory_cache[key] = result
    return result


def _write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file and rename; a cache that cannot be written is skipped (logged)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("ALFWorld: cannot write cache file %s: %s", path, e)


def load_index(root: str | os.PathLike, split: str = "train",
               task_types: int | str | Iterable[int | str] | None = None, *, use_disk_cache: bool = True) -> GameIndex:
    """The solvable games of ``split`` under the data ``root``, filtered by task type.

    Blocking (a scan reads every trial's two JSON files, ~0.6 s for 582 trials); the result is
    cached in memory and on disk (``$AGENTFLY_GYM_CACHE/alfworld/index/``).

    Args:
        root: the data root (see :func:`resolve_alfworld_root`).
        split: ``"train"``, ``"valid_seen"``, ``"valid_unseen"`` (or an alias, see :data:`SPLIT_ALIASES`).
        task_types: see :func:`parse_task_types`.
        use_disk_cache: read and write the on-disk index.

    Raises:
        ConfigError: unknown split or task type, missing split folder, or no game left.
    """
    names = parse_task_types(task_types)
    folder = _split_folder(Path(root), split)
    entries, skipped = _cached_scan(folder, use_disk_cache=use_disk_cache)
    skipped = dict(skipped)
    games = []
    other = 0
    for e in entries:
        if e["task_type"] in names:
            games.append(GameRecord(task_id=f"{folder.name}/{e['rel']}", game_file=folder / e["rel"] / "game.tw-pddl",
                                    task_type=e["task_type"]))
        else:
            other += 1
    skipped["task_type"] = other
    if not games:
        raise ConfigError(f"split={split!r} ({folder}) has no solvable game of task types {list(names)}")
    return GameIndex(split=split, folder=folder, games=tuple(games), skipped=skipped)
