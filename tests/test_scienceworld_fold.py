"""ScienceWorld's folded step: the py4j calls of a step (step, score, completion, moves, and valid actions
when asked) made in one call by our Java class (``java_fold``), or pipelined in one round trip, must give
exactly what the same calls give one by one.

Real JVM, real tasks (short gold paths of the three splits) plus unknown, empty, free, help and waiting
commands.  Two checks: after every step of the Java fold and of the pipelined fold, the JVM's own getters
called one by one agree with what the step returned (exact); and replays of the same actions through the
pipelined and the separate calls give the same rewards, scores, move counts and flags as the Java fold,
and the same observations up to the order in which the simulator lists a room's items (that order changes
from one load to the next upstream, see test_scienceworld_fidelity.py).  The shipped class is recompiled
from its source where a JDK is present and must behave the same; a class the JVM refuses makes the
simulator fall back to the pipelined calls, with one warning.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from agentfly_gym.envs.scienceworld import java_fold
from agentfly_gym.envs.scienceworld import simulator as simulator_module
from agentfly_gym.envs.scienceworld._compat import pipelined_call
from agentfly_gym.envs.scienceworld.simulator import ScienceWorldSimulator

pytestmark = pytest.mark.timeout(600)

CASES = [("find-non-living-thing", 0, "easy"), ("chemistry-mix-paint-secondary-color", 27, ""), ("find-animal", 224, "easy")]
EXTRA = ["fly to the moon", "", "inventory", "task", "look at the ceiling", "wait1", "help"]


def _extra(task: str) -> list[str]:
    """EXTRA, plus a plain ``wait`` (10 ticks) where the gold path still wins after it (animals move)."""
    return EXTRA + ([] if "animal" in task else ["wait"])


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
    assert s.java_fold, "the shipped Java class loads into the package's JVM"
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


def _assert_same_plays(folded: list[tuple], other: list[tuple], where: str) -> None:
    assert len(folded) == len(other), where
    for t, (f, u) in enumerate(zip(folded, other)):
        at = f"{where} step {t}"
        assert f[0] == u[0] or _items(f[0]) == _items(u[0]), at
        assert f[1:3] == u[1:3], at
        fi, ui = dict(f[3]), dict(u[3])
        fa, ua = fi.pop("admissible_actions", None), ui.pop("admissible_actions", None)
        assert fi == ui, at
        assert (fa is None) == (ua is None) and (fa is None or _same_actions(fa, ua)), at


@pytest.mark.slow
@pytest.mark.parametrize("task, variation, simplification", CASES)
def test_folded_steps_equal_the_unfolded_calls(sim, task, variation, simplification):
    sim.load(task, variation, simplification, gold=True)
    actions = _extra(task) + sim.gold_actions()
    plays = {}
    for path, (java, fold) in {"java": (True, True), "pipelined": (False, True), "separate": (False, False)}.items():
        sim.java_fold, sim.fold_calls = java, fold
        try:
            plays[path] = _play(sim, task, variation, simplification, actions, check_getters=path != "separate")
        finally:
            sim.java_fold, sim.fold_calls = True, True
    for path in ("pipelined", "separate"):
        _assert_same_plays(plays["java"], plays[path], f"{task}:{variation} java vs {path}")
    folded = plays["java"]
    assert folded[-1][3]["won"], "the gold path wins"
    assert any(b[3]["moves"] - a[3]["moves"] > 1 for a, b in zip(folded, folded[1:])), "wait1 ticks more than once"
    assert any(o.startswith("Possible actions:") for o, *_ in folded), "help answers"


def _class_version(path) -> int:
    data = path.read_bytes()
    assert data[:4] == b"\xca\xfe\xba\xbe", path
    return int.from_bytes(data[6:8], "big")


@pytest.mark.slow
def test_the_shipped_class_targets_java_8_and_matches_its_source(sim, tmp_path, monkeypatch):
    """The committed class is Java 8 (the package's jar's release); rebuilt from the source with the
    JDK here (skipped without one), it plays a task exactly as the shipped one.  The rebuilt class runs
    in a second JVM: py4j caches reflected methods by class name, so one JVM holds one version."""
    shipped = java_fold.CLASSES_DIR.joinpath(*java_fold.CLASS_NAME.split(".")).with_suffix(".class")
    assert _class_version(shipped) == 52 == 44 + java_fold.JAVA_RELEASE
    import shutil

    if shutil.which("javac") is None:
        pytest.skip("no JDK here: the shipped class is not rebuilt")
    rebuilt = java_fold.build(tmp_path)
    assert _class_version(rebuilt) == 52
    real_load = java_fold.load
    monkeypatch.setattr(java_fold, "load", lambda gateway, server: real_load(gateway, server, tmp_path))
    fresh = ScienceWorldSimulator()
    try:
        assert fresh.java_fold
        task, variation, simplification = CASES[0]
        sim.load(task, variation, simplification, gold=True)
        actions = _extra(task) + sim.gold_actions()
        plays = [_play(s, task, variation, simplification, actions, check_getters=True) for s in (sim, fresh)]
    finally:
        fresh.close()
    _assert_same_plays(*plays, f"{task}:{variation} shipped vs rebuilt class")
    assert plays[0][-1][3]["won"]


def test_a_class_the_jvm_refuses_falls_back_to_pipelined_calls_with_one_warning(sim, tmp_path, monkeypatch, caplog):
    bad = tmp_path.joinpath(*java_fold.CLASS_NAME.split(".")).with_suffix(".class")
    bad.parent.mkdir(parents=True)
    shipped = java_fold.CLASSES_DIR.joinpath(*java_fold.CLASS_NAME.split(".")).with_suffix(".class").read_bytes()
    bad.write_bytes(shipped[:6] + (99).to_bytes(2, "big") + shipped[8:])  # as if built for Java 55 (class file 99)
    with pytest.raises(java_fold.FoldUnavailable, match="UnsupportedClassVersionError"):
        java_fold.load(sim._gateway, sim._server, tmp_path)
    with pytest.raises(java_fold.FoldUnavailable, match="no agentflygym"):
        java_fold.load(sim._gateway, sim._server, tmp_path / "nothing")

    real_load = java_fold.load
    monkeypatch.setattr(java_fold, "load", lambda gateway, server: real_load(gateway, server, tmp_path))
    monkeypatch.setattr(simulator_module, "_FOLD_FALLBACK_LOGGED", False)
    caplog.set_level("DEBUG", logger=simulator_module.__name__)
    fallback = ScienceWorldSimulator()
    try:
        assert not fallback.java_fold
        assert fallback.fold_calls
        fallback.load(*CASES[0])
        obs, _, _, _, info = fallback.step("wait1")
        assert info["moves"] == fallback._call("getNumMoves") > 0
        assert obs
        sim.load(*CASES[0])
        assert (obs, info) == sim.step("wait1")[::4]
    finally:
        fallback.close()
    warnings = [r for r in caplog.records if "Java step fold is unavailable" in r.getMessage()]
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert "pipelined" in warnings[0].getMessage()


def test_decode_reads_what_the_class_writes():
    assert java_fold.decode("0.25\ntrue\n7\nsa\nb\n\n") == ("a\nb\n\n", 0.25, True, 7)
    assert java_fold.decode("-1.0\nfalse\nnull\nn") == (None, -1.0, False, None)
    assert java_fold.decode("0.1\nfalse\n3\ns") == ("", 0.1, False, 3)
    with pytest.raises(ValueError):
        java_fold.decode("0.1\nyes\n3\ns")
    with pytest.raises(ValueError):
        java_fold.decode("0.1\nfalse\n3")


def test_an_error_in_the_middle_of_a_fold_leaves_the_connection_in_step(sim):
    from py4j.protocol import Py4JError

    sim.load("find-non-living-thing", 0, "easy")
    with pytest.raises(Py4JError, match="noSuchMethod"):
        pipelined_call(sim._server, (("getNumMoves",), ("noSuchMethod",), ("getScore",)))
    for _ in range(5):  # every pooled connection still answers its own calls
        moves, score = pipelined_call(sim._server, (("getNumMoves",), ("getScore",)))
        assert (moves, score) == (sim._call("getNumMoves"), sim._call("getScore"))
    obs, reward, terminated, _, info = sim.step("open door to kitchen")
    assert info["moves"] == sim._call("getNumMoves")
    assert not terminated
