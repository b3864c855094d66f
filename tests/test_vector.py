"""AsyncTextVectorEnv on the real Chess environment (real Stockfish, Lichess sample)."""

from __future__ import annotations

import asyncio
import os
import signal

import gymnasium
import gymnasium.error
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import agentfly_gym  # noqa: F401
from agentfly_gym.envs.chess import ChessEnv
from agentfly_gym.errors import CallOrderError, ConfigError, ResetNeeded
from agentfly_gym.resources import ResourceManager
from agentfly_gym.vector import AsyncTextVectorEnv
from proctools import live_processes, mark_tree, wait_gone
from waiting import until


@pytest.fixture(autouse=True)
def no_leaked_engines(monkeypatch):
    """This test's own engines (tagged or below this process, so that other test runs on the machine do
    not count) must not outlive it."""
    marker = mark_tree(monkeypatch)
    before = live_processes(["stockfish"], marker=marker)
    yield
    assert not wait_gone(live_processes(["stockfish"], marker=marker) - before, 10), "a stockfish process outlived its test"


def test_make_vec_returns_async_text_vector_env_with_batch_semantics():
    venv = gymnasium.make_vec("agentfly/Chess-v0", num_envs=3)
    try:
        assert isinstance(venv, AsyncTextVectorEnv)
        assert venv.num_envs == 3
        obs, infos = venv.reset(seed=11)
        assert isinstance(obs, tuple)
        assert len(obs) == 3
        assert all(isinstance(o, str) and o for o in obs)
        assert infos["_task_id"].all()
        assert len(set(infos["task_id"])) >= 2
        again, infos2 = venv.reset(seed=11)
        assert again == obs
        assert list(infos2["task_id"]) == list(infos["task_id"])
        legal = [infos["admissible_actions"][i][0] for i in range(3)]
        obs, rew, term, trunc, infos = venv.step(legal)
        assert rew.dtype == np.float64
        assert term.dtype == np.bool_
        assert len(obs) == 3
        assert venv.observation_space.contains(obs)
    finally:
        venv.close()


async def test_next_step_autoreset_after_a_failed_puzzle():
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 2, manager=m)
        obs, infos = await venv.areset(seed=3)
        wrong = []
        for i in range(2):
            expert = await venv.envs[i].expert_action()
            wrong.append(next(a for a in infos["admissible_actions"][i] if a != expert))
        obs, rew, term, trunc, infos = await venv.astep(wrong)
        assert term.all()
        assert (rew == 0).all()
        obs2, rew2, term2, trunc2, infos2 = await venv.astep(["ignored", "ignored"])  # the autoreset step
        assert not term2.any()
        assert (rew2 == 0).all()
        assert all("Puzzle" in o for o in obs2)
        assert (infos2["step"] == 0).all()
        await venv.aclose()


async def test_same_step_autoreset_reports_final_obs():
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 1, manager=m,
                                                   autoreset_mode=AutoresetMode.SAME_STEP)
        obs, infos = await venv.areset(seed=5)
        expert = await venv.envs[0].expert_action()
        wrong = next(a for a in infos["admissible_actions"][0] if a != expert)
        obs, rew, term, trunc, infos = await venv.astep([wrong])
        assert term[0]
        assert "final_obs" in infos
        assert infos["_final_obs"][0]
        assert "Puzzle" in obs[0]
        assert infos["final_obs"][0] != obs[0]
        await venv.aclose()


async def test_disabled_autoreset_needs_reset_mask():
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 2, manager=m,
                                                   autoreset_mode="Disabled")
        obs, infos = await venv.areset(seed=9)
        expert0 = await venv.envs[0].expert_action()
        wrong0 = next(a for a in infos["admissible_actions"][0] if a != expert0)
        keep1 = infos["admissible_actions"][1][0]
        stepped, *_ = await venv.astep([wrong0, keep1])
        with pytest.raises(ResetNeeded, match="reset_mask") as info:  # a call-order misuse, not a bad value
            await venv.astep(["e2e4", "e2e4"])
        assert isinstance(info.value, CallOrderError)
        obs, infos = await venv.areset(options={"reset_mask": np.array([True, False])})
        # the sub-env not reset keeps its current observation, as in Gymnasium (tests/test_vector_gymnasium.py)
        assert obs[1] == stepped[1]
        assert obs[0]
        assert infos["_task_id"].tolist() == [True, False]
        await venv.aclose()


@pytest.mark.slow
async def test_send_recv_returns_fast_envs_without_waiting_for_a_slow_one():
    """Three fast puzzle envs and one game vs a Stockfish that thinks 3 s per move."""
    async with ResourceManager() as m:
        fns = [lambda: ChessEnv(manager=m) for _ in range(3)]
        fns.append(lambda: ChessEnv(manager=m, mode="play", engine_depth=None, engine_movetime=3.0, skill_level=20))
        venv = AsyncTextVectorEnv(fns)
        obs, infos = await venv.areset(seed=1)
        actions = [infos["admissible_actions"][i][0] for i in range(4)]
        await venv.asend(actions)
        with pytest.raises(gymnasium.error.AlreadyPendingCallError) as pending:  # Gymnasium's name for it
            await venv.asend(["e2e4"], env_ids=[3])
        assert isinstance(pending.value, CallOrderError)
        assert pending.value.env_id == 3
        obs, rew, term, trunc, infos, ids = await venv.arecv(min_ready=1)
        assert 3 not in ids.tolist()
        assert len(ids) >= 1
        assert len(obs) == len(ids)
        assert not venv._pending[3].done()  # the slow env is still thinking
        rest = []
        while venv._pending:
            *_, more = await venv.arecv(min_ready=1)
            rest += more.tolist()
        assert 3 in rest
        assert sorted(ids.tolist() + rest) == [0, 1, 2, 3]
        await venv.aclose()


async def test_recv_timeout_returns_empty_batch():
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv([lambda: ChessEnv(manager=m, mode="play", engine_depth=None, engine_movetime=1.0,
                                                    skill_level=20)])
        obs, infos = await venv.areset(seed=0)
        await venv.asend([infos["admissible_actions"][0][0]])
        obs, rew, term, trunc, infos, ids = await venv.arecv(min_ready=1, timeout=0.01)
        assert ids.size == 0
        assert obs == ()
        *_, ids = await venv.arecv(min_ready=1)
        assert ids.tolist() == [0]
        await venv.aclose()


async def test_sub_envs_share_one_manager_and_its_caps():
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 3, manager=m, mode="play",
                                                   max_instances=2, engine_depth=1)
        await venv.areset_env(0, seed=0)
        await venv.areset_env(1, seed=1)
        third = asyncio.ensure_future(venv.areset_env(2, seed=2))
        await until(lambda: any(p.metrics.waiting for p in m.pools.values()), 60, "the third env to queue")
        assert not third.done()  # the third env waits for an engine
        await venv.envs[0].aend_episode()
        await asyncio.wait_for(third, 30)
        pool = next(iter(m.pools.values()))
        assert pool.metrics.started == 2
        assert pool.metrics.max_in_use == 2
        assert pool.metrics.reused == 1
        await venv.aclose()


async def test_a_dead_engine_truncates_only_its_own_env():
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 2, manager=m, mode="play",
                                                   engine_depth=1)
        obs, infos = await venv.areset(seed=0)
        engine = next(iter(venv.envs[0].scope.resources.values())).obj
        os.kill(engine.pid, signal.SIGKILL)
        assert not wait_gone([engine.pid], 10)
        actions = [infos["admissible_actions"][i][0] for i in range(2)]
        obs, rew, term, trunc, infos = await venv.astep(actions)
        assert trunc[0]
        assert infos["error"][0]
        assert not trunc[1]
        assert infos["error"][1] is None
        await venv.aclose()


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ConfigError) as info:
        AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 0)
    assert info.value.field == "num_envs"
    with pytest.raises(ConfigError) as info:
        AsyncTextVectorEnv([lambda: ChessEnv()], autoreset_mode="sometimes")
    assert info.value.field == "autoreset_mode"
    venv = AsyncTextVectorEnv([lambda: ChessEnv()])
    with pytest.raises(ConfigError, match="expected 1 actions"):
        venv.step(["a", "b"])
    venv.close()


def test_batch_reset_beyond_pool_capacity_is_refused_at_once():
    venv = gymnasium.make_vec("agentfly/Chess-v0", num_envs=3, mode="play", max_instances=2)
    try:
        with pytest.raises(ConfigError, match="max_instances=2") as info:
            venv.reset(seed=0)
        assert info.value.field == "max_instances"
    finally:
        venv.close()


def test_gymnasium_async_vector_env_forked_after_a_sync_env_was_used():
    """A sync env used in this process starts the background loop; a worker forked afterwards (Gymnasium's
    ``AsyncVectorEnv``, ``fork`` start method) inherits the loop object but not its thread, and used to wait
    forever on it.  The worker must start its own loop and play."""
    import multiprocessing

    env = gymnasium.make("agentfly/Chess-v0")
    env.reset(seed=0)
    env.close()
    venv = gymnasium.vector.AsyncVectorEnv([lambda: gymnasium.make("agentfly/Chess-v0")] * 2, shared_memory=False,
                                           context="fork")
    try:
        venv.reset_async(seed=[0, 1])
        try:
            obs, _info = venv.reset_wait(timeout=120)
        except multiprocessing.TimeoutError:
            pytest.fail("the forked workers did not reset within 120 s (waiting on the parent's loop?)")
        assert all("Puzzle" in o for o in obs)
    finally:
        venv.close(terminate=True)


async def test_same_step_autoreset_that_fails_is_contained_to_its_sub_env():
    """Under SAME_STEP, a sub-env whose autoreset raises reports the fault in its own slot (obs, info["error"],
    final_obs of the episode that ended) and the batch step returns; its next step retries the reset.  The
    reset fault is injected (a replaced ``_reset_episode`` raising) because no real reset of this env fails on
    demand; the envs, engine and puzzles are real."""
    async with ResourceManager() as m:
        venv = AsyncTextVectorEnv.from_entry_point("agentfly_gym.envs.chess:ChessEnv", 2, manager=m,
                                                   autoreset_mode=AutoresetMode.SAME_STEP)
        obs, infos = await venv.areset(seed=5)
        wrong = []
        for i in range(2):
            expert = await venv.envs[i].expert_action()
            wrong.append(next(a for a in infos["admissible_actions"][i] if a != expert))
        broken = venv.envs[0]

        async def fail(*args, **kwargs):
            raise RuntimeError("injected reset fault")

        broken._reset_episode = fail
        obs, rew, term, trunc, infos = await venv.astep(wrong)  # raised RuntimeError before the fix
        assert term.all()
        assert "injected reset fault" in infos["error"][0]
        assert infos["error"][1] is None
        assert infos["final_obs"][0]
        assert "Puzzle" in obs[1]
        del broken._reset_episode
        obs, rew, term, trunc, infos = await venv.astep(["ignored", next(iter(infos["admissible_actions"][1]))])
        assert "Puzzle" in obs[0]
        assert not term[0]
        assert not trunc[0]
        assert infos["error"][0] is None
        await venv.aclose()
