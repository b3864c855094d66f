"""Chain and step rollouts, the runner and its files, on real environments and a real model.

Model: the bundled SmolLM2-135M-Instruct (CPU) where token fidelity is the point; scripted
policies (expert, random) where only the plumbing is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math

import gymnasium
import pyarrow.parquet as pq
import pytest

import agentfly_gym  # noqa: F401
from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout import (ExpertPolicy, RandomPolicy, RolloutConfig, SamplingParams, load_trajectories,
                                  run_chain_episode, run_rollouts)
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.step import run_step_episode
from proctools import live_processes, mark_tree, wait_gone
from waiting import until


@pytest.fixture(autouse=True)
def no_leaked_simulators(monkeypatch):
    """This test's own JVMs and engines (tagged or below this process, so that other test runs on the
    machine do not count) must not outlive it."""
    marker = mark_tree(monkeypatch)
    before = live_processes(["java", "stockfish"], marker=marker)
    yield
    assert not wait_gone(live_processes(["java", "stockfish"], marker=marker) - before), \
        "a simulator process outlived its test"


class Recording:
    """Wraps a real policy and records every Generation it returns."""

    def __init__(self, policy):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.generations = []

    async def generate(self, prompt_ids, sampling):
        g = await self.policy.generate(prompt_ids, sampling)
        self.generations.append((list(prompt_ids), g))
        return g


@pytest.fixture(scope="module")
def smollm2_policy():
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir(), seed=0, max_batch_size=8)
    yield policy
    policy.close()


def _segments(traj):
    """Runs of equal mask as (mask, ids, logprobs)."""
    out, start = [], 0
    for i in range(1, len(traj.response_mask) + 1):
        if i == len(traj.response_mask) or traj.response_mask[i] != traj.response_mask[start]:
            out.append((traj.response_mask[start], traj.response_ids[start:i], traj.response_logprobs[start:i]))
            start = i
    return out


@pytest.mark.slow
async def test_chain_keeps_sampled_ids_verbatim_and_matches_a_fresh_render(smollm2_policy):
    policy = Recording(smollm2_policy)
    chat = ChatTokenizer(policy.tokenizer)
    tok = policy.tokenizer
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped
        traj = await run_chain_episode(env, policy, chat, sampling=SamplingParams(max_tokens=24, temperature=1.0, seed=1),
                                       max_turns=3, seed=4)
        await env.aclose()
    assert traj.num_turns == len(policy.generations) >= 1
    n = len(traj.response_ids)
    assert len(traj.response_mask) == n == len(traj.response_logprobs)
    # 1. every turn's prompt was exactly the chain so far, and its sampled ids sit verbatim at mask 1
    chain = traj.prompt_ids + traj.response_ids
    sampled_runs = [s for s in _segments(traj) if s[0] == 1]
    assert len(sampled_runs) == len(policy.generations)
    for (prompt, gen), (_, ids, lps) in zip(policy.generations, sampled_runs):
        assert prompt == chain[: len(prompt)]
        assert len(prompt) >= len(traj.prompt_ids)
        assert ids == gen.token_ids
        assert all(math.isclose(a, b, rel_tol=0, abs_tol=1e-6) for a, b in zip(lps, gen.logprobs))
        assert all(lp <= 0 for lp in lps)
    assert all(lp == 0.0 for mask, _, lps in _segments(traj) if mask == 0 for lp in lps)
    # 2. the whole sequence equals a fresh render of the conversation, except inside assistant turns whose
    #    decode/re-encode is not the identity (the drift that re-tokenizing would have introduced)
    fresh = tok.apply_chat_template(traj.messages, tokenize=True, add_generation_prompt=False)
    fresh = list(fresh["input_ids"] if isinstance(fresh, dict) or hasattr(fresh, "keys") else fresh)
    expected = list(traj.prompt_ids)
    drifted = 0
    for mask, ids, _ in _segments(traj):
        if mask == 1:
            re = tok.encode(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)
            eot = [chat.eot_token_id] if ids and ids[-1] == chat.eot_token_id else []
            drifted += (re + eot) != ids
            expected += re + eot
        else:
            expected += ids
    ours = traj.prompt_ids + traj.response_ids
    # the fresh render ends with the last assistant turn closed (plus its boundary newline, if any)
    assert expected == fresh[: len(expected)]
    assert len(fresh) - len(expected) <= 1
    if drifted == 0:
        assert ours == fresh[: len(ours)]


async def test_expert_chain_solves_a_puzzle_with_scripted_ids(smollm2_policy):
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped
        traj = await run_chain_episode(env, ExpertPolicy(), chat, max_turns=10, seed=2)
        await env.aclose()
    assert traj.success
    assert traj.reward == 1.0
    assert traj.terminated
    for mask, ids, lps in _segments(traj):
        if mask == 1:
            assert ids[-1] == chat.eot_token_id
            assert all(math.isnan(x) for x in lps)
    assert [t.finish_reason for t in traj.turns] == ["action"] * traj.num_turns


@pytest.mark.slow
async def test_runner_chess_and_scienceworld_concurrently_writes_files(tmp_path, smollm2_policy):
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    config = RolloutConfig(env_ids=["Chess-v0", "ScienceWorld"], num_trajectories=4, group_size=2, concurrency=4,
                           max_turns=2, seed=0, sampling=SamplingParams(max_tokens=16),
                           env_kwargs={"ScienceWorld-v0": {"max_instances": 1}}, output_dir=tmp_path)
    result = await run_rollouts(config, smollm2_policy, chat, progress=False)
    trajs = result.trajectories
    assert [t.env_id for t in trajs] == ["agentfly/Chess-v0"] * 2 + ["agentfly/ScienceWorld-v0"] * 2
    assert all(t.error is None for t in trajs), [t.error for t in trajs]
    assert trajs[0].group_id == trajs[1].group_id != trajs[2].group_id == trajs[3].group_id
    assert trajs[0].task_id == trajs[1].task_id
    assert trajs[2].task_id == trajs[3].task_id
    s = result.summary
    assert s["trajectories"] == 4
    assert s["sampled_tokens"] == sum(t.num_sampled_tokens for t in trajs) > 0
    assert s["resources"]["started"] >= 1
    assert set(s["per_env"]) == {"agentfly/Chess-v0", "agentfly/ScienceWorld-v0"}
    # files: parquet + jsonl round-trip exactly, summary.json matches
    table = pq.read_table(result.paths["parquet"])
    assert table.num_rows == 4
    assert table.column("response_ids").to_pylist()[0] == trajs[0].response_ids
    back = load_trajectories(result.paths["jsonl"])
    assert [b.response_ids for b in back] == [t.response_ids for t in trajs]
    assert [b.response_mask for b in back] == [t.response_mask for t in trajs]
    assert json.loads(result.paths["summary"].read_text())["trajectories"] == 4


async def test_step_mode_rows(tmp_path, smollm2_policy):
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m, mode="play", engine_depth=1, max_moves=3).unwrapped
        traj = await run_step_episode(env, RandomPolicy(seed=0), chat, max_turns=4, history=2, seed=0,
                                      trajectory_id="t1", group_id="g1")
        await env.aclose()
    rows = traj.steps
    assert traj.mode == "step"
    assert len(rows) == traj.num_turns == 3
    assert [r.step for r in rows] == [0, 1, 2]
    assert rows[-1].done
    assert all(r.trajectory_id == "t1" and r.group_id == "g1" for r in rows)
    assert all(r.episode_return == traj.reward for r in rows)
    assert rows[0].anchor_obs != rows[1].anchor_obs
    assert "FEN" in rows[1].anchor_obs
    for r in rows:
        assert len(r.response_ids) == len(r.response_mask) == len(r.response_logprobs)
        assert r.response_ids[: sum(r.response_mask)] == chat.action_ids(r.action)
    # each step's prompt is fresh: it shows at most 2 past steps
    text = policy_text = smollm2_policy.tokenizer.decode(rows[2].prompt_ids)
    assert "[Step 1]" in text
    assert "[Step 2]" in text
    assert policy_text.count("Action:") >= 2
    from agentfly_gym.rollout.step import save_step_rows

    paths = save_step_rows([traj], tmp_path)
    assert pq.read_table(paths["steps"]).num_rows == 3


async def test_a_broken_trajectory_is_recorded_and_the_others_finish(smollm2_policy):
    """A JVM that cannot start (a 1 KB heap) breaks the ScienceWorld trajectory at reset; chess goes on."""
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    config = RolloutConfig(env_ids=["Chess-v0", "ScienceWorld-v0"], num_trajectories=2, concurrency=2, max_turns=1,
                           env_kwargs={"ScienceWorld-v0": {"java_heap": "1k"}})
    result = await run_rollouts(config, ExpertPolicy(), chat, progress=False)
    ok, bad = result.trajectories
    assert ok.error is None
    assert ok.num_turns == 1
    assert "ResourceStartError" in bad.error
    assert "did not start" in bad.error
    assert bad.num_turns == 0
    assert result.summary["errors"] == 1


async def test_a_bad_env_setting_fails_before_any_rollout(smollm2_policy):
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    config = RolloutConfig(env_ids=["Chess-v0", "ScienceWorld-v0"], num_trajectories=2,
                           env_kwargs={"ScienceWorld-v0": {"task_name": "no-such-task"}})
    with pytest.raises(ConfigError, match="no-such-task"):
        await run_rollouts(config, ExpertPolicy(), chat, progress=False)


async def test_the_runner_makes_the_manager_the_setting_names(smollm2_policy, monkeypatch):
    """Without ``manager=``, run_rollouts makes the kind AGENTFLY_GYM_MANAGER names (here a bad one is refused
    by name, before any env starts; the Ray kind itself is tested in test_ray_manager.py)."""
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    monkeypatch.setenv("AGENTFLY_GYM_MANAGER", "cluster-of-one")
    with pytest.raises(ConfigError, match="AGENTFLY_GYM_MANAGER='cluster-of-one'"):
        await run_rollouts(RolloutConfig(env_ids=["Chess-v0"], num_trajectories=1), ExpertPolicy(), chat,
                           progress=False)
    monkeypatch.setenv("AGENTFLY_GYM_MANAGER", "local")
    result = await run_rollouts(RolloutConfig(env_ids=["Chess-v0"], num_trajectories=1, max_turns=1), ExpertPolicy(),
                                chat, progress=False)
    assert result.summary["errors"] == 0
    assert result.trajectories[0].num_turns == 1


def test_config_errors_name_the_value():
    with pytest.raises(ConfigError, match="unknown environment"):
        RolloutConfig(env_ids=["Checkers-v0"])
    for kwargs, field in (({"group_size": 0}, "group_size"), ({"mode": "tree"}, "mode"),
                          ({"max_turns": 0}, "max_turns"), ({"history": -1}, "history"),
                          ({"num_trajectories": 3, "group_size": 2}, "num_trajectories")):
        with pytest.raises(ConfigError) as info:
            RolloutConfig(env_ids=["Chess-v0"], **kwargs)
        assert info.value.field == field, kwargs


async def test_cancelled_rollout_releases_its_resources(smollm2_policy):
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m, mode="play", engine_depth=None, engine_movetime=5.0,
                             skill_level=20).unwrapped
        task = asyncio.ensure_future(run_chain_episode(env, RandomPolicy(seed=1), chat, max_turns=5, seed=0))
        await until(lambda: any(p.metrics.in_use for p in m.pools.values()), 60, "the episode to hold its engine")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pool = next(iter(m.pools.values()))
        assert pool.metrics.in_use == 0
        assert env.episode_id is not None
        await env.aclose()


async def test_interrupted_run_saves_finished_trajectories(tmp_path, smollm2_policy, caplog):
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    # four quick puzzle rollouts and one slow game that is still running when the run is cancelled
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=5, concurrency=5, max_turns=3, seed=0,
                           output_dir=tmp_path)
    caplog.set_level(logging.INFO, logger="agentfly_gym.rollout.runner")
    task = asyncio.ensure_future(run_rollouts(config, _SlowLast(ExpertPolicy()), chat, progress=False))
    await until(lambda: sum(" finished: " in r.getMessage() for r in caplog.records) == 4, 120,
                "the four quick rollouts to finish")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    saved = load_trajectories(tmp_path / "trajectories.jsonl")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert len(saved) == 4
    assert summary["trajectories"] == len(saved)
    assert all(t.num_turns >= 1 for t in saved)


@pytest.mark.slow
async def test_interrupt_saves_before_tearing_down_and_marks_an_empty_run(tmp_path, smollm2_policy):
    """The summary is written as soon as the run is cancelled, while the running trajectories are still being
    torn down (a second Ctrl-C then loses nothing), and it is written even when nothing finished; an earlier
    complete run in the folder (asked to be replaced) is kept, the interrupted run going to interrupted/."""
    chat = ChatTokenizer(smollm2_policy.tokenizer)
    earlier = json.dumps({"interrupted": False, "trajectories": 8})
    (tmp_path / "summary.json").write_text(earlier)
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=2, concurrency=2, max_turns=3, seed=0,
                           output_dir=tmp_path, if_exists="replace")
    policy = _SlowToCancel()
    task = asyncio.ensure_future(run_rollouts(config, policy, chat, progress=False))
    await until(lambda: policy.acting == 2, 120, "both rollouts to wait for the policy")
    task.cancel()
    saved = tmp_path / "interrupted" / "summary.json"
    await until(saved.exists, 30, "the interrupted run's summary")
    assert not task.done()  # still tearing down (each trajectory takes 3 s to stop) ...
    summary = json.loads(saved.read_text())
    assert summary["interrupted"] is True
    assert summary["trajectories"] == 0
    assert load_trajectories(tmp_path / "interrupted" / "trajectories.jsonl") == []
    assert (tmp_path / "summary.json").read_text() == earlier  # the complete run was not replaced
    with pytest.raises(asyncio.CancelledError):
        await task


class _SlowToCancel:
    """Never answers, and takes 3 s to stop when cancelled (like a policy closing a remote request)."""

    def __init__(self) -> None:
        self.acting = 0  # requests now waiting for an answer

    async def act(self, observation, info, env):
        self.acting += 1
        try:
            await asyncio.sleep(3600)  # never answers: the test cancels the run
        except asyncio.CancelledError:
            await asyncio.sleep(3.0)  # a slow stop: the tear-down the test observes
            raise


class _SlowLast:
    """The expert, except that trajectory group 4 hangs: it stands for a rollout still running at Ctrl-C."""

    def __init__(self, inner):
        self.inner = inner

    async def act(self, observation, info, env):
        if env.np_random_seed == 4:
            await asyncio.sleep(3600)  # hangs until the test cancels the run
        return await self.inner.act(observation, info, env)
