"""Every version-guarded workaround of an environment's dependency (the ``_compat`` modules of
``agentfly_gym/envs``) was verified with the installed versions, and switches itself off with any other.

The first tests fail loudly on a dependency upgrade, naming what to re-check; the others show that with an
unknown version a workaround touches nothing (the env still works, by the dependency's public behaviour).
Real packages throughout; the "unknown version" is simulated by editing ``TESTED``, the only stand-in.
"""

from __future__ import annotations

import importlib

import gymnasium
import pytest

import agentfly_gym  # noqa: F401  (registers agentfly/*)

MODULES = {
    "agentfly_gym.envs._compat": "reads gymnasium.make's max_episode_steps and a hand-made TimeLimit's limit from "
                                "Gymnasium's frames (tests/test_episode_limit.py)",
    "agentfly_gym.envs.alfworld._compat": "rebinds TextWorld/Fast Downward functions while a game loads, drops "
                                          "engine state, empties TextWorld's intern cache "
                                          "(tests/test_alfworld_engine_cache.py, test_alfworld_memory.py, "
                                          "the ALFWorld fidelity tests)",
    "agentfly_gym.envs.scienceworld._compat": "pipelines py4j calls on its wire protocol, defers py4j's object "
                                              "frees, launches JVMs in their own process group "
                                              "(tests/test_scienceworld*.py)",
}


@pytest.mark.parametrize("name", list(MODULES))
def test_each_compat_module_was_verified_with_the_installed_versions(name):
    mod = importlib.import_module(name)
    bad = mod.untested_versions()
    assert not bad, (f"{name.replace('.', '/')}.py {MODULES[name]}, verified only with {mod.TESTED}; installed: {bad}. "
                     f"Re-read the private names it uses in the new versions, run the tests named, then add the "
                     f"versions to TESTED")


def _unknown(monkeypatch, mod, dist):
    monkeypatch.setitem(mod.TESTED, dist, ("0.0.0-not-this-one",))
    monkeypatch.setattr(mod, "_warned", type(mod._warned)())
    assert dist in mod.untested_versions()


def test_with_an_unknown_gymnasium_make_leaves_the_env_its_own_limit(monkeypatch, caplog):
    from agentfly_gym.envs import _compat

    made = gymnasium.make("agentfly/Chess-v0", max_episode_steps=3)
    made.unwrapped._closed = True
    assert made.unwrapped.max_episode_steps == 3  # the known version: read from make
    _unknown(monkeypatch, _compat, "gymnasium")
    env = gymnasium.make("agentfly/Chess-v0", max_episode_steps=3)
    try:
        assert env.unwrapped.max_episode_steps is None  # Chess's own default; TimeLimit still truncates at 3
        assert env.spec.max_episode_steps == 3
        assert "pass max_episode_steps to the env itself" in caplog.text
    finally:
        env.unwrapped._closed = True


def test_with_an_unknown_textworld_no_engine_function_is_rebound(monkeypatch):
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic

    from agentfly_gym.envs.alfworld import _compat
    from agentfly_gym.envs.alfworld.engine_cache import EngineEntry, serving

    before = (pddl_logic.GameLogic, fast_downward.pddl2sas)
    with serving(EngineEntry()):
        assert (pddl_logic.GameLogic, fast_downward.pddl2sas) != before  # the known versions: answered
    _unknown(monkeypatch, _compat, "fast-downward-textworld")
    with serving(EngineEntry()) as entry:
        assert (pddl_logic.GameLogic, fast_downward.pddl2sas) == before
    assert entry.results == {}

    class Engine:
        def __init__(self):
            self.state = self.prev_state = "kept"

    engine = Engine()
    assert _compat.drop_game_state(engine) is False
    assert engine.state == "kept"


def test_with_an_unknown_py4j_calls_are_not_pipelined(monkeypatch):
    from py4j.java_gateway import GatewayClient, JavaGateway

    from agentfly_gym.envs.scienceworld import _compat

    gateway = JavaGateway(gateway_parameters=None, gateway_client=GatewayClient(), auto_field=False)
    assert _compat.can_pipeline(gateway) is hasattr(__import__("socket"), "TCP_QUICKACK")
    _unknown(monkeypatch, _compat, "py4j")
    assert _compat.can_pipeline(gateway) is False
    assert _compat.defer_object_frees(gateway, []) is False


def test_one_version_rule_for_every_compat_module(caplog):
    """Exact versions and release series ("2.60.") are matched by one rule (utils.versions.is_checked), which the
    env _compat modules' TESTED tables, Ray's and the tokenizer mirror's checks all use; warnings come once."""
    import logging
    import threading

    from agentfly_gym.utils.versions import is_checked, warn_once

    assert is_checked("1.4.0", ("1.4.0",))
    assert not is_checked("1.4.01", ("1.4.0",))
    assert is_checked("2.60.1", ("2.60.",))
    assert not is_checked("2.600.0", ("2.60.",))
    assert not is_checked("not installed", ("2.60.",))
    log = logging.getLogger("agentfly_gym.test_versions")
    per_version: set[str] = set()
    once = threading.Event()
    with caplog.at_level(logging.WARNING, logger=log.name):
        for v in ("9.0", "9.0", "9.1"):
            warn_once(per_version, v, log, "per version %s", v)
            warn_once(once, v, log, "once %s", v)
    assert [r.getMessage() for r in caplog.records] == ["per version 9.0", "once 9.0", "per version 9.1"]
