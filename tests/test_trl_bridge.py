"""The TRL bridge (agentfly_gym.bridges.trl): task data sets, the rollout dict TRL reads, and real GRPO steps
through TRL's GRPOTrainer on CPU with the bundled SmolLM2 model on real Chess puzzles."""

from __future__ import annotations

import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import agentfly_gym  # noqa: F401
from agentfly_gym.bridges.trl import (AgentFlyRollout, env_return, env_success, parse_task_prompt, task_dataset,
                                      task_prompt)
from agentfly_gym.errors import ConfigError
from agentfly_gym.rollout import SamplingParams, TaskRow, TaskRunner
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.models import smollm2_dir


def test_task_dataset_round_trips_through_the_prompt():
    ds = task_dataset("Chess", ["tewjc", "HKIFI"], n=3, seed=7)
    assert ds.column_names == ["prompt", "env_id", "task_id", "seed", "split"]
    assert len(ds) == 3
    assert ds["task_id"] == ["tewjc", "HKIFI", "tewjc"]
    assert ds["seed"] == [7, 8, 9]
    rows = [parse_task_prompt(p) for p in ds["prompt"]]
    assert rows[1] == TaskRow("agentfly/Chess-v0", task_id="HKIFI", seed=8)
    assert parse_task_prompt(task_prompt("Chess-v0", seed=3)) == TaskRow("agentfly/Chess-v0", None, 3)
    with pytest.raises(ConfigError, match="not an agentfly-gym task prompt"):
        parse_task_prompt([{"role": "user", "content": "What is 2 + 2?"}])
    with pytest.raises(ConfigError, match="unknown env"):
        task_dataset("Checkers-v0", n=2)
    assert env_return([None] * 2, env_return=[1, 0.5]) == [1.0, 0.5]
    assert env_success([None] * 2, env_success=[True, False]) == [1.0, 0.0]


@pytest.mark.parametrize("prompt, problem", [
    ("agentfly-gym task [1,2]", "a JSON array, not an object"),
    ("agentfly-gym task 7", "a JSON number, not an object"),
    ('agentfly-gym task "Chess-v0"', "a JSON string, not an object"),
    ("agentfly-gym task {not json", "does not parse"),
    ('agentfly-gym task {"task_id": "tewjc", "seed": 0}', "env_id is missing"),
    ('agentfly-gym task {"env_id": 3, "seed": 0}', "env_id is 3, not an env id string"),
    ('agentfly-gym task {"env_id": "Chess-v0", "task_id": ["tewjc"]}', "task_id is a list, not a string"),
    ('agentfly-gym task {"env_id": "Chess-v0", "seed": "0"}', "seed is '0', not an integer or null"),
    ('agentfly-gym task {"env_id": "Chess-v0", "seed": true}', "seed is True, not an integer or null"),
    ('agentfly-gym task {"env_id": "Chess-v0", "env_kwargs": "split=train"}', "env_kwargs is a str, not an object"),
    ('agentfly-gym task {"env_id": "Chess-v0", "seed": -1}', "seed=-1 must be an integer in [0, 2**63)"),
    ('agentfly-gym task {"env_id": "Chess-v0", "seed": 18446744073709551616}', "must be an integer in [0, 2**63)"),
    ("agentfly-gym task " + "[" * 100000, "does not parse"),  # past the JSON decoder's depth: RecursionError
    ([{"role": "user", "content": "agentfly-gym task [1,2]"}], "a JSON array, not an object"),
    (5, "got int: '5'"),
    (["agentfly-gym task {}"], "a list of chat messages"),
])
def test_a_malformed_task_prompt_is_one_config_error_naming_what_was_expected(prompt, problem):
    """A prompt with the task prefix whose JSON is not the object task_prompt() writes (or a prompt that is neither
    text nor chat messages) is a ConfigError that says what it got and what a task prompt is, not an
    AttributeError's text or a TaskRow with a wrong-typed field."""
    with pytest.raises(ConfigError) as e:
        parse_task_prompt(prompt)
    assert problem in str(e.value), str(e.value)
    assert "task_prompt()" in str(e.value) and "object has no attribute" not in str(e.value), str(e.value)


@pytest.mark.parametrize("seed", ["abc", "3", 1.0, True, None, -1, [0]])
def test_task_dataset_refuses_a_seed_that_is_not_an_integer(seed):
    """A seed that is not an integer in [0, 2**63) (a string, a float, a bool, None) is a ConfigError naming the
    argument, before anything is drawn or checked."""
    with pytest.raises(ConfigError, match=r"^seed=.* must be an integer in \[0, 2\*\*63\)"):
        task_dataset("Chess-v0", ["tewjc"], seed=seed, check=False)


def test_task_dataset_refuses_a_seed_range_past_2_63():
    """Row i resets with seed + i: a first seed that passes but a last one past 2**63 - 1 is refused before
    anything is written (it was an OverflowError from pyarrow)."""
    with pytest.raises(ConfigError, match="past 2\\*\\*63 - 1"):
        task_dataset("Chess-v0", n=2, seed=2**63 - 1, check=False)


def test_task_dataset_takes_a_numpy_integer_seed(tmp_path, capsys):
    """A NumPy integer seed (e.g. from a NumPy random draw) works and the rows carry plain ints, whose prompts
    parse; ``agentfly-gym dataset --seed`` refuses a bad seed with exit status 2 and a line naming it."""
    import numpy as np

    ds = task_dataset("Chess-v0", ["tewjc", "HKIFI"], seed=np.int64(4), check=False)
    assert ds["seed"] == [4, 5]
    assert parse_task_prompt(ds["prompt"][1]) == TaskRow("agentfly/Chess-v0", "HKIFI", 5)
    verl_dataset = pytest.importorskip("agentfly_gym_verl.dataset")
    out = str(tmp_path / "d.parquet")
    assert verl_dataset.dataset_main(["Chess", "-o", out, "-n", "2", "--seed", "-1"]) == 2
    assert "seed=-1 must be an integer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        verl_dataset.dataset_main(["Chess", "-o", out, "-n", "2", "--seed", "abc"])
    assert e.value.code == 2
    assert "--seed: invalid int value: 'abc'" in capsys.readouterr().err


def test_task_dataset_checks_listed_task_ids_as_the_cli_does():
    """A listed task id the env does not have is refused here (as ``agentfly-gym dataset`` refuses it, by the same
    code), not at the first training step; ``check=False`` skips the check."""
    with pytest.raises(ConfigError, match=r"agentfly/Chess-v0 rejects task 'nosuchpuzzle'"):
        task_dataset("Chess", ["tewjc", "nosuchpuzzle"])
    assert task_dataset("Chess", ["nosuchpuzzle"], check=False)["task_id"] == ["nosuchpuzzle"]
    with pytest.raises(ConfigError, match="disagree"):
        task_dataset("Chess-v0", ["tewjc"], split="validation", env_kwargs={"split": "train"})


def test_task_dataset_draws_from_a_split_and_leaves_out_another_set():
    """Without a task list the rows draw distinct puzzles of a split (as the verl data sets do), record each task
    id and carry the split to the rollout's env; validation never shares a task with training, and ``exclude``
    keeps a set's tasks out of a draw from the same split."""
    train = task_dataset("Chess-v0", n=12, seed=0)
    val = task_dataset("Chess-v0", n=6, seed=0, split="validation")
    assert set(train["split"]) == {"train"}
    assert set(val["split"]) == {"validation"}
    assert all(train["task_id"])
    assert len(set(train["task_id"])) == 12
    assert not set(train["task_id"]) & set(val["task_id"])
    row = parse_task_prompt(val["prompt"][0])
    assert row.env_kwargs == {"split": "validation"}
    assert row.task_id == val["task_id"][0]
    more = task_dataset("Chess-v0", n=12, seed=1, exclude=train)
    assert not set(more["task_id"]) & set(train["task_id"])
    assert not set(task_dataset("Chess-v0", n=4, seed=0, exclude=train["task_id"][:4])["task_id"]) & set(
        train["task_id"][:4])
    with pytest.raises(ConfigError, match="listed task"):
        task_dataset("Chess-v0", [train["task_id"][0]], exclude=train)
    with pytest.raises(ConfigError, match="not one string"):
        task_dataset("Chess-v0", n=2, exclude="tewjc")
    with pytest.raises(ConfigError, match="not one string"):
        task_dataset("Chess-v0", "tewjc")
    with pytest.raises(ConfigError, match="mapping"):
        task_dataset("Chess-v0", n=2, env_kwargs=[1])
    with pytest.raises(ConfigError, match="seed"):
        task_dataset("Chess-v0", n=2, seed=2**70)
    assert len(task_dataset("Chess-v0", n=2, exclude=None)) == 2
    with pytest.raises(ConfigError, match="takes no constructor argument"):
        task_dataset("Chess-v0", n=2, env_kwargs={"colour": "white"})
    with pytest.raises(ConfigError, match="does not parse"):
        parse_task_prompt('agentfly-gym task {"env_id": "agentfly/Chess-v0", "env_kwargs": [1]}')


def test_a_rows_split_reaches_its_env():
    """A row drawn from the validation split is played by an env of that split, over the runner's own
    ``env_kwargs`` (here ``split="train"``, whose env would refuse a validation puzzle)."""
    from agentfly_gym.rollout.policies.baselines import RandomPolicy

    val = task_dataset("Chess-v0", n=1, seed=3, split="validation")
    row = parse_task_prompt(val["prompt"][0])
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir()))
    with TaskRunner(RandomPolicy(seed=0), chat, max_turns=1, env_kwargs={"Chess-v0": {"split": "train"}}) as runner:
        (traj,) = runner.play([row])
        (refused,) = runner.play([TaskRow(row.env_id, row.task_id, row.seed)])
    assert traj.error is None
    assert traj.task_id == row.task_id
    assert traj.num_turns == 1
    assert refused.error
    assert "not in split='train'" in refused.error


async def test_rollout_dict_is_the_sampled_tokens_and_a_cut_reply_ends_on_it(tiny_qwen):
    """The dict TRL reads holds each chain's ids as sampled (no re-tokenized text: they equal the
    trajectory's), the env mask and the log-probs aligned with them; a completion whose last reply was cut
    ends on a sampled token (TRL's clipped_ratio reads the last token)."""
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, batch_wait_s=0.0)
    chat = ChatTokenizer(policy.tokenizer, chat_template_kwargs={"enable_thinking": False})
    try:
        async with TaskRunner(policy, chat, max_turns=2, sampling=SamplingParams(max_tokens=3)) as runner:
            trajs = await runner.aplay([parse_task_prompt(task_prompt("Chess-v0", "tewjc", 0))] * 2)
    finally:
        policy.close()
    out = AgentFlyRollout.to_trl(trajs, chat)
    for i, t in enumerate(trajs):
        n = len(out["completion_ids"][i])
        assert len(out["logprobs"][i]) == len(out["env_mask"][i]) == n >= 1
        assert out["prompt_ids"][i] == t.prompt_ids
        assert out["completion_ids"][i] == t.response_ids[:n]
        assert t.reply_truncated
        assert out["reply_truncated"][i]
        assert out["env_mask"][i][-1] == 1
        assert out["completion_ids"][i][-1] != chat.eot_token_id
        assert all(lp == 0.0 for lp, m in zip(out["logprobs"][i], out["env_mask"][i]) if not m)
        assert out["task_id"][i] == "tewjc"
        assert out["env_return"][i] == t.reward


def _example():
    """benchmarks/train_grpo.py, the example the README points to (its trainer is the one tested here)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "train_grpo.py"
    spec = importlib.util.spec_from_file_location("train_grpo_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _forward_logprobs(model, prompt_ids, ids):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids) + list(ids)])).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(list(ids))[:, None])[:, 0].tolist()


def sampled_tokens(completions, env_mask=None, completion_ids=None, **kwargs):
    """A TRL reward function of the sampled ids themselves (their sum mod 97, / 100): two samples of one task differ,
    so it varies within a group, unlike the env return here (a length can tie when every reply is cut)."""
    return [(sum(c) % 97) / 100 for c in completion_ids]


@pytest.mark.slow
def test_grpo_steps_through_trl_on_cpu(tmp_path):
    """Two GRPO steps of SmolLM2-135M on Chess puzzles through TRL's GRPOTrainer with rollout_func: the
    rollouts' stored log-probs equal a forward pass of the weights they were sampled with (the policy samples
    from the live model), loss / KL / grad norm are finite, and the policy's log-probs of a fixed completion
    change after training."""
    pytest.importorskip("trl")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import TrainerCallback

    path = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rollout = AgentFlyRollout(max_turns=1, max_tokens=12, seed=0, concurrency=2)
    gaps: list[float] = []
    seen: list[dict] = []

    def checked(prompts, trainer):
        out = rollout(prompts, trainer)
        seen.append(out)
        model.eval()
        for p, c, lp, m in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
            ref = _forward_logprobs(model, p, c)
            gaps.extend(abs(a - b) for a, b, k in zip(lp, ref, m) if k)
        model.train()
        return out

    logs: list[dict] = []

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                kept.append(dict(logs))

    kept = logs
    probe_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Your move?"}], tokenize=True,
                                                 add_generation_prompt=True, return_dict=False)
    probe = tokenizer("e2e4 is my move.")["input_ids"]
    before = _forward_logprobs(model, probe_prompt, probe)
    trainer = _example().build_trainer(model, tokenizer, checked, task_dataset("Chess-v0", n=4, seed=0),
                                       out_dir=tmp_path, steps=2, num_generations=2, learning_rate=1e-4,
                                       callbacks=[Keep()],
                                       # the bundled model never solves a puzzle, so the env return alone gives
                                       # every group zero advantage and no update; a reward on the sampled
                                       # tokens (differing within a group) makes the step move the weights
                                       reward_funcs=[env_return, env_success, sampled_tokens])
    try:
        trainer.train()
    finally:
        rollout.close()
    after = _forward_logprobs(model.eval(), probe_prompt, probe)
    assert len(seen) == 2 and len(logs) == 2, logs
    assert gaps and max(gaps) < 1e-3, max(gaps)  # sampled with the live weights, no re-tokenization
    for entry in logs:
        for key in ("loss", "kl", "grad_norm"):
            assert math.isfinite(float(entry[key])), (key, entry)
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-4
    for out in seen:
        assert all(len(c) == len(m) == len(lp) for c, m, lp in zip(out["completion_ids"], out["env_mask"],
                                                                  out["logprobs"]))


def test_train_grpo_keeps_fp32_master_weights_and_counts_changed_weights(tiny_qwen):
    """The example trains float32 weights (bf16 only as mixed precision on a GPU) and reports the fraction of
    q_proj elements a step changed; the reason, shown on the tiny model: an update of 1e-5 (a learning rate of 1e-5
    times a unit Adam step) moves every float32
    q_proj weight but almost no bfloat16 one (rounding eats it)."""
    mod = _example()
    assert mod._mixed_bf16("cpu") is False
    for dtype, expect in ((torch.float32, lambda f: f > 0.99), (torch.bfloat16, lambda f: f < 0.2)):
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen, dtype=dtype)
        watch = mod.WeightChange(model)
        assert len(watch.params) == model.config.num_hidden_layers  # one q_proj per layer
        watch.begin()
        with torch.no_grad():
            for p in watch.params:
                p.add_(1e-5)
        frac = watch.end()
        assert expect(frac), (dtype, frac)
        assert watch.end() is None  # no snapshot left: nothing to compare
