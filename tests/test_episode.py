"""play_episode: one function plays an episode in chain or step mode, turns a failure into an error
trajectory (or raises it) and releases the episode's resources.  Real Chess env (Stockfish), scripted
expert policy; the token ids are the bundled SmolLM2 tokenizer's."""

from __future__ import annotations

import pytest

import agentfly_gym  # noqa: F401
from agentfly_gym.errors import ConfigError, PolicyError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout import ExpertPolicy, play_episode
from agentfly_gym.rollout.chat import ChatTokenizer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoTokenizer

    from agentfly_gym.rollout.models import smollm2_dir

    return ChatTokenizer(AutoTokenizer.from_pretrained(str(smollm2_dir())))


def _in_use(m: ResourceManager) -> int:
    return sum(p["in_use"] for p in m.metrics().values())


@pytest.mark.parametrize("mode", ["chain", "step"])
async def test_plays_either_mode_and_releases_the_scope(chat, mode):
    async with ResourceManager() as m:
        traj = await play_episode("agentfly/Chess-v0", ExpertPolicy(), chat, mode=mode, manager=m, max_turns=10,
                                  seed=2, trajectory_id="t", group_id="g")
        assert _in_use(m) == 0
    assert (traj.mode, traj.trajectory_id, traj.group_id, traj.env_id) == (mode, "t", "g", "agentfly/Chess-v0")
    assert traj.success
    assert traj.status == "complete"
    assert traj.error is None
    if mode == "chain":
        assert not traj.steps
        assert sum(traj.response_mask) > 0
    else:
        assert len(traj.steps) == traj.num_turns
        assert not traj.response_ids
        assert all(r.episode_return == traj.reward == 1.0 for r in traj.steps)


async def test_env_kwargs_reach_the_env_and_its_engine_is_released(chat):
    async with ResourceManager() as m:
        traj = await play_episode("agentfly/Chess-v0", ExpertPolicy(), chat, manager=m, max_turns=2, seed=0,
                                  env_kwargs={"mode": "play", "engine_depth": 1})
        pools = m.metrics().values()
        assert sum(p["started"] for p in pools) >= 1
        assert _in_use(m) == 0
    assert traj.error is None
    assert traj.num_turns >= 1
    assert "move" in traj.messages[1]["content"].lower()


async def test_a_failure_is_an_error_trajectory_or_raised(chat):
    async with ResourceManager() as m:
        # a reset option Chess does not know: the env raises from areset, after it was made
        traj = await play_episode("agentfly/Chess-v0", ExpertPolicy(), chat, mode="step", manager=m, seed=0,
                                  options={"no_such_option": 1}, trajectory_id="bad", group_id="g")
        assert traj.status == "error"
        assert traj.error.startswith("ConfigError: ")
        assert "no_such_option" in traj.error
        assert (traj.trajectory_id, traj.mode, traj.num_turns, traj.prompt_ids) == ("bad", "step", 0, [])
        with pytest.raises(ConfigError, match="no_such_option"):
            await play_episode("agentfly/Chess-v0", ExpertPolicy(), chat, manager=m, options={"no_such_option": 1},
                               on_error="raise")
        assert _in_use(m) == 0


class ExpertThenFails:
    """A user's ActionPolicy that plays the expert's first move and then raises (as a policy with a bug would)."""

    def __init__(self):
        self.expert, self.calls = ExpertPolicy(), 0

    async def act(self, observation, info, env):
        self.calls += 1
        if self.calls > 1:
            raise PolicyError("no idea what to play")
        return await self.expert.act(observation, info, env)


@pytest.mark.parametrize("mode", ["chain", "step"])
async def test_a_policy_failure_mid_episode_keeps_what_was_played(chat, mode):
    async with ResourceManager() as m:
        traj = await play_episode("agentfly/Chess-v0", ExpertThenFails(), chat, mode=mode, manager=m, max_turns=10,
                                  seed=2)
        with pytest.raises(PolicyError, match="no idea"):
            await play_episode("agentfly/Chess-v0", ExpertThenFails(), chat, mode=mode, manager=m, seed=2,
                               on_error="raise")
        assert _in_use(m) == 0
    assert traj.error == "PolicyError: no idea what to play"
    assert traj.status == "error"
    assert traj.truncated
    assert not traj.terminated
    assert traj.num_turns == 1
    assert traj.prompt_ids
    if mode == "chain":
        assert sum(traj.response_mask) > 0
        assert traj.messages[-1]["role"] == "user"
    else:
        assert len(traj.steps) == 1
        assert traj.steps[0].done
        assert traj.steps[0].episode_return == traj.reward


async def test_bad_arguments_name_the_value(chat):
    with pytest.raises(ConfigError, match="mode='tree'") as info:
        await play_episode("agentfly/Chess-v0", ExpertPolicy(), chat, mode="tree")
    assert info.value.field == "mode"
    with pytest.raises(ConfigError, match="on_error='ignore'") as info:
        await play_episode("agentfly/Chess-v0", ExpertPolicy(), chat, on_error="ignore")
    assert info.value.field == "on_error"
