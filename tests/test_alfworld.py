"""agentfly/ALFWorld-v0 on the real ALFWorld engine (TextWorld PDDL + Fast Downward) and real game files
(the subset in tests/data, or the full set given by AGENTFLY_GYM_DATA).

Nothing is faked: every test loads real games, and the expert's plans come from the real planner
in its child process.  Games are picked among quick ones of valid_seen (plan in ~2 s here).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentfly_gym  # noqa: F401  (registers the environments)
from agentfly_gym.data.paths import sample_dir
from agentfly_gym.envs.alfworld import (
    NOTHING_HAPPENS,
    TASK_TYPES,
    ALFWorldEnv,
    ALFWorldSimulator,
    ExpertPlanError,
    ExpertPlanTimeout,
    compute_plan,
    load_index,
    parse_task_types,
)
from agentfly_gym.envs.alfworld import env as env_module
from agentfly_gym.envs.alfworld import planner as planner_module
from agentfly_gym.errors import ConfigError, DataNotFoundError, EnvError, ResetNeeded
from agentfly_gym.resources.manager import ResourceManager
from agentfly_gym.resources.select import default_manager
from agentfly_gym.utils.aio import run_sync

pytestmark = pytest.mark.timeout(300)

# Quick games of valid_seen (3-4 step plans).
LOOK_BOWL = "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704"
PLACE_BOOK = "valid_seen/pick_and_place_simple-Book-None-SideTable-329/trial_T20190908_050633_745514"


@pytest.fixture
def alfworld_root(test_data) -> Path:
    return test_data / "alfworld"


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache folder, so plans and indexes are really computed."""
    path = tmp_path / "cache"
    monkeypatch.setenv("AGENTFLY_GYM_CACHE", str(path))
    return path


def _pool(manager: ResourceManager) -> dict:
    (snap,) = manager.metrics().values()
    return snap


def _children() -> list[str]:
    """Command lines of this process's live child processes (Linux /proc)."""
    out = []
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] != "Z":
                out.append((stat.parent / "cmdline").read_text().replace("\0", " "))
        except (OSError, IndexError):
            continue
    return out


# ---------------------------------------------------------------------------------------------- data


# (solvable games, skipped unsolvable, skipped unsupported) per split: the repository's subset (tests/data, see
# scripts/make_test_data.py) and ALFWorld's full json_2.1.1 release (when AGENTFLY_GYM_DATA points at it)
SUBSET_COUNTS = {"valid_seen": (7, 1, 2), "valid_unseen": (7, 1, 1), "train": (6, 0, 0)}
FULL_COUNTS = {"valid_seen": (140, 47, 64), "valid_unseen": (134, 58, 63), "train": (200, 0, 0)}  # ALFWorld's


def test_split_counts_match_alfworld(alfworld_root, fresh_cache, monkeypatch):
    from agentfly_gym.envs.alfworld import games

    # an earlier test in this process may have scanned these splits: start from an empty memory cache, so that the
    # on-disk index is written here whatever the test order
    monkeypatch.setattr(games, "_memory_cache", {})
    subset = alfworld_root.resolve() == (Path(__file__).resolve().parent / "data" / "alfworld")
    expected = SUBSET_COUNTS if subset else FULL_COUNTS
    seen = load_index(alfworld_root, "valid_seen")
    unseen = load_index(alfworld_root, "valid_unseen")
    train = load_index(alfworld_root, "train")
    got = {name: (len(idx), idx.skipped["unsolvable"], idx.skipped["unsupported"])
           for name, idx in (("valid_seen", seen), ("valid_unseen", unseen), ("train", train))}
    assert got == expected  # the full release: ALFWorld's standard evaluation sets, 140 and 134 games
    # ALFWorld's own split names, and "train" on a layout that names the folder valid_train
    assert [g.task_id for g in load_index(alfworld_root, "eval_in_distribution").games] == [g.task_id for g in seen.games]
    assert train.folder.name == "valid_train"
    assert all(g.game_file.is_file() for g in seen.games)
    assert any(fresh_cache.joinpath("alfworld", "index").glob("*.json"))  # the index is cached on disk
    # the split names every env shares: validation = valid_seen, test = valid_unseen
    assert [g.task_id for g in load_index(alfworld_root, "validation").games] == [g.task_id for g in seen.games]
    assert [g.task_id for g in load_index(alfworld_root, "test").games] == [g.task_id for g in unseen.games]
    with pytest.raises(ConfigError, match="valid_seen"):
        load_index(alfworld_root, "dev")


def test_upstream_train_layout_and_solvable_filter(alfworld_root, tmp_path, fresh_cache):
    """A root laid out as alfworld-download does (json_2.1.1/train), holding a solvable, an
    unsolvable and a movable trial (symlinked from the test data)."""
    import json

    src = alfworld_root / "json_2.1.1" / "valid_seen"
    solvable = next(p for p in sorted(src.glob("*/*/game.tw-pddl")) if json.loads(p.read_text())["solvable"])
    unsolvable = next(p for p in sorted(src.glob("*/*/game.tw-pddl")) if not json.loads(p.read_text())["solvable"])
    movable = next(p for p in sorted(src.glob("*movable*/*/traj_data.json")))
    root = tmp_path / "alfworld"
    for p in (solvable, unsolvable, movable):
        trial = p.parent
        dest = root / "json_2.1.1" / "train" / trial.parent.name / trial.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(trial, target_is_directory=True)
    idx = load_index(root, "train")
    assert idx.folder.name == "train"
    assert [g.game_file.parent.name for g in idx.games] == [solvable.parent.name]
    assert idx.skipped["unsolvable"] == 1
    assert idx.skipped["unsupported"] == 1


def test_task_type_filter(alfworld_root):
    by_id = load_index(alfworld_root, "valid_seen", [2, "6"])
    by_name = load_index(alfworld_root, "valid_seen", ["look_at_obj_in_light", "pick_two_obj_and_place"])
    assert [g.task_id for g in by_id.games] == [g.task_id for g in by_name.games]
    assert set(by_id.counts()) == {"look_at_obj_in_light", "pick_two_obj_and_place"}
    everything = load_index(alfworld_root, "valid_seen")
    assert sum(everything.counts().values()) == len(everything)
    assert set(everything.counts()) == set(TASK_TYPES.values())
    assert len(by_id) == everything.counts()["look_at_obj_in_light"] + everything.counts()["pick_two_obj_and_place"]
    assert 0 < len(by_id) < len(everything)
    assert by_id.skipped["task_type"] == len(everything) - len(by_id)
    env = ALFWorldEnv(data_dir=alfworld_root, split="valid_seen", task_types=4)
    assert {g.task_type for g in env.games} == {"pick_heat_then_place_in_recep"}
    for bad in (0, 7, "pick_nothing", [], True):
        with pytest.raises(ConfigError, match="task type|selects nothing"):
            parse_task_types(bad)


def test_missing_data_says_how_to_get_it_or_uses_the_sample(tmp_path, monkeypatch):
    with pytest.raises(DataNotFoundError, match="alfworld-download") as info:
        ALFWorldEnv(data_dir=tmp_path / "nowhere")
    assert "nowhere" in str(info.value)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("AGENTFLY_GYM_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    # configured folders without json_2.1.1 fall through to the sample shipped in the package
    env = gymnasium.make("agentfly/ALFWorld-v0")
    assert env.unwrapped.data_root == sample_dir("alfworld")
    env.close()


# ---------------------------------------------------------------------------------------------- env


def _small_root(alfworld_root: Path, tmp_path: Path, task_ids: list[str]) -> Path:
    """A data root holding only ``task_ids`` (trial folders symlinked from the test data)."""
    root = tmp_path / "alfworld-small"
    for task_id in task_ids:
        dest = root / "json_2.1.1" / task_id
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(alfworld_root / "json_2.1.1" / task_id, target_is_directory=True)
    return root


@pytest.mark.slow
def test_make_and_check_env(alfworld_root, tmp_path):
    """check_env resets ~12 times; two games keep that fast (a replayed game skips parsing)."""
    root = _small_root(alfworld_root, tmp_path, [LOOK_BOWL, PLACE_BOOK])
    env = gymnasium.make("agentfly/ALFWorld-v0", data_dir=root, split="valid_seen")
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(options={"task_id": LOOK_BOWL})
        assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert obs.endswith("Your task is to: examine the bowl with the desklamp.")
        assert info["task_type"] == "look_at_obj_in_light"
        assert info["goal"] == "examine the bowl with the desklamp."
        assert isinstance(info["admissible_actions"], list)
        assert "look" in info["admissible_actions"]
        assert info["won"] is False
        assert info["score"] == 0.0
        assert info["task_id"].startswith("valid_seen/")
        _obs, reward, terminated, _truncated, info = env.step(info["admissible_actions"][0])
        assert reward == 0.0
        assert not terminated
        assert info["applied"] is True
        assert env.unwrapped.agent_prompt.parse_action("I will look.\nAction: go to desk 1") == "go to desk 1"
    finally:
        env.close()
        run_sync(_close_default_manager())


async def _close_default_manager():
    await default_manager().aclose()


@pytest.mark.slow
async def test_expert_solves_games_and_plans_once(alfworld_root, fresh_cache, monkeypatch):
    calls = []
    real = env_module.compute_plan

    async def counting(*args, **kwargs):  # a spy around the real planner
        calls.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(env_module, "compute_plan", counting)
    async with ResourceManager() as manager:
        env = ALFWorldEnv(data_dir=alfworld_root, split="valid_seen", manager=manager, max_instances=1)
        with pytest.raises(ResetNeeded):
            await env.expert_action()
        for task_id in (LOOK_BOWL, PLACE_BOOK):
            calls.clear()
            _obs, info = await env.areset(options={"task_id": task_id})
            assert info["task_id"] == task_id
            for _ in range(20):
                action = await env.expert_action()
                assert action in info["admissible_actions"]
                _obs, reward, terminated, truncated, info = await env.astep(action)
                if terminated or truncated:
                    break
            assert (reward, terminated, truncated, info["won"], info["score"]) == (1.0, True, False, True, 1.0)
            assert len(calls) == 1  # one plan per episode, not one per step
            with pytest.raises(ResetNeeded):
                await env.expert_action()
        plans = list(fresh_cache.joinpath("alfworld", "plans").rglob("*.json"))
        assert len(plans) == 2
        # A second episode of a game reads its plan from the disk cache: with the planner's
        # child script made unreachable, only the cache can answer.
        worker = planner_module._WORKER
        monkeypatch.setattr(planner_module, "_WORKER", fresh_cache / "no-such-worker.py")
        await env.areset(options={"task_id": LOOK_BOWL})
        first = await env.expert_action()
        assert first in env._admissible
        monkeypatch.setattr(planner_module, "_WORKER", worker)
        # Deviating from the plan makes the expert plan again from the current state.
        other = next(a for a in env._admissible if a.startswith("go to") and a != first)
        await env.astep(other)
        follow = await env.expert_action()
        assert follow in env._admissible
        m = _pool(manager)
        assert (m["started"], m["reused"], m["resets"]) == (1, 2, 2)
        await env.aclose()


async def test_invalid_empty_and_long_actions_are_handled(alfworld_root):
    async with ResourceManager() as manager:
        env = ALFWorldEnv(data_dir=alfworld_root, split="valid_seen", manager=manager, max_instances=1,
                          normalize_actions=True)
        _obs0, info0 = await env.areset(options={"task_id": PLACE_BOOK})
        admissible = info0["admissible_actions"]
        for bad in ("", "   ", "fly to the moon", "go to desk 999", "x" * 100_000, "go to\ndesk 1", "é🙂"):
            obs, reward, terminated, truncated, info = await env.astep(bad)
            assert obs == NOTHING_HAPPENS
            assert (reward, terminated, truncated, info["applied"], info["error"]) == (0.0, False, False, False, None)
            assert info["admissible_actions"] == admissible
        with pytest.raises(TypeError):
            await env.astep(None)
        # Upper case and doubled spaces are forgiven (normalize_actions=True).
        target = next(a for a in admissible if a.startswith("go to "))
        obs, reward, terminated, truncated, info = await env.astep("  " + target.upper().replace(" ", "  ") + " ")
        assert info["applied"] is True
        assert obs.startswith("You arrive at")
        assert info["step"] == 8
        with pytest.raises(ConfigError, match="task_id"):
            await env.areset(options={"task_id": "valid_seen/nope"})
        with pytest.raises(ConfigError, match="unknown reset option"):
            await env.areset(options={"game": 1})
        await env.aclose()


async def test_simulator_reused_with_reset_and_no_state_leak(alfworld_root):
    async with ResourceManager() as manager:
        env = ALFWorldEnv(data_dir=alfworld_root, split="valid_seen", manager=manager, max_instances=1,
                          max_episode_steps=3)
        obs_a, info_a = await env.areset(options={"task_id": PLACE_BOOK})
        sim = env._sim.resource
        # Change the game's state: walk somewhere and pick something up if possible.
        for _ in range(3):
            action = next(a for a in env._admissible if a.startswith(("take", "go to")))
            *_, truncated, _info = await env.astep(action)
        assert truncated  # max_episode_steps=3 ends the episode and releases the simulator
        obs_b, info_b = await env.areset(options={"task_id": LOOK_BOWL})
        assert env._sim.resource is sim  # the same simulator serves the next episode
        assert sim.obj.history == []
        obs_a2, info_a2 = await env.areset(options={"task_id": PLACE_BOOK})
        assert env._sim.resource is sim
        assert (obs_a2, info_a2["admissible_actions"]) == (obs_a, info_a["admissible_actions"])
        m = _pool(manager)
        assert (m["started"], m["reused"], m["resets"], m["max_in_use"]) == (1, 2, 2, 1)
        await env.aclose()
    # A fresh simulator loading the same game sees what the reused one saw.
    fresh = ALFWorldSimulator()
    try:
        obs, info = fresh.load(env.index.by_task_id(LOOK_BOWL).game_file)
        assert (obs, info["admissible_actions"]) == (obs_b, info_b["admissible_actions"])
        fresh.step(info["admissible_actions"][0])
        assert fresh.history == [info["admissible_actions"][0]]
        fresh.reset()  # what the pool calls before reuse: nothing of the game is left
        assert (fresh.game_file, fresh.history, fresh.admissible_commands) == (None, [], [])
        with pytest.raises(EnvError, match="no game is loaded"):
            fresh.step("look")
    finally:
        fresh.close()


async def test_memory_watch_replaces_a_grown_simulator(alfworld_root):
    # the watch reads the whole process's RSS: garbage an earlier test on this worker left for the cycle collector,
    # freed between the baseline and the check, once shrank RSS by more than the ballast grew it (random order)
    gc.collect()
    async with ResourceManager() as manager:
        env = ALFWorldEnv(data_dir=alfworld_root, split="valid_seen", manager=manager, max_instances=1,
                          max_rss_growth="48m")
        await env.areset(options={"task_id": PLACE_BOOK})
        first = env._sim.resource
        ballast = bytearray(b"\1" * (256 << 20))  # process memory grows by ~256 MiB, 5x the limit
        await env.areset(options={"task_id": PLACE_BOOK})
        assert env._sim.resource is not first
        m = _pool(manager)
        assert (m["started"], m["replaced"]) == (2, 1)
        del ballast
        await env.aclose()


@pytest.mark.slow
async def test_planner_timeout_kills_the_child(alfworld_root, fresh_cache):
    game = load_index(alfworld_root, "valid_seen").by_task_id(PLACE_BOOK).game_file
    t0 = time.monotonic()
    with pytest.raises(ExpertPlanTimeout, match="planner_timeout"):
        await compute_plan(game, timeout=0.3)
    assert time.monotonic() - t0 < 20  # killed at 0.3 s, not left to plan (margin for a loaded machine)
    assert not [c for c in _children() if "_plan_worker" in c]
    with pytest.raises(ExpertPlanError, match="not admissible"):
        await compute_plan(game, ["fly to the moon"], timeout=60)


async def test_concurrent_episodes_on_two_simulators(alfworld_root):
    """Two simulators of one process load and step at the same time (TextWorld's parsers are not
    thread-safe; the simulator serialises engine calls)."""
    async with ResourceManager() as manager:
        envs = [ALFWorldEnv(data_dir=alfworld_root, split="valid_seen", manager=manager, max_instances=2)
                for _ in range(2)]
        results = await asyncio.gather(envs[0].areset(options={"task_id": LOOK_BOWL}),
                                       envs[1].areset(options={"task_id": PLACE_BOOK}))
        assert [info["task_id"] for _, info in results] == [LOOK_BOWL, PLACE_BOOK]
        assert envs[0]._sim.resource is not envs[1]._sim.resource
        steps = await asyncio.gather(*(e.astep(info["admissible_actions"][0]) for e, (_, info) in zip(envs, results)))
        assert all(info["applied"] and info["error"] is None for *_, info in steps)
        assert _pool(manager)["max_in_use"] == 2
        for e in envs:
            await e.aclose()
