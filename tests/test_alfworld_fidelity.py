"""ALFWorldEnv against alfworld 0.4.2's own AlfredTWEnv, side by side on real games (a fast slice).

The reference is upstream's ``AlfredTWEnv(config, "train").init_env(1)`` (TextWorld's gym env with
ALFWorld's demangler, infos and hand-coded expert wrappers, and the 50-step limit) on a copy of
each game brought to the 2.1.2 release as alfworld's ``scripts/patch_tw-pddl.py`` does (see
``benchmarks/fidelity_alfworld.py``, which runs the same comparison on a few dozen games).  After
the reset and after every step the observation string, the admissible command list (order
included), the reward and the done flag must be equal.  Nothing is faked.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from agentfly_gym.envs.alfworld import ALFWorldEnv
from agentfly_gym.envs.alfworld import simulator as sim_module
from agentfly_gym.envs.alfworld.logic import game_version, upgrade_game
from agentfly_gym.errors import EnvError
from agentfly_gym.resources.manager import ResourceManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fidelity_alfworld as fidelity

pytestmark = pytest.mark.timeout(600)

EXAMPLE = fidelity.EXAMPLE  # valid_unseen look_at_obj_in_light-Bowl-None-DeskLamp-308
LOOK_BOWL = "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704"
PLACE_BOOK = "valid_seen/pick_and_place_simple-Book-None-SideTable-329/trial_T20190908_050633_745514"
COOL_EGG = "valid_seen/pick_cool_then_place_in_recep-Egg-None-Microwave-24/trial_T20190908_234112_645480"

# The issue's walk: drawer 2 and drawer 3 share a location, so "go to drawer 3" from drawer 2 is not
# admissible; nor is going where the agent stands.
DRAWER_WALK = ["go to drawer 1", "go to drawer 2", "go to drawer 3", "go to drawer 2", "go to drawer 1",
               "go to drawer 1", "GO TO DRAWER 3", "help", "open drawer 1", "look", "go to drawer 3"]


@pytest.fixture
def alfworld_root(test_data) -> Path:
    return test_data / "alfworld"


async def side_by_side(root: Path, tmp_path: Path, task_id: str, *, upgrade: bool = True, **kwargs) -> dict:
    """Run ``fidelity.compare_game`` for one game; our env and the reference play the same commands."""
    split = task_id.split("/", 1)[0]
    async with ResourceManager() as manager:
        env = ALFWorldEnv(data_dir=root, split=split, manager=manager, max_instances=1, upgrade_games=upgrade)
        game = env.index.by_task_id(task_id)
        trial = fidelity.make_reference_copy(game.game_file, tmp_path / "ref", patch=upgrade).parent
        ref = fidelity.Reference(trial)
        try:
            result = await fidelity.compare_game(env, task_id, ref, engine_lock=sim_module._ENGINE_LOCK, **kwargs)
        finally:
            ref.close()
        await env.aclose()
    return result


def _walk(result: dict) -> list[tuple[str | None, str]]:
    return list(zip([None, *result["commands"]], result["observations"]))


@pytest.mark.slow
async def test_issue_example_drawers_as_alfworld_0_4(alfworld_root, tmp_path):
    r = await side_by_side(alfworld_root, tmp_path, EXAMPLE, script=DRAWER_WALK)
    assert r["mismatches"] == []
    assert r["steps"] == len(DRAWER_WALK)
    assert r["compared"] == 2 + 4 * len(DRAWER_WALK)
    walk = _walk(r)
    assert walk[0][1].startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert walk[0][1].endswith("\n\nYour task is to: look at bowl under the desklamp.")
    assert walk[1:7] == [
        ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
        ("go to drawer 2", "You arrive at drawer 2. On the drawer 2, you see a pencil 1."),
        ("go to drawer 3", "Nothing happens."),  # same location as drawer 2
        ("go to drawer 2", "Nothing happens."),  # where the agent stands
        ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
        ("go to drawer 1", "Nothing happens."),
    ]
    assert walk[7] == ("GO TO DRAWER 3", "Nothing happens.")  # commands are case-sensitive upstream
    assert walk[8][1].startswith("Available commands:\n  look:")
    assert walk[9][1].startswith("You open the drawer 1. The drawer 1 is open.")


@pytest.mark.slow
async def test_issue_example_as_stored_matches_alfredtwenv_on_the_same_files(alfworld_root, tmp_path):
    """``upgrade_games=False`` plays the json_2.1.1 files as stored: AlfredTWEnv on the unchanged files agrees."""
    r = await side_by_side(alfworld_root, tmp_path, EXAMPLE, upgrade=False, script=DRAWER_WALK[:3] + ["help"])
    assert r["mismatches"] == []
    assert _walk(r)[1:] == [("go to drawer 1", "You arrive at loc 6. The drawer 1 is closed."),
                            ("go to drawer 2", "You arrive at loc 1. On the drawer 2, you see a pencil 1."),
                            ("go to drawer 3", "Nothing happens."), ("help", "Nothing happens.")]


@pytest.mark.slow
async def test_the_comparison_catches_the_2_1_1_answers(alfworld_root, tmp_path):
    """The check can fail: our env playing the stored 2.1.1 files differs from AlfredTWEnv on 2.1.2 ones."""
    async with ResourceManager() as manager:
        env = ALFWorldEnv(data_dir=alfworld_root, split="valid_unseen", manager=manager, max_instances=1,
                          upgrade_games=False)
        trial = fidelity.make_reference_copy(env.index.by_task_id(EXAMPLE).game_file, tmp_path / "ref", patch=True)
        ref = fidelity.Reference(trial.parent)
        try:
            r = await fidelity.compare_game(env, EXAMPLE, ref, script=["go to drawer 1"],
                                            engine_lock=sim_module._ENGINE_LOCK)
        finally:
            ref.close()
        await env.aclose()
    assert {(m["step"], m["field"]) for m in r["mismatches"]} == {(0, "admissible"), (1, "observation"),
                                                                  (1, "admissible")}  # "help" is missing
    assert [m["ours"] for m in r["mismatches"] if m["field"] == "observation"] == [
        "You arrive at loc 6. The drawer 1 is closed."]


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [LOOK_BOWL, COOL_EGG])
async def test_handcoded_expert_with_probes_matches_alfredtwenv(alfworld_root, tmp_path, task_id):
    """ALFWorld's hand-coded expert drives both; every 3rd step is a probe (help, look, inventory, an
    inadmissible ``go to``, an upper-case command, a made-up one, a random admissible command)."""
    r = await side_by_side(alfworld_root, tmp_path, task_id, policy="handcoded", max_steps=24)
    assert r["mismatches"] == []
    assert r["steps"] >= 6
    assert r["compared"] == 2 + 4 * r["steps"]
    assert "reference_error" not in r
    commands = set(r["commands"])
    assert "help" in commands
    assert any(c.isupper() for c in commands)  # an upper-case probe: "Nothing happens." on both sides


@pytest.mark.slow
async def test_planner_expert_wins_the_upgraded_game_like_alfredtwenv(alfworld_root, tmp_path):
    """Our planner's plan for the upgraded game uses ALFWorld 0.4's ``move <o> to <r>`` and wins on both."""
    r = await side_by_side(alfworld_root, tmp_path, PLACE_BOOK, policy="planner", max_steps=20)
    assert r["mismatches"] == []
    assert r["won"] is True
    assert any(c.startswith("move book") for c in r["commands"])
    assert not any(" in/on " in c for c in r["commands"])


# ------------------------------------------------------------------------------------ logic (no engine)


def _game(root: Path, task_id: str) -> dict:
    return json.loads((root / "json_2.1.1" / task_id / "game.tw-pddl").read_text())


def test_upgrade_game_is_the_2_1_2_release(alfworld_root):
    old = _game(alfworld_root, EXAMPLE)
    before = copy.deepcopy(old)
    new = upgrade_game(old)
    assert old == before  # the input is not changed
    assert (game_version(old), game_version(new)) == ("2.1.1", "2.1.2")
    assert "You arrive at {r.name}." in new["grammar"]
    assert "{lend.name}" not in new["grammar"]
    assert 'template :: "move {o} to {r}"' in new["grammar"]
    assert "put {o} in/on {r}" not in new["grammar"]
    assert "You move the {o.name} to the {r.name}." in new["grammar"]
    assert new["pddl_domain"].count("(:action help") == 1
    assert new["pddl_domain"].rstrip().endswith(")")
    assert new["pddl_problem"] == old["pddl_problem"]
    assert new["solvable"] == old["solvable"]
    # Per-game content is kept: the task sentence and the game's own domain (SinkType for clean).
    assert "Your task is to: look at bowl under the desklamp." in new["grammar"]
    assert "\n                (receptacleType ?r SinkType)" in new["pddl_domain"]
    assert upgrade_game(new) == new  # a 2.1.2 game is left as it is
    # The reference's independent re-creation of upstream's patch gives the same game version.
    assert game_version(fidelity.upstream_patch(old)) == "2.1.2"


def test_upgrade_game_rejects_what_is_not_a_game():
    with pytest.raises(EnvError, match="grammar"):
        upgrade_game({"pddl_domain": "(define)"})
    with pytest.raises(EnvError, match="pddl_domain"):
        upgrade_game({"grammar": "grammar :: {}", "pddl_domain": None})


@pytest.mark.slow
async def test_normalize_actions_is_an_option_not_the_default(alfworld_root):
    async with ResourceManager() as manager:
        faithful = ALFWorldEnv(data_dir=alfworld_root, split="valid_unseen", manager=manager, max_instances=1)
        await faithful.areset(options={"task_id": EXAMPLE})
        obs, *_, info = await faithful.astep("Go to  Drawer 1")
        assert (obs, info["applied"]) == ("Nothing happens.", False)
        await faithful.aclose()
        lenient = ALFWorldEnv(data_dir=alfworld_root, split="valid_unseen", manager=manager, max_instances=1,
                              normalize_actions=True)
        await lenient.areset(options={"task_id": EXAMPLE})
        obs, *_, info = await lenient.astep("Go to  Drawer 1")
        assert (obs, info["applied"]) == ("You arrive at drawer 1. The drawer 1 is closed.", True)
        await lenient.aclose()
