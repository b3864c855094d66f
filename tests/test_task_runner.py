"""What a training loop needs of the rollout side: a policy on the live weights,
a runner of explicit (env id, task id, seed) rows with one long-lived manager, and run_rollouts defaults that
neither replay the same tasks nor form a short group silently.

Real components: Chess puzzles and ScienceWorld (real Java simulator) episodes, the random policy, a real
(random, tiny) Qwen2 model and a real torch optimizer step.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import agentfly_gym  # noqa: F401
from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout import RandomPolicy, RolloutConfig, SamplingParams, TaskRow, TaskRunner, run_rollouts
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.models import smollm2_dir
from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy


@pytest.fixture(scope="module")
def chat():
    return ChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir()))


async def test_runner_plays_explicit_rows_with_one_manager(chat):
    """Rows are played as given (task ids, seeds, order), concurrently, and a second call reuses the
    manager's simulators; the random policy plays ScienceWorld without any env kwargs (as the CLI does)."""
    rows = [TaskRow("Chess-v0", task_id="tewjc", seed=0, group_id="g0"), ("Chess-v0", "tewjc", 1),
            {"env_id": "ScienceWorld-v0", "seed": 3}]
    async with ResourceManager() as m:
        runner = TaskRunner(RandomPolicy(seed=0), chat, manager=m, max_turns=2, concurrency=3)
        first = await runner.aplay(rows)
        again = await runner.aplay(rows[2:])
        await runner.aclose()
        assert runner.manager is m  # a given manager is left to its owner
        pools = m.metrics()
    assert [t.env_id for t in first] == ["agentfly/Chess-v0"] * 2 + ["agentfly/ScienceWorld-v0"]
    assert [t.task_id for t in first[:2]] == ["tewjc", "tewjc"]
    assert first[0].group_id == "g0"
    assert [t.seed for t in first] == [0, 1, 3]
    assert [t.trajectory_id for t in first + again] == \
        ["task-000000", "task-000001", "task-000002", "task-000003"]
    assert all(t.error is None and t.turns for t in first + again), [t.error for t in first + again]
    assert again[0].task_id == first[2].task_id  # the same seed draws the same ScienceWorld task
    (sim,) = pools.values()  # ScienceWorld's simulator pool (Chess puzzles need no resource)
    assert sim["started"] == 1
    assert sim["reused"] >= 1


def test_runner_from_sync_code(chat):
    """The sync face runs on the library's background loop; the runner's own manager is closed by close()."""
    with TaskRunner(RandomPolicy(seed=1), chat, max_turns=1) as runner:
        trajs = runner.play([("Chess-v0", "tewjc", 0)] * 2)
        assert runner.manager is not None
    assert [t.task_id for t in trajs] == ["tewjc"] * 2
    assert all(t.error is None for t in trajs)
    with pytest.raises(ConfigError, match="task row"):
        TaskRunner(RandomPolicy(), chat).play([42])


async def test_run_rollouts_defaults_a_training_loop_needs(chat):
    with pytest.raises(ConfigError, match="not a multiple of group_size=2"):
        RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, group_size=2)
    RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, group_size=2, allow_partial_group=True)
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=4, max_turns=1, output_dir=None)
    assert config.seed is None
    async with ResourceManager() as m:
        runs = [await run_rollouts(config, RandomPolicy(seed=0), chat, manager=m, progress=False) for _ in range(2)]
        seeds = [r.summary["config"]["seed"] for r in runs]
        assert seeds[0] != seeds[1]
        assert all(isinstance(s, int) for s in seeds)
        assert [t.task_id for t in runs[0].trajectories] != [t.task_id for t in runs[1].trajectories]
        fixed = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=4, max_turns=1, seed=seeds[0])
        replay = await run_rollouts(fixed, RandomPolicy(seed=0), chat, manager=m, progress=False)
    assert [t.task_id for t in replay.trajectories] == [t.task_id for t in runs[0].trajectories]


async def test_policy_on_live_weights_follows_an_optimizer_step(tiny_qwen):
    """``TransformersPolicy.from_model`` samples from the very model object being trained: its log-probs
    equal a plain forward pass of the model, and after one optimizer step the next rollout's log-probs
    are those of the updated weights (no reload, no sync)."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    policy = TransformersPolicy.from_model(model, tok, seed=0)
    prompt = tok("Your move:")["input_ids"]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)

    def forward_logprobs(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()

    try:
        before = await policy.generate(prompt, greedy)
        assert max(abs(a - b) for a, b in zip(before.logprobs, forward_logprobs(list(before.token_ids)))) < 1e-4
        opt = torch.optim.SGD(model.parameters(), lr=5.0)
        logits = model(torch.tensor([prompt + list(before.token_ids)])).logits[0, len(prompt) - 1:-1]
        loss = torch.log_softmax(logits, -1).gather(1, torch.tensor(before.token_ids)[:, None]).mean()
        loss.backward()  # push the sampled tokens' probability down
        opt.step()
        after = await policy.generate(prompt, greedy)
        same_tokens = list(after.token_ids) == list(before.token_ids)
        moved = max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs))
        assert not same_tokens or moved > 1e-3
        assert max(abs(a - b) for a, b in zip(after.logprobs, forward_logprobs(list(after.token_ids)))) < 1e-4
        assert all(math.isfinite(x) for x in after.logprobs)
    finally:
        policy.close()
    with pytest.raises(ConfigError, match="causal LM"):
        TransformersPolicy.from_model("a folder", tok)
