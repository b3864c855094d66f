"""Lichess puzzles: finding the CSV, loading it, and choosing a puzzle.

Format (the Lichess puzzle database, https://database.lichess.org/#puzzles, CC0): a CSV
with the header ``PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,
GameUrl,OpeningTags``.  ``FEN`` is the position *before* the opponent's setup move;
``Moves`` is a space-separated UCI line whose first move is that setup move, and the
solver plays moves 1, 3, 5, ... (0-based) while the opponent's replies are moves 2, 4, ...
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...data.paths import resolve_data_dir
from ...errors import ConfigError, DataNotFoundError

if TYPE_CHECKING:
    import chess

__all__ = [
    "Puzzle",
    "PuzzleSet",
    "FULL_DUMP_NAME",
    "SAMPLE_NAME",
    "find_puzzles_file",
    "load_puzzles",
    "SPLITS",
    "split_of",
]

#: The puzzle splits: ``"all"`` (every puzzle) or one of three disjoint parts chosen by a hash of the
#: ``PuzzleId`` (see :func:`split_of`): ``"train"`` ~80%, ``"validation"`` ~10%, ``"test"`` ~10%.
SPLITS = ("all", "train", "validation", "test")

#: The file name of the full Lichess dump once decompressed.
FULL_DUMP_NAME = "lichess_db_puzzle.csv"
#: The file name of the project's 1,000-puzzle sample.
SAMPLE_NAME = "lichess_puzzles_sample.csv"

_HOW_TO_GET = (
    "Run `agentfly-gym data download chess`, or download the Lichess puzzle database (lichess_db_puzzle.csv.zst) "
    "from https://database.lichess.org/#puzzles "
    f"and decompress it (`zstd -d lichess_db_puzzle.csv.zst`) into a folder as {FULL_DUMP_NAME}, or put a CSV "
    f"with the same columns there as {SAMPLE_NAME}, or pass puzzles_file=<path to a CSV>."
)
_COLUMNS = ("PuzzleId", "FEN", "Moves", "Rating", "Themes")


def split_of(puzzle_id: str) -> str:
    """The split of a puzzle: ``"train"``, ``"validation"`` or ``"test"``, from the first 8 bytes of the
    BLAKE2b hash of its ``PuzzleId`` modulo 100 (0-79 train, 80-89 validation, 90-99 test).

    Deterministic across processes, machines and versions of the puzzle file (a puzzle keeps its split
    when the dump grows or is filtered by rating), and independent of any seed.
    """
    bucket = int.from_bytes(hashlib.blake2b(puzzle_id.encode(), digest_size=8).digest(), "big") % 100
    return "train" if bucket < 80 else "validation" if bucket < 90 else "test"


@dataclasses.dataclass(frozen=True)
class Puzzle:
    """One Lichess puzzle.

    Attributes:
        puzzle_id: the Lichess ``PuzzleId`` (e.g. ``"tewjc"``).
        fen: the position before the opponent's setup move ``moves[0]``.
        moves: the UCI line: ``moves[0]`` is the setup move, the solver plays ``moves[1]``,
            ``moves[3]``, ..., the opponent replies with ``moves[2]``, ``moves[4]``, ...
        rating: the Lichess puzzle rating (Glicko-2 points).
        themes: the Lichess theme tags (e.g. ``("mate", "mateIn2")``).
    """

    puzzle_id: str
    fen: str
    moves: tuple[str, ...]
    rating: int
    themes: tuple[str, ...] = ()

    @property
    def solver_moves(self) -> int:
        """How many moves the solver must find (``len(moves) // 2``)."""
        return len(self.moves) // 2

    @property
    def solver_color(self) -> chess.Color:
        """The solver's colour: the side to move after the setup move."""
        import chess  # here, not at import: finding the puzzle file (agentfly-gym envs) needs no chess module

        return not chess.Board(self.fen).turn


class PuzzleSet:
    """An immutable, indexable set of puzzles backed by a pyarrow table (compact for the full dump).

    ``len(s)`` puzzles; ``s[i]`` is the i-th as a :class:`Puzzle`; ``s.get(puzzle_id)`` looks one up.
    """

    def __init__(self, table, source: Path) -> None:
        self._table = table
        self.source = source
        self._ids = table.column("PuzzleId")
        self._index: dict[str, int] | None = None
        self._splits: dict[str, tuple[int, ...]] | None = None

    def __len__(self) -> int:
        return self._table.num_rows

    def __getitem__(self, i: int) -> Puzzle:
        if not 0 <= i < len(self):
            raise IndexError(f"puzzle index {i} out of range [0, {len(self)})")
        row = {c: self._table.column(c)[i].as_py() for c in _COLUMNS}
        return Puzzle(puzzle_id=row["PuzzleId"], fen=row["FEN"], moves=tuple((row["Moves"] or "").split()),
                      rating=int(row["Rating"]), themes=tuple((row["Themes"] or "").split()))

    def get(self, puzzle_id: str) -> Puzzle | None:
        """The puzzle with this ``PuzzleId``, or ``None``."""
        if self._index is None:
            if len(self) > 100_000:  # linear scan in C instead of a dict of millions of str
                import pyarrow.compute as pc

                i = pc.index(self._ids, puzzle_id).as_py()
                return None if i < 0 else self[i]
            self._index = {pid: i for i, pid in enumerate(self._ids.to_pylist())}
        i = self._index.get(puzzle_id)
        return None if i is None else self[i]

    def split_indices(self, split: str) -> tuple[int, ...]:
        """Indices (ascending) of the puzzles of ``split`` (one of :data:`SPLITS`; see :func:`split_of`).

        The first call hashes every ``PuzzleId`` (about 1 s per million puzzles); the result is kept.

        Raises:
            ConfigError: an unknown split.
        """
        if split not in SPLITS:
            raise ConfigError(f"split={split!r} is not one of {list(SPLITS)}")
        if split == "all":
            return tuple(range(len(self)))
        if self._splits is None:
            parts: dict[str, list[int]] = {"train": [], "validation": [], "test": []}
            for i, pid in enumerate(self._ids.to_pylist()):
                parts[split_of(pid)].append(i)
            self._splits = {k: tuple(v) for k, v in parts.items()}
        return self._splits[split]

    def puzzle_ids(self, split: str = "all") -> list[str]:
        """The ``PuzzleId`` s of ``split`` in file order.

        Raises:
            ConfigError: an unknown split.
        """
        indices = self.split_indices(split)
        if split == "all":
            return self._ids.to_pylist()
        ids = self._ids.to_pylist()
        return [ids[i] for i in indices]

    def __repr__(self) -> str:
        return f"<PuzzleSet {len(self)} puzzles from {self.source}>"


def find_puzzles_file(data_dir: str | os.PathLike | None = None, puzzles_file: str | os.PathLike | None = None) -> Path:
    """The puzzle CSV to use.

    Order: ``puzzles_file`` if it names an existing file (absolute, or relative to the current
    folder); else ``puzzles_file`` inside the chess data folder; else the full dump
    ``lichess_db_puzzle.csv`` in the data folder; else the sample ``lichess_puzzles_sample.csv``.
    The data folder is found by :func:`agentfly_gym.data.paths.resolve_data_dir` (``data_dir``, then
    ``$AGENTFLY_GYM_DATA/chess``, then ``~/.cache/agentfly-gym/chess``, then the 300-puzzle sample
    shipped in the package), so the full dump anywhere wins over any sample.

    Raises:
        DataNotFoundError: no such file; the message says where to download the Lichess puzzles.
    """
    if puzzles_file is not None:
        p = Path(puzzles_file).expanduser()
        if p.is_file():
            return p
        if p.is_absolute():
            raise DataNotFoundError(f"puzzles_file={str(puzzles_file)!r} does not exist. {_HOW_TO_GET}")
        folder = resolve_data_dir("chess", data_dir, must_contain=str(p), how_to_get=_HOW_TO_GET)
        return folder / p
    errors = []
    for name in (FULL_DUMP_NAME, SAMPLE_NAME):
        try:
            return resolve_data_dir("chess", data_dir, must_contain=name, how_to_get=_HOW_TO_GET) / name
        except DataNotFoundError as e:
            errors.append(e)
    raise DataNotFoundError(f"{errors[0]} (The sample name {SAMPLE_NAME} was looked for in the same folders.)")


@functools.lru_cache(maxsize=4)
def _read_table(path: str, mtime_ns: int, size: int):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    types = {"PuzzleId": pa.string(), "FEN": pa.string(), "Moves": pa.string(), "Rating": pa.int64(),
             "Themes": pa.string()}
    try:
        return pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(include_columns=list(_COLUMNS), column_types=types))
    except (pa.ArrowInvalid, KeyError) as e:
        raise ConfigError(f"{path} is not a Lichess puzzle CSV (need columns {', '.join(_COLUMNS)}): {e}") from e


def load_puzzles(path: str | os.PathLike, *, min_rating: int | None = None, max_rating: int | None = None) -> PuzzleSet:
    """Load the puzzles of a Lichess puzzle CSV, optionally filtered by rating (inclusive bounds).

    Blocking (about 10 ms for the 1,000-puzzle sample, seconds for the full dump of millions);
    the parsed table is cached per process by (path, mtime, size), so many environments share
    one copy.  Only the columns PuzzleId, FEN, Moves, Rating and Themes are kept.

    Raises:
        DataNotFoundError: the file does not exist.
        ConfigError: the file lacks the Lichess columns, or no puzzle has a rating in
            ``[min_rating, max_rating]``.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise DataNotFoundError(f"puzzle file {p} cannot be read: {e}. {_HOW_TO_GET}") from e
    table = _read_table(str(p.resolve()), st.st_mtime_ns, st.st_size)
    if min_rating is not None or max_rating is not None:
        import pyarrow.compute as pc

        rating = table.column("Rating")
        mask = None
        if min_rating is not None:
            mask = pc.greater_equal(rating, min_rating)
        if max_rating is not None:
            upper = pc.less_equal(rating, max_rating)
            mask = upper if mask is None else pc.and_(mask, upper)
        table = table.filter(mask)
    if table.num_rows == 0:
        raise ConfigError(f"no puzzle in {p} has a rating in [{min_rating}, {max_rating}]; widen min_rating/max_rating")
    return PuzzleSet(table, p)
