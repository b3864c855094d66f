"""ALFWorld's engine cache (agentfly_gym.envs.alfworld.engine_cache) on the real engine and real game files.

A game's load computes TextWorld's GameLogic and Fast Downward's two translations; the cache must
serve a revisited game (same simulator, another simulator, another process via the disk) without
translating again, and the game must play exactly as without the cache.  A changed game file must
not be served from the old entry.  Fast Downward's ``pddl2sas`` is wrapped by a counting spy that
calls the real function.
"""

from __future__ import annotations

import pickle
import shutil
import threading
import zlib
from pathlib import Path

import fast_downward
import pytest

from agentfly_gym.envs.alfworld import ALFWorldSimulator
from agentfly_gym.envs.alfworld import engine_cache
from agentfly_gym.errors import EnvError
from agentfly_gym.envs.alfworld.engine_cache import EngineCache, EngineEntry, entry_key, serving

pytestmark = pytest.mark.timeout(300)

GAME = "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704"


@pytest.fixture
def game_file(test_data, tmp_path) -> Path:
    dst = tmp_path / "game" / "game.tw-pddl"
    dst.parent.mkdir()
    shutil.copyfile(test_data / "alfworld" / "json_2.1.1" / GAME / "game.tw-pddl", dst)
    return dst


@pytest.fixture
def translations(monkeypatch) -> list[bool]:
    """The ``optimize`` flag of every real Fast Downward translation made while the test runs."""
    calls: list[bool] = []
    real = fast_downward.pddl2sas

    def spy(domain, problem, verbose=False, optimize=False):
        calls.append(bool(optimize))
        return real(domain, problem, verbose=verbose, optimize=optimize)

    monkeypatch.setattr(fast_downward, "pddl2sas", spy)
    EngineCache.clear_memory()
    yield calls
    EngineCache.clear_memory()


def _play(sim: ALFWorldSimulator, game: Path) -> list:
    obs, info = sim.load(game)
    out = [obs, info]
    for cmd in info["admissible_actions"][:3] + ["look", "fly away", "inventory"]:
        out.append(sim.step(cmd))
    return out


@pytest.mark.slow
def test_a_revisited_game_is_served_from_the_cache_and_plays_identically(game_file, tmp_path, translations):
    cache = tmp_path / "cache"
    reference = _play(ALFWorldSimulator(engine_cache=False), game_file)
    assert len(translations) == 4, "uncached: PddlEnv.load and reset translate twice each"

    translations.clear()
    first = ALFWorldSimulator(engine_cache=cache, translation_worker=False)
    assert _play(first, game_file) == reference
    assert sorted(translations) == [False, True], "a cold load translates once plain, once optimised"
    assert first.cache_stats == {"memory_hits": 0, "disk_hits": 0, "misses": 1}
    assert len(list(cache.glob("*.pickle.zlib"))) == 1

    translations.clear()
    assert _play(first, game_file) == reference  # same simulator
    second = ALFWorldSimulator(engine_cache=cache)
    assert _play(second, game_file) == reference  # another simulator: the process's memory
    assert second.cache_stats["memory_hits"] == 1
    EngineCache.clear_memory()
    third = ALFWorldSimulator(engine_cache=cache)
    assert _play(third, game_file) == reference  # another process would find it on disk
    assert third.cache_stats == {"memory_hits": 0, "disk_hits": 1, "misses": 0}
    assert translations == [], "no revisit translates again"


@pytest.mark.slow
def test_a_changed_game_file_is_not_served_from_the_old_entry(game_file, tmp_path, translations):
    cache = tmp_path / "cache"
    sim = ALFWorldSimulator(engine_cache=cache)
    obs, _ = sim.load(game_file)
    assert "Welcome to TextWorld, ALFRED!" in obs
    text = game_file.read_text(encoding="utf-8")
    assert text.count("Welcome to TextWorld, ALFRED!") == 1
    game_file.write_text(text.replace("Welcome to TextWorld, ALFRED!", "Welcome back, ALFRED!"), encoding="utf-8")

    translations.clear()
    obs2, _ = sim.load(game_file)  # same simulator, same path, new content
    assert "Welcome back, ALFRED!" in obs2
    assert "Welcome to TextWorld" not in obs2
    assert obs2 == ALFWorldSimulator(engine_cache=False).load(game_file)[0]
    assert sim.cache_stats["misses"] == 2
    assert len(list(cache.glob("*.pickle.zlib"))) == 2


def _whole_entry(game: Path, cache: Path) -> bytes:
    ALFWorldSimulator(engine_cache=cache, translation_worker=False).load(game)
    (path,) = cache.glob("*.pickle.zlib")
    blob = path.read_bytes()
    shutil.rmtree(cache)
    EngineCache.clear_memory()
    return blob


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["foreign", "truncated", "wrong-shape"])
def test_an_unreadable_cache_file_is_a_miss_and_is_rewritten(game_file, tmp_path, translations, damage):
    cache = tmp_path / "cache"
    reference = ALFWorldSimulator(engine_cache=False).load(game_file)
    key = entry_key(game_file.read_bytes(), upgrade_games=True)
    if damage == "foreign":
        bad = b"torn"
    elif damage == "truncated":  # a partial copy of a whole entry (e.g. copied by hand, or a full disk)
        whole = _whole_entry(game_file, cache)
        bad = whole[: len(whole) // 2]
    else:  # valid zlib and pickle, but not a mapping of digests to pickles
        bad = zlib.compress(pickle.dumps({"digest": "not bytes"}))
    cache.mkdir()
    (cache / f"{key}.pickle.zlib").write_bytes(bad)
    translations.clear()
    sim = ALFWorldSimulator(engine_cache=cache, translation_worker=False)
    assert sim.load(game_file) == reference
    assert sim.cache_stats["misses"] == 1
    assert len(translations) == 2
    EngineCache.clear_memory()
    again = ALFWorldSimulator(engine_cache=cache)
    assert again.load(game_file) == reference
    assert again.cache_stats["disk_hits"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut-result", "wrong-result"])
def test_a_readable_entry_whose_results_do_not_load_is_discarded_and_rebuilt(game_file, tmp_path, translations,
                                                                            damage, caplog):
    """A well-formed file (zlib, a mapping of digests to pickles) whose results are damaged inside:
    the load drops it, computes the game again and rewrites the entry (found by a newcomer: the
    reset used to fail with UnpicklingError / AttributeError every time)."""
    cache = tmp_path / "cache"
    reference = ALFWorldSimulator(engine_cache=False).load(game_file)
    key = entry_key(game_file.read_bytes(), upgrade_games=True)
    results = pickle.loads(zlib.decompress(_whole_entry(game_file, cache)))
    assert results, "the entry holds results"
    if damage == "cut-result":
        results = {k: v[: len(v) // 2] for k, v in results.items()}
    else:
        results = {k: pickle.dumps(7) for k in results}
    cache.mkdir()
    (cache / f"{key}.pickle.zlib").write_bytes(zlib.compress(pickle.dumps(results)))
    EngineCache.clear_memory()
    translations.clear()
    sim = ALFWorldSimulator(engine_cache=cache, translation_worker=False)
    assert sim.load(game_file) == reference
    assert "discarded" in caplog.text
    assert len(translations) == 2
    EngineCache.clear_memory()
    again = ALFWorldSimulator(engine_cache=cache)
    assert again.load(game_file) == reference
    assert again.cache_stats["disk_hits"] == 1


def test_concurrent_writers_leave_one_whole_file(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    entries = [EngineEntry(results={"d": bytes([i]) * 200_000}, dirty=True) for i in range(8)]
    threads = [threading.Thread(target=cache.put, args=("k" * 64, e)) for e in entries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    EngineCache.clear_memory()
    got = cache.get("k" * 64)
    assert got.results["d"] in {e.results["d"] for e in entries}
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["k" * 64 + ".pickle.zlib"], "no temporary file left"


def test_serving_restores_the_engine_functions_after_an_error():
    from textworld.envs.pddl import logic as pddl_logic

    import textworld.logic as tw_logic
    from textworld.envs.pddl import textgen

    def bound():
        return (pddl_logic.GameLogic, fast_downward.pddl2sas, textgen._parse_and_convert, tw_logic._parse_and_convert)

    before = bound()
    with pytest.raises(RuntimeError), serving(EngineEntry()):
        assert all(now is not then for now, then in zip(bound(), before))
        raise RuntimeError("boom")
    assert bound() == before


OTHER_GAME = "valid_seen/pick_and_place_simple-Book-None-SideTable-329/trial_T20190908_050633_745514"


def _copy(test_data: Path, rel: str, dst: Path) -> Path:
    dst.parent.mkdir(parents=True)
    shutil.copyfile(test_data / "alfworld" / "json_2.1.1" / rel / "game.tw-pddl", dst)
    return dst


@pytest.mark.slow
def test_a_game_never_seen_reuses_what_other_games_parsed_and_plays_identically(test_data, tmp_path, translations):
    """The grammar snippets shared by all games are parsed once per process (content-keyed), and the
    optimised translation runs in the worker process: a second, different game must still give the
    observations and admissible commands of the uncached engine, step by step."""
    a = _copy(test_data, GAME, tmp_path / "a" / "game.tw-pddl")
    b = _copy(test_data, OTHER_GAME, tmp_path / "b" / "game.tw-pddl")
    references = [_play(ALFWorldSimulator(engine_cache=False), g) for g in (a, b)]
    engine_cache._SYMBOLS.clear()
    translations.clear()
    sim = ALFWorldSimulator(engine_cache=tmp_path / "cache")
    assert _play(sim, a) == references[0]
    hits, misses = engine_cache._SYMBOLS.hits, engine_cache._SYMBOLS.misses
    assert _play(sim, b) == references[1]
    assert engine_cache._SYMBOLS.hits - hits > engine_cache._SYMBOLS.misses - misses > 0, \
        "most of the second game's grammar is served from what the first one parsed"
    assert translations == [False, False], "the optimised translations ran in the worker, the plain ones here"
    EngineCache.clear_memory()
    engine_cache._SYMBOLS.clear()
    translations.clear()
    again = ALFWorldSimulator(engine_cache=tmp_path / "cache", translation_worker=False)
    assert [_play(again, g) for g in (a, b)] == references, "the worker's results, read back from disk"
    assert translations == []


@pytest.mark.slow
def test_a_dead_translation_worker_falls_back_to_translating_here(game_file, tmp_path, translations):
    reference = _play(ALFWorldSimulator(engine_cache=False), game_file)
    worker = engine_cache.start_translation_worker()
    assert worker is not None
    worker._proc.kill()
    worker._proc.wait()
    translations.clear()
    sim = ALFWorldSimulator(engine_cache=tmp_path / "cache")
    assert _play(sim, game_file) == reference
    assert sorted(translations) == [False, True], "the optimised translation was redone in this process"
    assert engine_cache.start_translation_worker() is not worker, "a broken worker is replaced"
    engine_cache.stop_translation_worker()


@pytest.mark.slow
def test_precompute_fills_the_cache_skips_whole_entries_and_an_interrupt_leaves_no_partial_file(tmp_path, monkeypatch):
    """agentfly-gym data precompute alfworld, on the sample shipped in the package."""
    from agentfly_gym.data.paths import sample_dir
    from agentfly_gym.envs.alfworld.precompute import precompute_engine_cache

    sample = sample_dir("alfworld")
    assert sample is not None
    cache = tmp_path / "cache"
    r = precompute_engine_cache(("valid_seen",), data_dir=sample, include_sample=False, cache_dir=cache, limit=2,
                                progress=False)
    assert (r["games"], r["computed"], r["present"], r["failed"]) == (2, 2, 0, 0)
    assert len(list(cache.glob("*.pickle.zlib"))) == 2
    EngineCache.clear_memory()
    real = fast_downward.pddl2sas

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fast_downward, "pddl2sas", interrupted)
    with pytest.raises(KeyboardInterrupt):
        precompute_engine_cache(("valid_seen",), data_dir=sample, include_sample=False, cache_dir=cache, limit=3,
                                progress=False)
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in cache.glob("*.pickle.zlib")), \
        "no temporary or partial file"
    assert len(list(cache.iterdir())) == 2
    monkeypatch.setattr(fast_downward, "pddl2sas", real)
    r = precompute_engine_cache(("valid_seen",), data_dir=sample, include_sample=False, cache_dir=cache, limit=3,
                                progress=False)
    assert (r["computed"], r["present"]) == (1, 2)


def test_a_load_pauses_the_garbage_collector_only_while_it_runs(game_file, tmp_path):
    import gc

    sim = ALFWorldSimulator(engine_cache=tmp_path / "cache", translation_worker=False)
    assert gc.isenabled()
    sim.load(game_file)
    assert gc.isenabled()
    broken = tmp_path / "broken" / "game.tw-pddl"
    broken.parent.mkdir()
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(EnvError):
        sim.load(broken)  # fails inside the engine block
    assert gc.isenabled(), "restored after a failed load too"
    gc.disable()
    try:
        sim.load(game_file)
        assert not gc.isenabled(), "a collector the caller paused stays paused"
    finally:
        gc.enable()


def test_the_cli_precomputes_into_agentfly_gym_cache_and_says_what_it_did(tmp_path, monkeypatch, capsys):
    """`agentfly-gym data precompute alfworld` writes under $AGENTFLY_GYM_CACHE, never into the data folder."""
    from agentfly_gym.data.paths import sample_dir
    from agentfly_gym.cli.data import data_main

    monkeypatch.setenv("AGENTFLY_GYM_CACHE", str(tmp_path / "cache"))
    sample = sample_dir("alfworld")
    before = sorted(p for p in sample.rglob("*"))
    argv = ["precompute", "alfworld", "--data-dir", str(sample), "--split", "valid_unseen", "--limit", "1",
            "--no-sample", "--no-progress"]
    assert data_main(argv) == 0
    assert "1 computed, 0 already there, 0 failed, of 1 games" in capsys.readouterr().out
    assert len(list((tmp_path / "cache" / "alfworld" / "engine").glob("*.pickle.zlib"))) == 1
    assert data_main(argv) == 0
    assert "0 computed, 1 already there" in capsys.readouterr().out
    assert sorted(p for p in sample.rglob("*")) == before
    with pytest.raises(SystemExit):
        data_main(["precompute", "webshop"])


def test_precompute_writes_an_entry_this_process_already_holds_in_memory(tmp_path):
    """An entry computed into one cache folder stays in the process's shared memory; a precompute into another
    folder must still write it there (it counted it as computed and wrote nothing, so the suite failed when an
    earlier test on the same worker had loaded the game)."""
    from agentfly_gym.data.paths import sample_dir
    from agentfly_gym.envs.alfworld.precompute import precompute_engine_cache

    EngineCache.clear_memory()
    kw = {"data_dir": sample_dir("alfworld"), "splits": ["valid_unseen"], "limit": 1, "include_sample": False,
          "progress": False}
    first = precompute_engine_cache(cache_dir=tmp_path / "a", **kw)
    second = precompute_engine_cache(cache_dir=tmp_path / "b", **kw)
    assert first["computed"] == 1
    assert second["computed"] == 1
    assert len(list((tmp_path / "a").glob("*.pickle.zlib"))) == 1
    assert len(list((tmp_path / "b").glob("*.pickle.zlib"))) == 1
    EngineCache.clear_memory()
