"""ALFWorld's engine cache (agentfly_gym.envs.alfworld.engine_cache) on the real engine and real game files.

A game's load computes TextWorld's GameLogic and Fast Downward's two translations; the cache must
serve a revisited game (same simulator, another simulator, another process via the disk) without
translating again, and the game must play exactly as without the cache.  A changed game file must
not be served from the old entry.  Fast Downward's ``pddl2sas`` is wrapped by a counting spy that
calls the real function.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import fast_downward
import pytest

from agentfly_gym.envs.alfworld import ALFWorldSimulator
from agentfly_gym.envs.alfworld.engine_cache import EngineCache, EngineEntry, entry_key, serving

pytestmark = pytest.mark.timeout(300)

GAME = "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704"


@pytest.fixture
def game_file(shared_data, tmp_path) -> Path:
    dst = tmp_path / "game" / "game.tw-pddl"
    dst.parent.mkdir()
    shutil.copyfile(shared_data / "alfworld" / "json_2.1.1" / GAME / "game.tw-pddl", dst)
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


def test_a_revisited_game_is_served_from_the_cache_and_plays_identically(game_file, tmp_path, translations):
    cache = tmp_path / "cache"
    reference = _play(ALFWorldSimulator(engine_cache=False), game_file)
    assert len(translations) == 4, "uncached: PddlEnv.load and reset translate twice each"

    translations.clear()
    first = ALFWorldSimulator(engine_cache=cache)
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
    assert "Welcome back, ALFRED!" in obs2 and "Welcome to TextWorld" not in obs2
    assert obs2 == ALFWorldSimulator(engine_cache=False).load(game_file)[0]
    assert sim.cache_stats["misses"] == 2
    assert len(list(cache.glob("*.pickle.zlib"))) == 2


def test_an_unreadable_cache_file_is_a_miss_and_is_rewritten(game_file, tmp_path, translations):
    cache = tmp_path / "cache"
    reference = ALFWorldSimulator(engine_cache=False).load(game_file)
    key = entry_key(game_file.read_bytes(), upgrade_games=True)
    cache.mkdir()
    (cache / f"{key}.pickle.zlib").write_bytes(b"torn")
    translations.clear()
    sim = ALFWorldSimulator(engine_cache=cache)
    assert sim.load(game_file) == reference
    assert sim.cache_stats["misses"] == 1 and len(translations) == 2
    EngineCache.clear_memory()
    again = ALFWorldSimulator(engine_cache=cache)
    assert again.load(game_file) == reference and again.cache_stats["disk_hits"] == 1


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

    before = (pddl_logic.GameLogic, fast_downward.pddl2sas)
    with pytest.raises(RuntimeError), serving(EngineEntry()):
        assert pddl_logic.GameLogic is not before[0]
        raise RuntimeError("boom")
    assert (pddl_logic.GameLogic, fast_downward.pddl2sas) == before
