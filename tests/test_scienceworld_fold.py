"""ScienceWorld's folded step: the py4j calls of a step (step, score, completion, moves, and valid actions
when asked) pipelined in one round trip must give exactly what the same calls give one by one.

Real JVM, real tasks (short gold paths of the three splits) plus unknown, empty, free and waiting
commands.  Two checks: after every folded step, the JVM's own getters called one by one agree with
what the fold returned (exact); and a replay of the same actions with ``fold_calls=False`` gives the
same rewards, scores, move counts and flags, and the same observations up to the order in which the
simulator lists a room's items (that order changes from one load to the next upstream, see
test_scienceworld_fidelity.py).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from agentfly_gym.envs.scienceworld.simulator import ScienceWorldSimulator, _pipelined_call

pytestmark = pytest.mark.timeout(600)

CASES = [("find-non-living-thing", 0, "easy"), ("chemistry-mix-paint-secondary-color", 27, ""), ("find-animal", 224, "easy")]
EXTRA = ["fly to the moon", "", "inventory", "task", "look at the ceiling", "wait1"]


def _items(text: str) -> Counter:
    return Counter(part.strip() for part in re.split(r"\n|, | and ", text) if part.strip())


def _same_actions(ours: list[str], theirs: list[str]) -> bool:
    """Equal as sets, or of equal length with equal counts per verb: the simulator names some referents
    differently from one listing to the next in the same state ("blue paint on cup", "blue paint in
    wood cup containing blue paint")."""
    if sorted(ours) == sorted(theirs):
        return True
    return len(ours) == len(theirs) and Counter(a.split()[0] for a in ours) == Counter(a.split()[0] for a in theirs)


@pytest.fixture(scope="module")
def sim():
    s = ScienceWorldSimulator()
    assert s.fold_calls, "pipelining is available on Linux with py4j 0.10.9"
    yield s
    s.close()


def _play(sim: ScienceWorldSimulator, task: str, variation: int, simplification: str, actions: list[str],
          check_getters: bool) -> list[tuple]:
    out = []
    obs, info = sim.load(task, variation, simplification, admissible=True)
    out.append((obs, 0.0, False, info))
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, info = sim.step(action, admissible=t % 4 == 0)
        assert truncated is False
        if check_getters:  # the same state read one call at a time
            assert info["score"] == round(100 * sim._call("getScore"))
            assert info["completed"] == sim._call("getCompleted")
            assert info["moves"] == sim._call("getNumMoves")
            if "admissible_actions" in info:
                assert _same_actions(info["admissible_actions"], sim.valid_actions())
        out.append((obs, reward, terminated, info))
        if terminated:
            break
    return out


@pytest.mark.parametrize("task, variation, simplification", CASES)
def test_folded_steps_equal_the_unfolded_calls(sim, task, variation, simplification):
    sim.load(task, variation, simplification, gold=True)
    actions = EXTRA + sim.gold_actions()
    sim.fold_calls = True
    folded = _play(sim, task, variation, simplification, actions, check_getters=True)
    sim.fold_calls = False
    try:
        unfolded = _play(sim, task, variation, simplification, actions, check_getters=False)
    finally:
        sim.fold_calls = True
    assert len(folded) == len(unfolded)
    for t, (f, u) in enumerate(zip(folded, unfolded)):
        where = f"{task}:{variation} step {t}"
        assert f[0] == u[0] or _items(f[0]) == _items(u[0]), where
        assert f[1:3] == u[1:3], where
        fi, ui = dict(f[3]), dict(u[3])
        fa, ua = fi.pop("admissible_actions", None), ui.pop("admissible_actions", None)
        assert fi == ui, where
        assert (fa is None) == (ua is None) and (fa is None or _same_actions(fa, ua)), where
    assert folded[-1][3]["won"], "the gold path wins"
    assert any(b[3]["moves"] - a[3]["moves"] > 1 for a, b in zip(folded, folded[1:])), "wait1 ticks more than once"


def test_an_error_in_the_middle_of_a_fold_leaves_the_connection_in_step(sim):
    from py4j.protocol import Py4JError

    sim.load("find-non-living-thing", 0, "easy")
    with pytest.raises(Py4JError, match="noSuchMethod"):
        _pipelined_call(sim._server, (("getNumMoves",), ("noSuchMethod",), ("getScore",)))
    for _ in range(5):  # every pooled connection still answers its own calls
        moves, score = _pipelined_call(sim._server, (("getNumMoves",), ("getScore",)))
        assert (moves, score) == (sim._call("getNumMoves"), sim._call("getScore"))
    obs, reward, terminated, _, info = sim.step("open door to kitchen")
    assert info["moves"] == sim._call("getNumMoves") and not terminated
