"""ALFWorld over many games: TextWorld's process-wide intern cache stays bounded, and emptying it changes nothing.

Real engine (TextWorld PDDL + Fast Downward), real games: the sample set shipped in the package.  The full
measurement (RSS over every game of the sample and full sets) is ``benchmarks/bench_memory_growth.py``.
"""

from __future__ import annotations

import pytest

from agentfly_gym.data.paths import sample_dir
from agentfly_gym.envs.alfworld import ALFWorldSimulator, load_index
from agentfly_gym.envs.alfworld import _compat
from agentfly_gym.errors import ConfigError

pytestmark = pytest.mark.timeout(600)


def _sample_games(n: int) -> list[str]:
    root = sample_dir("alfworld")
    assert root is not None, "the ALFWorld sample set is not shipped in the package"
    games: list[str] = []
    for split in ("valid_seen", "valid_unseen", "train"):
        games += [str(g.game_file) for g in load_index(root, split).games]
    assert len(games) >= n
    return games[:n]


def test_the_compat_module_was_verified_with_the_installed_textworld_and_mementos():
    bad = _compat.untested_versions()
    assert not bad, (
        f"agentfly_gym/envs/alfworld/_compat.py empties TextWorld's private intern cache and was verified only with "
        f"{_compat.TESTED}; installed: {bad}.  Check that mementos.core._memento_cache is still a pure memo of "
        f"immutable values compared by value (tests/test_alfworld_memory.py, the ALFWorld fidelity tests), then add "
        f"the versions to _compat.TESTED")
    assert isinstance(_compat.intern_cache_size(), int)


def test_with_an_untested_version_the_intern_cache_is_not_touched(monkeypatch):
    from mementos import core

    monkeypatch.setitem(_compat.TESTED, "mementos", ("0.0.0-not-this-one",))
    monkeypatch.setitem(core._memento_cache, ("agentfly-gym test", 1), object())
    assert _compat.untested_versions() == {"mementos": "1.3.1"}
    assert _compat.intern_cache_size() is None
    assert _compat.clear_intern_cache() is None
    assert ("agentfly-gym test", 1) in core._memento_cache


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_a_bad_bound_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="max_intern_entries"):
        ALFWorldSimulator(max_intern_entries=bad, engine_cache=False, translation_worker=False)


@pytest.mark.slow
def test_twenty_games_never_seen_keep_the_intern_cache_under_its_bound():
    """TextWorld interns ~600-900 facts per game for ever (~1.1 MB per game never seen before); with a bound of
    3000 entries, 20 games that would add several times that leave at most 3000 after every load."""
    bound = 3000
    _compat.clear_intern_cache()  # every game below is new to the intern cache, whatever ran before
    sim = ALFWorldSimulator(engine_cache="memory", max_intern_entries=bound)
    try:
        sizes, added = [], 0
        for g in _sample_games(20):
            before = _compat.intern_cache_size()
            _obs, info = sim.load(g)
            adm = info["admissible_actions"]
            after = _compat.intern_cache_size()
            added += after - before if after >= before else after
            sizes.append(after)
            sim.step(adm[0])
        assert max(sizes) <= bound, sizes
        assert sim.intern_clears >= 2, (sim.intern_clears, sizes)
        assert added > 3 * bound, (added, sizes)  # unbounded, the cache would have held this many
    finally:
        sim.close()


def _transcript(sim: ALFWorldSimulator, game: str, steps: int, clear_each_step: bool) -> list:
    obs, info = sim.load(game)
    out = [(obs, info["admissible_actions"], info["won"])]
    adm = info["admissible_actions"]
    for k in range(steps):
        if clear_each_step:
            _compat.clear_intern_cache()
        cmd = adm[(3 * k + 1) % len(adm)] if k % 4 else "go to nowhere"  # an inadmissible one now and then
        obs, won, adm, applied = sim.step(cmd)
        out.append((cmd, obs, adm, won, applied))
    return out


@pytest.mark.slow
def test_games_played_after_emptying_the_intern_cache_give_exactly_the_same_text():
    """The same games played twice: once never emptying the cache, once emptying it after every load and before
    every step (as another simulator's load may do mid-episode); every observation, admissible list and win flag
    is the same."""
    games = _sample_games(72)[::12]  # 6 games across the three splits
    keep = ALFWorldSimulator(engine_cache="memory", max_intern_entries=None)
    drop = ALFWorldSimulator(engine_cache="memory", max_intern_entries=0)
    try:
        for g in games:
            a = _transcript(keep, g, 12, clear_each_step=False)
            b = _transcript(drop, g, 12, clear_each_step=True)
            assert a == b, g
        assert drop.intern_clears == len(games)
        assert keep.intern_clears == 0
    finally:
        keep.close()
        drop.close()
