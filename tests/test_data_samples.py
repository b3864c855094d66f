"""The samples shipped in the package: present, licensed, loadable by the real loaders, and the last step of
the data resolution order (a configured data set always wins; an explicit ``data_dir`` never falls back)."""

from __future__ import annotations

import csv
import filecmp
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentfly_gym.data.paths import data_candidates, resolve_data_dir, sample_dir
from agentfly_gym.data.datasets import DATASETS
from agentfly_gym.data.sources import env_data_source
from agentfly_gym.data.download import sha256_file
from agentfly_gym.errors import DataNotFoundError

SAMPLES = Path(__file__).resolve().parents[1] / "agentfly_gym" / "samples"


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """No data configured: no data variables, an empty HOME and cache."""
    for var in ("AGENTFLY_GYM_DATA", "ALFWORLD_DATA", "WEBSHOP_DATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENTFLY_GYM_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_samples_are_small_and_licensed():
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 10 * 1024 * 1024, total
    assert (SAMPLES / "README.md").is_file()
    for name in ("chess", "alfworld", "webshop"):
        assert sample_dir(name) == SAMPLES / name
        licence = (SAMPLES / name / "LICENSE").read_text(encoding="utf-8")
        assert ("CC0" if name == "chess" else "MIT License") in licence
    assert sample_dir("r2egym") is None
    assert sample_dir("scienceworld") is None


def test_chess_sample_spans_ratings_and_themes(bare):
    from agentfly_gym.envs.chess.puzzles import find_puzzles_file, load_puzzles

    path = find_puzzles_file()
    assert path == SAMPLES / "chess" / "lichess_puzzles_sample.csv"
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert 200 <= len(rows) <= 500
    assert len({r["PuzzleId"] for r in rows}) == len(rows)
    ratings = sorted(int(r["Rating"]) for r in rows)
    assert ratings[0] < 1000
    assert ratings[-1] > 2000
    themes = {t for r in rows for t in r["Themes"].split()}
    assert {"mate", "endgame", "middlegame", "opening", "fork", "pin"} <= themes
    assert len(themes) >= 40
    puzzles = load_puzzles(path)
    assert len(puzzles) == len(rows)
    assert puzzles[0].solver_moves >= 1


def test_alfworld_sample_has_every_task_type_in_every_split(bare):
    from agentfly_gym.envs.alfworld.games import TASK_TYPES, load_index, resolve_alfworld_root

    root = resolve_alfworld_root()
    assert root == SAMPLES / "alfworld"
    assert (root / "logic" / "alfred.pddl").is_file()
    assert (root / "logic" / "alfred.twl2").is_file()
    for split in ("train", "valid_seen", "valid_unseen"):
        index = load_index(root, split)
        assert set(index.counts()) == set(TASK_TYPES.values()), (split, index.counts())
        assert 20 <= len(index) <= 60
        assert sum(index.skipped.values()) == 0  # only solvable, supported games were shipped


def test_webshop_sample_matches_the_pinned_upstream_file(bare):
    from agentfly_gym.envs.webshop.catalog import find_data_files

    folder = resolve_data_dir("webshop")
    assert folder == SAMPLES / "webshop"
    products, attributes, human = find_data_files(folder, human_goals=False)
    assert human is None
    assert len(json.loads(products.read_text(encoding="utf-8"))) == 29
    pin = next(f.sha256 for f in DATASETS["webshop-small"].files if f.name == attributes.name)
    assert sha256_file(attributes) == pin  # the bundled file is upstream's, byte for byte
    assert env_data_source("agentfly/WebShop-v0") == (f"bundled sample: {products}", "29 products, 149 synthetic goals")


def test_configured_data_wins_and_explicit_dir_never_falls_back(bare, monkeypatch):
    root = bare / "data"
    (root / "chess").mkdir(parents=True)
    (root / "chess" / "lichess_puzzles_sample.csv").write_text((SAMPLES / "chess" / "lichess_puzzles_sample.csv")
                                                               .read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setenv("AGENTFLY_GYM_DATA", str(root))
    labels = [label for label, _ in data_candidates("chess")]
    assert labels == ["AGENTFLY_GYM_DATA", "cache", "bundled sample"]
    assert resolve_data_dir("chess", must_contain="lichess_puzzles_sample.csv") == root / "chess"
    assert env_data_source("agentfly/Chess-v0")[0].startswith("AGENTFLY_GYM_DATA: ")
    # an ALFWorld root without json_2.1.1 falls through to the sample; an explicit empty folder does not
    assert resolve_data_dir("alfworld", must_contain="json_2.1.1/*/*/*/game.tw-pddl") == SAMPLES / "alfworld"
    with pytest.raises(DataNotFoundError, match="alfworld data not found"):
        resolve_data_dir("alfworld", bare / "empty", must_contain="json_2.1.1/*/*/*/game.tw-pddl")
    assert env_data_source("agentfly/ALFWorld-v0") == (f"bundled sample: {SAMPLES / 'alfworld'}",
                                                      "solvable games: train 24, valid_seen 24, valid_unseen 24")


def _rebuild_source(data_root: Path, tmp_path: Path) -> Path:
    """The source root ``make_samples.py`` reads.

    A full data root (``$AGENTFLY_GYM_DATA``) is used as it is.  For the repository's ``tests/data`` (1,000-row
    chess file, WebShop's files, a subset of ALFWorld): a root in ``tmp_path`` whose ALFWorld games are the
    shipped sample's and the test subset's (linked), so the rebuild must still skip the subset's unsolvable,
    ``movable`` and ``Sliced`` trials that sort among the sample's games, and pick the same four per type.
    """
    if data_root.resolve() != (Path(__file__).resolve().parent / "data").resolve():
        return data_root
    src = tmp_path / "src"
    src.mkdir()
    for name in ("chess", "webshop"):
        (src / name).symlink_to(data_root / name, target_is_directory=True)
    (src / "alfworld").mkdir()
    (src / "alfworld" / "logic").symlink_to(data_root / "alfworld" / "logic", target_is_directory=True)
    for root in (SAMPLES / "alfworld", data_root / "alfworld"):
        for trial in sorted(p.parent for p in root.glob("json_2.1.1/*/*/*/traj_data.json")):
            dest = src / "alfworld" / trial.relative_to(root)
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(trial, target_is_directory=True)
    return src


def test_samples_are_rebuilt_identically_from_the_data(test_data, tmp_path):
    """scripts/make_samples.py is deterministic: rerun on the data it gives the shipped files."""
    src = _rebuild_source(test_data, tmp_path)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SAMPLES.parents[1] / "scripts" / "make_samples.py"), str(src),
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    built = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    # samples/retrieval is generated, not cut from a data set: scripts/make_retrieval_corpus.py (tested below)
    shipped = sorted(p.relative_to(SAMPLES) for p in SAMPLES.rglob("*") if p.is_file()
                     and p.name not in ("README.md", "LICENSE") and p.relative_to(SAMPLES).parts[0] != "retrieval")
    assert built == shipped
    _, mismatch, errors = filecmp.cmpfiles(out, SAMPLES, [str(p) for p in built], shallow=False)
    assert mismatch == []
    assert errors == []


def test_cache_folders_named_like_a_data_set_never_hide_the_sample(bare):
    """A cache folder holding no data (WebShop's parsed-catalog caches of an older layout, an offline
    download that left an empty folder, an interrupted ALFWorld extraction) is skipped, so a second run
    on a bare machine reads the sample as the first did."""
    from agentfly_gym.envs.alfworld.games import resolve_alfworld_root
    from agentfly_gym.envs.webshop.env import WebShopEnv

    (bare / "cache" / "webshop" / "catalog").mkdir(parents=True)
    (bare / "home" / ".cache" / "alfworld" / "json_2.1.1" / "valid_seen").mkdir(parents=True)
    env = WebShopEnv()
    assert dict(env.server_spec.kwargs)["attributes_path"] == str((SAMPLES / "webshop" / "items_ins_v2_1000.json").resolve())
    assert env_data_source("agentfly/WebShop-v0")[0].startswith("bundled sample: ")
    assert resolve_alfworld_root() == SAMPLES / "alfworld"
    env.close()


def test_retrieval_corpus_is_rebuilt_identically():
    """scripts/make_retrieval_corpus.py is deterministic: its rows are the shipped corpus and questions, byte for byte."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("make_retrieval_corpus",
                                                  SAMPLES.parents[1] / "scripts" / "make_retrieval_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    docs, questions = mod.build()
    for name, rows in (("corpus.jsonl", docs), ("questions.jsonl", questions)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        assert text == (SAMPLES / "retrieval" / name).read_text(encoding="utf-8"), name
