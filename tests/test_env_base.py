"""What every environment declares on :class:`AgentFlyEnv`: reset options, the expert, the fault observation.

Real environments (Chess on the Lichess sample and the real Stockfish) and the real vector env.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import gymnasium
import pytest

import agentfly_gym  # noqa: F401  (registers the env ids)
from agentfly_gym.bridges.openenv import OpenEnvEnv
from agentfly_gym.envs.base import AgentFlyEnv, fault_step
from agentfly_gym.envs.chess import ChessEnv
from agentfly_gym.errors import ConfigError, NoExpert, PolicyError, ResourceDied
from agentfly_gym.registration import ENVS
from agentfly_gym.resources import ResourceManager
from agentfly_gym.utils.imports import load_object
from agentfly_gym.rollout.policies.baselines import ExpertPolicy
from agentfly_gym.vector import AsyncTextVectorEnv

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name", sorted(ENVS))
def test_every_registered_env_declares_its_reset_options_and_expert(name):
    cls = load_object(ENVS[name][0])
    assert issubclass(cls, AgentFlyEnv)
    options = cls.reset_options or cls().reset_options  # Chess sets them per mode (a cheap constructor)
    assert isinstance(options, Mapping)
    assert options
    assert all(isinstance(k, str) and isinstance(v, str) and v for k, v in options.items())
    assert cls.expert_action is not AgentFlyEnv.expert_action  # all five have an expert


async def test_unknown_reset_option_is_refused_before_any_resource_is_taken():
    async with ResourceManager() as m:
        play = ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1)
        puzzle = ChessEnv(manager=m)
        assert set(play.reset_options) == {"agent_color", "fen"}
        assert set(puzzle.reset_options) == {"split", "task_id"}
        with pytest.raises(ConfigError) as ei:
            await play.areset(options={"task_id": "tewjc", "colour": "white"})
        assert str(ei.value) == "Chess: unknown reset options ['colour', 'task_id']; valid: ['agent_color', 'fen']"
        assert not play.scope_is_open
        assert not m.pools
        with pytest.raises(ConfigError, match=r"unknown reset options \['fen'\]; valid: \['split', 'task_id'\]"):
            await puzzle.areset(options={"fen": "8/8/8/8/8/8/8/8 w - - 0 1"})
        _, info = await puzzle.areset(options={"task_id": "mJDcO"})  # a declared option is accepted
        assert info["task_id"] == "mJDcO"
        episode = puzzle.episode_id
        with pytest.raises(ConfigError, match="unknown reset options"):
            await puzzle.areset(options={"task_id": "tewjc", "seed": 3})
        assert puzzle.scope_is_open
        assert puzzle.episode_id == episode
        await puzzle.astep(await puzzle.expert_action())
        await puzzle.aclose()


async def test_expert_action_is_declared_on_the_base():
    env = OpenEnvEnv(base_url="http://127.0.0.1:9")  # a bridge: no expert of its own
    assert env.reset_options is None  # its options go to the OpenEnv server, which checks them
    with pytest.raises(NoExpert, match="OpenEnv has no expert") as ei:
        await env.expert_action()
    assert isinstance(ei.value, NotImplementedError)
    with pytest.raises(PolicyError, match="OpenEnv has no expert"):
        await ExpertPolicy().act("", {}, env)
    chess_env = gymnasium.make("agentfly/Chess-v0")  # ExpertPolicy reaches through the wrappers
    try:
        await chess_env.unwrapped.areset(options={"task_id": "mJDcO"})
        assert await ExpertPolicy().act("", {}, chess_env) == await chess_env.unwrapped.expert_action()
    finally:
        await chess_env.unwrapped.aclose()


def test_fault_step_format():
    e = ResourceDied("container-3 stopped answering")
    assert fault_step(e) == ("Error: ResourceDied: container-3 stopped answering. The episode has ended.", 0.0,
                             False, True, {"error": "ResourceDied: container-3 stopped answering"})
    assert fault_step("the environment did not answer within step_timeout=5s")[4] == {
        "error": "the environment did not answer within step_timeout=5s"}


async def test_base_and_vector_faults_give_the_same_observation():
    """Sub-env 0's fault is handled by the env (its Stockfish killed), sub-env 1's by the vector env (its step
    raised): the same observation and ``info["error"]`` format, both truncated with reward 0."""
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv([lambda: ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1)] * 2)
        await venv.areset(seed=0)
        engine = venv.envs[0].scope.resources[venv.envs[0].engine_spec.key]
        os.kill(engine.obj.pid, 9)
        base = await venv.astep_env(0, "e2e4")
        vector = await venv.astep_env(1, 42)  # type: ignore[arg-type]  # not a str: the env raises TypeError
        for obs, reward, terminated, truncated, info in (base, vector):
            assert (reward, terminated, truncated) == (0.0, False, True)
            assert obs == f"Error: {info['error']}. The episode has ended."
            assert (obs, reward, terminated, truncated, {"error": info["error"]}) == fault_step(info["error"])
        assert base[4]["error"].split(":")[0] in ("ResourceDied", "EngineTerminatedError", "BrokenPipeError")
        assert vector[4]["error"].startswith("TypeError: Chess: action must be a str, got int")
        assert not venv.envs[0].scope_is_open
        assert not venv.envs[1].scope_is_open
        await venv.aclose()
