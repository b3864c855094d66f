"""Agents as rollouts through the gateway (agentfly_gym/gateway/agents.py): two agent frameworks from PyPI running
unchanged (the OpenAI Agents SDK, smolagents), a crashing, a hanging and a looping agent, and the recorded segments
handed to the trainers (the TRL bridge's rows, the verl plugin's ``AgentLoopOutput``).

The frameworks' tool loops run on a scripted policy over the Qwen3 tokenizer (a CPU-sized model does not write
well-formed tool calls; tests/gatewaytools.py); the Agents SDK also runs on the real tiny model."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from gatewaytools import ScriptedPolicy, Spy, add_then_answer, tool_call
from waiting import until

from agentfly_gym.errors import ConfigError
from agentfly_gym.gateway import (
    Gateway,
    run_agent,
    run_agents,
    segment_rows,
    serve_gateway,
)
from agentfly_gym.rollout.chat import ChatTokenizer

pytest.importorskip("agents", reason="pip install openai-agents")
pytest.importorskip("smolagents", reason="pip install smolagents")


@pytest.fixture(scope="module")
def qwen_chat(test_data):
    from transformers import AutoTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


async def openai_agents_adder(base_url, api_key, task, max_tokens=None):
    """An agent written with the OpenAI Agents SDK, as its users write one (one tool, a chat-completions model)."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # nothing leaves the machine

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        model = OpenAIChatCompletionsModel(model="agentfly-policy", openai_client=client)
        agent = Agent(name="adder", instructions="Use the add tool, then answer.", model=model, tools=[add],
                      model_settings=ModelSettings(max_tokens=max_tokens))
        result = await Runner.run(agent, task["prompt"], max_turns=4)
    return result.final_output


def smolagents_adder(base_url, api_key, task):
    """An agent written with smolagents (a plain function: smolagents is synchronous)."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    model = OpenAIServerModel(model_id="agentfly-policy", api_base=base_url, api_key=api_key,
                              client_kwargs={"max_retries": 0})
    return ToolCallingAgent(tools=[add], model=model, max_steps=3, verbosity_level=0).run(task["prompt"])


def sampled(seg):
    return [t for t, m in zip(seg.response_ids, seg.response_mask) if m]


def check_exact(seg, calls):
    """Each sampled run of ``seg`` is the reply of a policy call whose prompt is exactly the segment's ids before
    it, with the same logprobs."""
    ids, start = seg.ids(), len(seg.prompt_ids)
    mask = [0] * start + seg.response_mask
    lps = [0.0] * start + seg.logprobs
    k = start
    while k < len(ids):
        if not mask[k]:
            k += 1
            continue
        end = k
        while end < len(ids) and mask[end]:
            end += 1
        assert (ids[:k], ids[k:end], lps[k:end]) in [(p, g, lp) for p, g, lp in calls]
        k = end


def exact_score(answer, task):
    return float(str(task["answer"]) in str(answer))


async def test_openai_agents_sdk_runs_unchanged_and_its_turns_form_one_chain(qwen_chat):
    policy = ScriptedPolicy(qwen_chat, add_then_answer(lambda r: f"The answer is {r}."))
    gw = Gateway(policy, qwen_chat)
    async with serve_gateway(gw) as url:
        r = await run_agent(gw, openai_agents_adder, {"task_id": "t1", "prompt": "What is 2+3?", "answer": 5},
                            base_url=url, timeout_s=120, score=exact_score)
    assert (r.status, r.error, r.answer, r.reward, r.task_id) == ("complete", None, "The answer is 5.", 1.0, "t1")
    assert r.num_calls == 2
    assert len(r.segments) == 1
    assert r.num_rewritten == 0
    (seg,) = r.segments
    assert seg.prompt_ids == policy.calls[0][0]
    assert sampled(seg) == policy.calls[0][1] + policy.calls[1][1]
    assert seg.ids()[:len(policy.calls[1][0])] == policy.calls[1][0]
    text = qwen_chat.tokenizer.decode([t for t, m in zip(seg.response_ids, seg.response_mask) if not m])
    assert "<tool_response>\n5\n</tool_response>" in text  # the tool's result, masked 0


async def test_smolagents_runs_unchanged_and_its_rewritten_history_starts_segments(qwen_chat):
    """smolagents writes each tool call back as its own text ("Calling tools: ...") and the result as a user
    message: the history the policy sees differs from what it sampled, so each step is a new segment."""
    policy = ScriptedPolicy(qwen_chat, add_then_answer(lambda r: tool_call("final_answer", {"answer": r})))
    gw = Gateway(policy, qwen_chat)
    async with serve_gateway(gw) as url:
        r = await run_agent(gw, smolagents_adder, {"prompt": "What is 2+3?", "answer": 5}, base_url=url,
                            timeout_s=120, score=exact_score)
    assert (r.status, r.error, str(r.answer), r.reward) == ("complete", None, "5", 1.0)
    assert r.num_calls == 2
    assert len(r.segments) == 2
    assert r.num_rewritten == 1
    for seg, (prompt, ids, lps) in zip(r.segments, policy.calls):
        assert seg.prompt_ids == prompt
        assert seg.response_ids == ids
        assert seg.logprobs == lps


async def test_a_reply_sampled_after_the_rollout_ended_leaves_its_segments_alone(qwen_chat):
    """An agent timed out while its call was sampling: the rollout is returned at once, and the late reply is
    neither recorded into the segments the rollout took nor answered to the agent."""
    policy = ScriptedPolicy(qwen_chat, lambda prompt: "late")
    gw = Gateway(policy, qwen_chat)
    answered = []

    async def two_calls(base_url, api_key, task):
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as c:
            msgs = [{"role": "user", "content": "hi"}]
            r = await c.chat.completions.create(model="m", messages=msgs)
            policy.release = asyncio.Event()  # the second call hangs in the policy
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
            try:
                await c.chat.completions.create(model="m", messages=msgs)
            except asyncio.CancelledError:
                raise
            answered.append(True)

    async with serve_gateway(gw) as url:
        r = await run_agent(gw, two_calls, {}, base_url=url, timeout_s=10)
        assert r.status == "error"
        assert "time limit" in r.error
        assert r.num_calls == 1
        before = [list(s.response_ids) for s in r.segments]
        policy.release.set()
        await until(lambda: len(policy.calls) == 2, what="the late reply to be sampled")
        await asyncio.sleep(0)  # let the handler finish its step
    assert [list(s.response_ids) for s in r.segments] == before
    assert not answered


@pytest.mark.slow  # loads the tiny model (~30 s on a loaded 2-core machine); test_gateway.py covers it fast
async def test_the_agents_sdk_on_the_real_tiny_model_records_what_it_sampled(tiny_qwen):
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=4)
    try:
        spy = Spy(policy)
        gw = Gateway(spy, ChatTokenizer(policy.tokenizer), max_tokens=16)
        async with serve_gateway(gw) as url:
            rs = await run_agents(gw, openai_agents_adder, [{"prompt": "What is 2+3?", "answer": 5}], base_url=url,
                                  group_size=2, timeout_s=120, resources={"max_tokens": 12})
    finally:
        await policy.aclose()
    assert len(rs) == 2
    assert rs[0].group_id == rs[1].group_id
    assert rs[0].trajectory_id != rs[1].trajectory_id
    for r in rs:
        assert r.status in ("complete", "error")
        assert r.num_calls >= 1
        assert sum(len(sampled(seg)) for seg in r.segments) > 0
        for seg in r.segments:
            check_exact(seg, spy.calls)
    assert sum(r.num_calls for r in rs) == len(spy.calls)


async def test_a_crashing_a_hanging_and_a_looping_agent_are_error_rollouts(qwen_chat):
    policy = ScriptedPolicy(qwen_chat, lambda prompt: "ok")
    gw = Gateway(policy, qwen_chat)
    stuck = threading.Event()

    async def crashes(base_url, api_key, task):
        raise RuntimeError("the harness broke")

    async def hangs(base_url, api_key, task):
        await asyncio.Event().wait()

    def hangs_in_a_thread(base_url, api_key, task):
        stuck.wait(60)

    async def loops(base_url, api_key, task):
        from openai import AsyncOpenAI

        c = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        while True:
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])

    opened = []
    open_session = gw.open_session
    gw.open_session = lambda **kw: opened.append(open_session(**kw)) or opened[-1]  # keep each session to check
    async with serve_gateway(gw) as url:
        try:
            crashed, hung, hung_thread, looped = await asyncio.gather(
                run_agent(gw, crashes, {}, base_url=url, timeout_s=60),
                run_agent(gw, hangs, {}, base_url=url, timeout_s=0.5),
                run_agent(gw, hangs_in_a_thread, {}, base_url=url, timeout_s=0.5),
                run_agent(gw, loops, {}, base_url=url, timeout_s=60, max_turns=3, score=exact_score))
        finally:
            stuck.set()
    assert crashed.status == "error"
    assert "RuntimeError: the harness broke" in crashed.error
    assert hung.status == hung_thread.status == "error"
    assert "time limit" in hung.error
    assert "time limit" in hung_thread.error
    assert looped.status == "truncated"
    assert "turn limit" in looped.error
    assert looped.num_calls == 3
    assert looped.reward == 0.0
    assert looped.reward_error is None
    assert len(opened) == 4
    assert all(s.closed for s in opened)
    assert gw.sessions == {}  # and the gateway forgot them
    with pytest.raises(ConfigError):
        await run_agent(gw, crashes, {}, base_url="http://127.0.0.1:1", timeout_s=0)


async def test_segments_are_trainer_rows_for_trl_and_verl(qwen_chat):
    policy = ScriptedPolicy(qwen_chat, add_then_answer(lambda r: tool_call("final_answer", {"answer": r})))
    gw = Gateway(policy, qwen_chat)
    async with serve_gateway(gw) as url:
        smol = await run_agent(gw, smolagents_adder, {"prompt": "What is 2+3?", "answer": 5}, base_url=url,
                               timeout_s=120, score=exact_score)
        policy.script = add_then_answer(lambda r: f"The answer is {r}.")
        oa = await run_agent(gw, openai_agents_adder, {"prompt": "What is 2+3?", "answer": 5}, base_url=url,
                             timeout_s=120, score=exact_score)

        async def fails(base_url, api_key, task):
            raise ValueError("no")

        failed = await run_agent(gw, fails, {}, base_url=url)
    rows = segment_rows([smol, oa, failed])
    assert [r.trajectory_id.count("/") for r in rows] == [1, 1, 0, 0]
    assert all(r.mode == "chain" for r in rows)
    with pytest.raises(ConfigError, match="2 segments"):
        segment_rows([smol], join="chain")
    (chain,) = segment_rows([json.loads(json.dumps(oa.to_json()))], join="chain")  # the JSON form reads the same
    assert chain.response_ids == oa.segments[0].response_ids
    assert chain.response_mask == oa.segments[0].response_mask

    from agentfly_gym.bridges.trl import AgentFlyRollout

    trl = AgentFlyRollout.to_trl(rows, qwen_chat)
    assert trl["completion_ids"][2] == oa.segments[0].response_ids
    assert trl["env_mask"][2] == oa.segments[0].response_mask
    assert trl["logprobs"][2] == oa.segments[0].logprobs
    assert trl["env_return"] == [1.0, 1.0, 1.0, 0.0]
    assert trl["env_mask"][3] == [0]
    assert trl["env_error"][3].startswith("ValueError")

    pytest.importorskip("verl")
    from agentfly_gym_verl import gateway_outputs

    outs = gateway_outputs([smol, oa, failed], eot_token_id=qwen_chat.eot_token_id, response_length=4096,
                           prompt_length=4096)
    assert len(outs) == 4
    assert [o.reward_score for o in outs] == [1.0, 1.0, 1.0, 0.0]
    seg = oa.segments[0]
    assert outs[2].prompt_ids == seg.prompt_ids
    assert outs[2].response_ids == seg.response_ids
    assert outs[2].response_logprobs == seg.logprobs
    assert outs[2].extra_fields["mode"] == "gateway"
    assert outs[3].response_mask == [0]
    assert outs[3].extra_fields["error"].startswith("ValueError")
    short = gateway_outputs([oa], eot_token_id=qwen_chat.eot_token_id, response_length=5, prompt_length=8)[0]
    assert len(short.response_ids) <= 5
    assert short.response_mask[-1] == 1
    assert len(short.prompt_ids) == 8
    assert short.extra_fields["status"] == "token_budget"
    assert short.extra_fields["prompt_truncated"]


def test_trls_rollout_func_runs_the_agent_per_prompt(qwen_chat):
    """GatewayRollout as TRL calls it (``rollout_func(prompts, trainer)``), with a stand-in for the trainer object
    (only what the bridge reads: its model, unwrapped, its tokenizer and sampling arguments) and the scripted
    policy given as ``policy=``; ``test_trl_grpo_step_through_the_gateway`` runs TRL's own GRPOTrainer."""
    from types import SimpleNamespace

    from agentfly_gym.bridges.trl_gateway import GatewayRollout

    policy = ScriptedPolicy(qwen_chat, add_then_answer(lambda r: f"The answer is {r}."))
    rollout = GatewayRollout(openai_agents_adder, score=lambda answer, task: float("5" in str(answer)),
                             policy=policy, timeout_s=120)
    trainer = SimpleNamespace(model=None, accelerator=SimpleNamespace(unwrap_model=lambda m: m),
                              processing_class=qwen_chat.tokenizer, args=SimpleNamespace(temperature=1.0, top_p=1.0))
    prompts = [[{"role": "user", "content": "What is 2+3?"}]] * 2
    out = rollout(prompts, trainer)
    assert out["env_return"] == [1.0, 1.0]
    assert out["gateway_segments"] == [1, 1]
    for i, r in enumerate(rollout.last_rollouts):
        (seg,) = r.segments
        assert out["prompt_ids"][i] == seg.prompt_ids
        assert out["completion_ids"][i] == seg.response_ids
        assert out["env_mask"][i] == seg.response_mask
        assert out["logprobs"][i] == seg.logprobs
    rollout.close()


async def two_turn_agent(base_url, api_key, task):
    """A plain OpenAI-SDK agent: answers, is asked to check, answers again (one chain of two calls)."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(task["messages"])
        for follow_up in ("Check it.", None):
            r = await client.chat.completions.create(model="agentfly-policy", messages=messages, max_tokens=6)
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
    return messages[-1]["content"]


@pytest.mark.slow  # TRL's GRPOTrainer: imports, one step on the tiny model (~1-2 min on a loaded 2-core machine)
def test_trl_grpo_step_through_the_gateway(tiny_qwen, tmp_path):
    """One GRPO step of TRL's own GRPOTrainer whose rollout_func runs an OpenAI-SDK agent through the gateway on
    the live weights: the completions' log-probs equal a forward pass of those weights at the sampled (mask 1)
    ids, the loss is finite."""
    import importlib.util
    import math
    import os
    from pathlib import Path

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pytest.importorskip("trl")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import TrainerCallback

    from agentfly_gym.bridges.trl import env_return
    from agentfly_gym.bridges.trl_gateway import GatewayRollout

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "train_grpo.py"
    spec = importlib.util.spec_from_file_location("train_grpo_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen, dtype=torch.float32)
    rollout = GatewayRollout(two_turn_agent, score=lambda answer, task: len(str(answer)) % 7 / 7, max_tokens=6,
                             seed=0, concurrency=2, timeout_s=300)
    seen, gaps, logs = [], [], []

    def checked(prompts, trainer):
        out = rollout(prompts, trainer)
        seen.append(out)
        model.eval()
        with torch.no_grad():
            for p, c, lp, m in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
                logits = model(torch.tensor([p + c])).logits[0, len(p) - 1:-1].float()
                ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0].tolist()
                gaps.extend(abs(a - b) for a, b, k in zip(lp, ref, m) if k)
        model.train()
        return out

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, logs_=None, **kw):
            if kw.get("logs") and "loss" in kw["logs"]:
                logs.append(dict(kw["logs"]))

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 2+3?"}]}] * 2)
    trainer = example.build_trainer(model, tokenizer, checked, data, out_dir=tmp_path, steps=1, num_generations=2,
                                    learning_rate=1e-4, callbacks=[Keep()], reward_funcs=[env_return])
    try:
        trainer.train()
    finally:
        rollout.close()
    assert len(seen) == 1
    assert seen[0]["gateway_segments"] == [1, 1]
    assert [r.num_calls for r in rollout.last_rollouts] == [2, 2]  # both calls' sampled ids in one chain
    assert gaps and max(gaps) < 1e-3, max(gaps)
    assert logs
    assert all(math.isfinite(float(e["loss"])) for e in logs)
