"""Where each environment reads its data and how many tasks that holds (the table of ``agentfly-gym envs``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, DataNotFoundError
from .paths import data_candidates

__all__ = ["env_data_source"]


def _label(name: str, path: Path) -> str:
    """Which step of the resolution order ``path`` (a folder or a file in it) came from."""
    path = path.resolve()
    for label, c in data_candidates(name):
        try:
            if path == c.resolve() or path.is_relative_to(c.resolve()):
                return label
        except OSError:
            continue
    return "given"


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _chess() -> tuple[str, str]:
    from ..envs.chess.puzzles import find_puzzles_file

    p = find_puzzles_file()
    return f"{_label('chess', p)}: {p}", f"{_count_lines(p) - 1:,} puzzles"


def _alfworld() -> tuple[str, str]:
    from ..envs.alfworld.games import load_index, resolve_alfworld_root

    root = resolve_alfworld_root()
    counts = []
    for split in ("train", "valid_seen", "valid_unseen"):
        try:
            counts.append(f"{split} {len(load_index(root, split))}")
        except ConfigError:
            counts.append(f"{split} 0")
    return f"{_label('alfworld', root)}: {root}", "solvable games: " + ", ".join(counts)


def _webshop() -> tuple[str, str]:
    from .paths import resolve_data_dir
    from ..envs.webshop.catalog import DATA_MARKER, find_data_files, load_catalog

    folder = resolve_data_dir("webshop", must_contain=DATA_MARKER)
    products, attrs, _human = find_data_files(folder, human_goals=False)
    size = products.stat().st_size
    if size > 64 << 20:  # a full catalog: counting means parsing gigabytes
        return f"{_label('webshop', folder)}: {products}", f"{size / (1 << 30):.1f} GiB of products (not counted)"
    catalog = load_catalog(products, attrs, human_goals=False)
    return (f"{_label('webshop', folder)}: {products}",
            f"{len(catalog.products):,} products, {len(catalog.goals):,} synthetic goals")


def _scienceworld() -> tuple[str, str]:
    from ..envs.scienceworld.tasks import task_names

    return "bundled with the scienceworld package", f"{len(task_names())} task types (with variations)"


def _r2egym() -> tuple[str, str]:
    from ..envs.r2egym.local_tasks import default_tasks_dir

    p = default_tasks_dir() / "tasks.jsonl"
    if not p.is_file():
        return f"not built ({p}): run `agentfly-gym r2e build-tasks`, or pass tasks=<rows>", "0"
    return f"local task set: {p}", f"{_count_lines(p):,} tasks"


def _code_interpreter() -> tuple[str, str]:
    return "generated (agentfly_gym.envs.code_interpreter, seed 0; num_tasks=, seed=)", "500 problems"


#: The Retrieval env's shipped corpus (``agentfly_gym.envs.retrieval.CORPUS_DIR``, whose module imports the tools
#: layer and the resource manager: named here so that ``agentfly-gym envs`` stays quick; a test checks they agree).
RETRIEVAL_CORPUS_DIR = Path(__file__).resolve().parent.parent / "samples" / "retrieval"


def _retrieval() -> tuple[str, str]:
    CORPUS_DIR = RETRIEVAL_CORPUS_DIR
    return (f"bundled sample: {CORPUS_DIR} (CC0, fictional towns)",
            f"{_count_lines(CORPUS_DIR / 'questions.jsonl'):,} questions, {_count_lines(CORPUS_DIR / 'corpus.jsonl'):,} documents")


_SOURCES = {"agentfly/Chess-v0": _chess, "agentfly/ALFWorld-v0": _alfworld, "agentfly/WebShop-v0": _webshop,
            "agentfly/ScienceWorld-v0": _scienceworld, "agentfly/R2EGym-v0": _r2egym,
            "agentfly/CodeInterpreter-v0": _code_interpreter, "agentfly/Retrieval-v0": _retrieval}


def env_data_source(env_id: str) -> tuple[str, str]:
    """``(source, tasks)`` for ``agentfly-gym envs``: where ``env_id`` reads its data, how many tasks it holds.

    The source starts with the resolution step it came from (``bundled sample``, ``AGENTFLY_GYM_DATA``,
    ``cache``, ...; see :mod:`agentfly_gym.data`).  Never raises: a missing data set or package is
    described in the text.
    """
    fn = _SOURCES.get(env_id)
    if fn is None:
        return "unknown", "?"
    try:
        return fn()
    except DataNotFoundError as e:
        return f"missing: {e}", "0"
    except ImportError as e:
        return f"cannot inspect: {e}", "?"
    except (OSError, ValueError, ConfigError) as e:
        return f"unreadable: {e}", "?"
