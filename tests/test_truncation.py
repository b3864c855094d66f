"""Truncation made visible: a reply cut at ``max_tokens`` is recorded per trajectory and per step
row, the trainer-facing record can end on the last sampled token, and ``max_context_tokens`` is a hard cap.

Real components: Chess puzzles in process, a real (random, tiny) Qwen2 model through TransformersPolicy for
the cut replies, the puzzle's own solution (ExpertPolicy) for the token budget, the Qwen3 chat template.
"""

from __future__ import annotations

import gymnasium
import pytest
from transformers import AutoTokenizer

import agentfly_gym  # noqa: F401
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout import ExpertPolicy, SamplingParams, load_trajectories, run_chain_episode, save_trajectories
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.step import load_step_rows, run_step_episode, save_step_rows

PUZZLE = "tewjc"  # a puzzle of several moves: the chain goes on after the first


@pytest.fixture(scope="module")
def chat(test_data):
    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


@pytest.fixture(scope="module")
def tiny_policy(tiny_qwen):
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, batch_wait_s=0.0)
    yield policy
    policy.close()


async def test_a_reply_cut_at_max_tokens_is_recorded_and_can_end_the_record(tmp_path, tiny_policy):
    """Three-token replies of a random model are cut ("length"): the trajectory and every step row say so,
    the chain still closes the reply (mask 0), and ``trainer_response()`` ends on the last sampled token so a
    trainer that tells a cut completion by its last token (TRL's clipped_ratio) sees it."""
    chat = ChatTokenizer(tiny_policy.tokenizer, chat_template_kwargs={"enable_thinking": False})
    sampling = SamplingParams(max_tokens=3, temperature=1.0, seed=1)
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped
        chain = await run_chain_episode(env, tiny_policy, chat, sampling=sampling, max_turns=2,
                                        options={"task_id": PUZZLE})
        step = await run_step_episode(env, tiny_policy, chat, sampling=sampling, max_turns=2,
                                      options={"task_id": PUZZLE})
        await env.aclose()
    assert chain.turns
    assert all(t.finish_reason == "length" for t in chain.turns)
    assert chain.reply_truncated
    assert chain.response_mask[-1] == 0
    ids, mask, lps = chain.trainer_response()
    assert mask[-1] == 1
    assert len(ids) == len(mask) == len(lps) == len(chain.response_ids) - 1
    assert ids == chain.response_ids[:-1]
    assert chain.trainer_response(end_on_sampled=False)[0] == chain.response_ids
    assert step.reply_truncated
    assert all(r.reply_truncated for r in step.steps)
    back = load_trajectories(save_trajectories([chain], tmp_path)["parquet"])[0]
    assert back.reply_truncated
    assert back.trainer_response() == (ids, mask, [pytest.approx(x) for x in lps])
    assert all(r["reply_truncated"] for r in load_step_rows(save_step_rows([step], tmp_path)["steps"]))


async def test_a_reply_that_stops_is_not_marked_cut(chat):
    """The expert's replies end with the end-of-turn token ("action"): nothing is marked, nothing dropped."""
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped
        traj = await run_chain_episode(env, ExpertPolicy(), chat, options={"task_id": PUZZLE})
        await env.aclose()
    assert not traj.reply_truncated
    assert traj.trainer_response()[0] == traj.response_ids


async def test_max_context_tokens_is_a_hard_cap(chat):
    """The chain's budget leaves room for the first reply and half of the next observation: the observation
    is cut at the cap (never past it), the cut is counted, and the episode stops on the token budget.  The
    old code appended the whole observation after its budget check."""
    async with ResourceManager() as m:
        env = gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped
        full = await run_chain_episode(env, ExpertPolicy(), chat, options={"task_id": PUZZLE}, max_turns=2)
        p = len(full.prompt_ids)
        reply = full.response_mask.index(0)  # the first reply's ids (mask 1), then its observation (mask 0)
        obs = full.response_mask[reply:].index(1)
        cap = p + reply + obs // 2
        cut = await run_chain_episode(env, ExpertPolicy(), chat, options={"task_id": PUZZLE}, max_turns=2,
                                      sampling=SamplingParams(max_tokens=reply), max_context_tokens=cap)
        await env.aclose()
    assert obs > 4
    assert len(full.turns) == 2
    assert len(cut.prompt_ids) + len(cut.response_ids) == cap
    assert cut.context_cut == obs - obs // 2
    assert cut.status == "token_budget"
    assert len(cut.turns) == 1
    assert cut.response_ids == full.response_ids[:cap - p]  # what is kept is exactly the uncut chain's start
