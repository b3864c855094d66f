"""Fill the ALFWorld engine cache (:mod:`.engine_cache`) for whole splits ahead of training.

``agentfly-gym data precompute alfworld`` (or ``data download alfworld --precompute``) loads every
game of the chosen splits once, so that the first reset of each game in a run is a disk hit (~0.2 s)
instead of a cold load.  Entries are written by the engine cache itself (a temporary file renamed into
place), so an interrupted run leaves only whole entries and a rerun skips them.  The cache lives
under ``$AGENTFLY_GYM_CACHE`` (never in the data folder, which may be read-only).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...errors import EnvError

__all__ = ["DEFAULT_SPLITS", "precompute_engine_cache"]

#: Splits filled when none is named: the evaluation splits (train has ~3,500 games, ~1 h).
DEFAULT_SPLITS = ("valid_seen", "valid_unseen")


def _game_files(roots: Iterable[Path], splits: Sequence[str]) -> list[Path]:
    from .games import load_index

    seen: set[Path] = set()
    files: list[Path] = []
    for root in roots:
        for split in splits:
            for g in load_index(root, split).games:
                p = Path(g.game_file)
                if p not in seen:
                    seen.add(p)
                    files.append(p)
    return files


def precompute_engine_cache(splits: Sequence[str] = DEFAULT_SPLITS, *, data_dir: str | os.PathLike | None = None,
                            include_sample: bool = True, cache_dir: str | os.PathLike | None = None,
                            limit: int | None = None, progress: bool = True,
                            upgrade_games: bool = True,
                            game_files: Sequence[str | os.PathLike] | None = None) -> dict[str, Any]:
    """Load each game of ``splits`` once with the engine cache on, writing the entries it lacks.

    Args:
        splits: split names (see :data:`~.games.SPLIT_ALIASES`).
        data_dir: the data root (default: :func:`~.games.resolve_alfworld_root`).
        include_sample: also the same splits of the sample shipped in the package (its games are
            copies of real ones, so usually already covered).
        cache_dir: the cache folder (default ``$AGENTFLY_GYM_CACHE/alfworld/engine``).
        limit: at most this many games (the first ones, in index order).
        progress: show a progress bar (tqdm).
        upgrade_games: as :class:`~.simulator.ALFWorldSimulator` (the key depends on it).
        game_files: these game files instead of the splits' (``splits``, ``data_dir`` and
            ``include_sample`` are then ignored).

    Returns:
        ``{"games", "computed", "present", "failed", "seconds", "cache_dir"}``: counts of games seen,
        entries written, entries already on disk, games that could not be loaded (logged, skipped), the
        wall time and the folder.  ``KeyboardInterrupt`` propagates after the entry in progress is
        dropped (never half-written).

    Raises:
        DataNotFoundError, ConfigError: no data, or an unknown split.
    """
    from ...data.paths import sample_dir
    from .engine_cache import EngineCache, entry_key
    from .games import resolve_alfworld_root
    from .simulator import ALFWorldSimulator

    if game_files is not None:
        files = [Path(f) for f in game_files]
    else:
        roots = [resolve_alfworld_root(data_dir)]
        sample = sample_dir("alfworld") if include_sample else None
        if sample is not None and sample.resolve() != roots[0].resolve():
            roots.append(sample)
        files = _game_files(roots, splits)
    if limit is not None:
        files = files[: max(0, int(limit))]
    folder = Path(cache_dir) if cache_dir is not None else EngineCache.default_directory()
    cache = EngineCache(folder)
    sim = ALFWorldSimulator(engine_cache=folder, upgrade_games=upgrade_games)
    out = {"games": len(files), "computed": 0, "present": 0, "failed": 0, "seconds": 0.0, "cache_dir": str(folder)}
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), desc="ALFWorld engine cache", unit="game")
    try:
        for f in files:
            path = cache.path(entry_key(f.read_bytes(), upgrade_games=upgrade_games))
            if path is not None and path.is_file():
                out["present"] += 1
            else:
                try:
                    sim.load(f)
                    out["computed"] += 1
                except EnvError as e:
                    out["failed"] += 1
                    if bar is not None:
                        bar.write(f"skipped {f}: {e}")
            if bar is not None:
                bar.update(1)
    finally:
        out["seconds"] = round(time.perf_counter() - t0, 1)
        if bar is not None:
            bar.close()
        sim.close()
    return out
