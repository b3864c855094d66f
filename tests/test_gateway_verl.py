"""The verl plugin's gateway agent loop (plugins/verl/agentfly_gym_verl/gateway_loop.py), built as verl's
``AgentLoopWorker`` builds it (``hydra.utils.instantiate`` of the YAML entry ``agentfly_gateway`` with verl's
generated trainer config), running a plain OpenAI-SDK agent through a gateway over verl's server signature.

The one stand-in, as in tests/test_verl_plugin.py: verl's server manager (vLLM/SGLang on GPUs) cannot run here,
so :class:`ModelServer` takes its place with verl's ``generate`` signature and ``TokenOutput``, and the REAL tiny
model behind it; it records what it sampled, so the rows are checked id for id."""

from __future__ import annotations

import pytest
from verltools import trainer_config

try:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput
except ImportError as e:  # pragma: no cover
    pytest.skip(f"verl 0.9.1 cannot be imported ({e})", allow_module_level=True)

from agentfly_gym.errors import ConfigError
from agentfly_gym.rollout.policies.base import SamplingParams


class ModelServer:
    """verl's server manager signature over a real small model (see the module docstring)."""

    def __init__(self, policy) -> None:
        self.policy, self.calls = policy, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        sp = SamplingParams(max_tokens=int(sampling_params["max_tokens"]),
                            temperature=float(sampling_params.get("temperature", 1.0)))
        gen = await self.policy.generate(list(prompt_ids), sp)
        self.calls.append((request_id, list(prompt_ids), list(gen.token_ids), list(gen.logprobs)))
        return TokenOutput(token_ids=list(gen.token_ids), log_probs=list(gen.logprobs), stop_reason="completed")


async def agent(base_url, api_key, task):
    """A plain OpenAI-SDK agent: two calls of one conversation, then a rewritten one (a summary)."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(task["messages"])
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=5)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=5)
        summary = [{"role": "user", "content": "In short: two replies were given. Conclude."}]
        r = await client.chat.completions.create(model="m", messages=summary, max_tokens=5)
    return r.choices[0].message.content


def score(answer, task):
    return 1.0 if task["extra_info"].get("task_id") == "t-1" else 0.5


@pytest.fixture(scope="module")
def server(tiny_qwen):
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=4)
    yield ModelServer(policy)
    policy.close()


def _loop(server, tokenizer, use_v1=True, **overrides):
    cfg = trainer_config(256, 64, use_v1=use_v1)
    entries = {e.name: e for e in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)}
    entry = OmegaConf.merge(entries["agentfly_gateway"], overrides)
    return hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                                   tokenizer=tokenizer, processor=None, hf_model_type="qwen2",
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap([]))


async def test_the_gateway_loop_gives_verl_rows_of_exactly_what_was_sampled(server):
    tokenizer = server.policy.tokenizer
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match="needs agent") as caught:
        _loop(server, tokenizer)  # the YAML's agent is null: it must be named
    assert isinstance(caught.value.__cause__, ConfigError)
    loop = _loop(server, tokenizer, agent="test_gateway_verl:agent", score="test_gateway_verl:score")
    row = {"raw_prompt": [{"role": "user", "content": "Name a colour."}], "extra_info": {"task_id": "t-1"},
           "uid": "group-7", "index": 0}
    outs = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row)
    assert len(outs) == 2  # the first two calls joined in one chain; the summary started a second segment
    calls = [c for c in server.calls if c[0] == outs[0].extra_fields["trajectory_id"].split("/")[0]]
    assert len(calls) == 3
    first, second = outs
    assert first.prompt_ids == calls[0][1]
    assert second.prompt_ids == calls[2][1]
    sampled = [t for t, m in zip(first.response_ids, first.response_mask) if m]
    assert sampled == calls[0][2] + calls[1][2]
    assert [lp for lp, m in zip(first.response_logprobs, first.response_mask) if m] == calls[0][3] + calls[1][3]
    assert (first.prompt_ids + first.response_ids)[:len(calls[1][1])] == calls[1][1]
    assert second.response_ids == calls[2][2]
    assert second.response_logprobs == calls[2][3]
    for out in outs:
        assert out.reward_score == 1.0
        assert out.extra_fields["group_id"] == "group-7"
        assert out.extra_fields["mode"] == "gateway"
        assert out.extra_fields["task_id"] == "t-1"
    # the legacy trainer takes one row: the last segment's
    legacy = _loop(server, tokenizer, use_v1=False, agent="test_gateway_verl:agent")
    out = await legacy.run({"temperature": 1.0, "logprobs": True}, **row)
    assert not isinstance(out, list)
    assert out.reward_score == 0.0
    assert out.response_mask[-1] == 1
