"""The verl plugin (plugins/verl/agentfly_gym_verl) against verl 0.9.1's real classes.

The agent loop is built exactly as verl's ``AgentLoopWorker`` builds it (``hydra.utils.instantiate``
of an entry of the plugin's YAML, with verl's ``DictConfigWrap``/``ToolListWrap``, verl's generated
trainer config and verl's ``RLHFDataset`` reading a data set written by ``build_dataset``), and runs
on real environments (Chess puzzles, Chess games against a real Stockfish, ScienceWorld's JVM).

The one stand-in: verl's server manager (``LLMServerClient`` over vLLM/SGLang servers on GPUs)
cannot run here, so :class:`ModelServer` takes its place: the same ``generate(request_id, *,
prompt_ids, sampling_params, **kw)`` signature, verl's own ``TokenOutput`` as the result, and a
REAL small model behind it (the project's ``TransformersPolicy`` on a tiny Qwen2 with the Qwen3
tokenizer, sampling on CPU).  It records what it sampled so the outputs are checked exactly.
:class:`ScriptedServer` (used once, to get a solved puzzle and a non-zero reward) returns the
tokens of a fixed reply instead of sampling.
"""

from __future__ import annotations

import asyncio
import math
import os

import gymnasium
import pytest
from proctools import live_processes, wait_gone
from verltools import trainer_config

try:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.workers.rollout.replica import TokenOutput
except ImportError as e:  # pragma: no cover
    pytest.skip(f"verl 0.9.1 cannot be imported ({e}); install it with "
                "pip install 'verl[verl-core]==0.9.1' 'torch==2.13.0'", allow_module_level=True)

import agentfly_gym  # noqa: F401,E402
import agentfly_gym_verl  # noqa: F401,E402  (the plugin, as a trainer imports it)
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.policies.base import SamplingParams
from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy
from agentfly_gym_verl.agent_loop import EXTRA_FIELD_DEFAULTS
from agentfly_gym_verl.dataset import build_dataset, dataset_main
from agentfly_gym_verl.runtime import aclose, get_manager

PUZZLE = "tewjc"          # setup e5e3, solution f6a1 (mate), from the Lichess puzzles in tests/data
SW_TASK = "find-non-living-thing:0"
PROMPT_LEN, RESPONSE_LEN = 1024, 200


# ---------------------------------------------------------------------- helpers

class ModelServer:
    """Stands in for verl's GPU server manager (``LLMServerClient.generate``): a real small model
    on CPU behind verl's signature, returning verl's ``TokenOutput``; records every call."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self.policy = policy
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        sp = SamplingParams(max_tokens=int(sampling_params["max_tokens"]),
                            temperature=float(sampling_params.get("temperature", 1.0)),
                            top_p=float(sampling_params.get("top_p", 1.0)),
                            top_k=max(0, int(sampling_params.get("top_k", -1))))
        gen = await self.policy.generate(list(prompt_ids), sp)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "token_ids": list(gen.token_ids),
                           "log_probs": list(gen.logprobs), "max_tokens": sp.max_tokens, "kwargs": kwargs})
        return TokenOutput(token_ids=list(gen.token_ids),
                           log_probs=list(gen.logprobs) if sampling_params.get("logprobs") else None,
                           stop_reason="completed", num_preempted=0)

    def of(self, request_id: str) -> list[dict]:
        return [c for c in self.calls if c["request_id"] == request_id]


class ScriptedServer(ModelServer):
    """A server that replies with the tokens of ``replies[k]`` + ``<|im_end|>`` at the k-th request of a
    trajectory (logprob -0.25 each) instead of sampling."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = [tokenizer.encode(r, add_special_tokens=False) + [eot] for r in replies]
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        ids = self.replies[len(self.of(request_id)) % len(self.replies)][: int(sampling_params["max_tokens"])]
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "token_ids": ids,
                           "log_probs": [-0.25] * len(ids), "max_tokens": sampling_params["max_tokens"], "kwargs": kwargs})
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


def _children(names: tuple[str, ...]) -> list[int]:
    """Live (non-zombie) child processes of this process whose name or command line has one of ``names``."""
    return sorted(live_processes(names, children_of=os.getpid()))


@pytest.fixture(scope="module")
def policy(tiny_qwen):
    p = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=4, batch_wait_s=0.02)
    yield p
    p.close()


def _trainer_config(response_length: int = RESPONSE_LEN, use_v1: bool = True):
    return trainer_config(PROMPT_LEN, response_length, use_v1=use_v1)


def _make_loop(name: str, server, tokenizer, cfg, **overrides):
    entries = {e.name: e for e in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)}
    entry = OmegaConf.merge(entries[name], overrides)
    return hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                                   tokenizer=tokenizer, processor=None, hf_model_type="qwen2",
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap([]))


def _rows(tmp_path, tokenizer, cfg, env_id, tasks, **kw) -> list[dict]:
    """Dataset rows as verl's RLHFDataset yields them (the data set written by build_dataset)."""
    path = build_dataset(env_id, tasks, None, tmp_path / f"{env_id.replace('/', '_')}-{kw.get('mode', 'chain')}.parquet",
                         **kw)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=cfg.data, processor=None)
    rows = [dict(ds[i]) for i in range(len(ds))]
    for i, r in enumerate(rows):
        r["uid"] = f"uid-{i}"
        r.pop("dummy_tensor", None)
    return rows


def _sampling(cfg) -> dict:
    r = cfg.actor_rollout_ref.rollout
    return dict(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, repetition_penalty=1.0,
                logprobs=r.calculate_log_probs)


async def _replay(env_id: str, env_kwargs: dict, seed, options, replies: list[list[int]], tokenizer):
    """Play the same episode again on a fresh env with the replies the server sampled.

    Returns (first observation, observations after each step, total reward, steps played, whether
    the env ended the episode)."""
    env = gymnasium.make(env_id, manager=get_manager(), **env_kwargs).unwrapped
    try:
        obs0, _ = await env.areset(seed=seed, options=options)
        observations, total, steps, done = [], 0.0, 0, False
        for ids in replies:
            action = env.agent_prompt.parse_action(tokenizer.decode(ids, skip_special_tokens=True))
            obs, r, term, trunc, _ = await env.astep(action)
            observations.append(obs)
            total += r
            steps += 1
            if term or trunc:
                done = True
                break
        return obs0, observations, total, steps, done
    finally:
        await env.aclose()


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs (start, end, value) of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def _check_schema(out: AgentLoopOutput, prompt_length: int = PROMPT_LEN) -> None:
    assert set(out.extra_fields) == set(EXTRA_FIELD_DEFAULTS)
    for k, v in EXTRA_FIELD_DEFAULTS.items():
        if v is not None:
            assert isinstance(out.extra_fields[k], type(v)), (k, out.extra_fields[k])
    n = len(out.response_ids)
    assert n >= 1
    assert len(out.response_mask) == n
    assert len(out.response_logprobs) == n
    assert len(out.prompt_ids) <= prompt_length
    # verl puts the reward on the last token: it must be a sampled one (or nothing was sampled at all)
    assert out.response_mask[-1] == 1 or set(out.response_mask) == {0}
    assert isinstance(out.extra_fields["min_global_steps"], int | None)
    # what verl's V1 trainer does with the output (agent_loop_tq._agent_loop_postprocess) works on it
    field = out.as_dict()
    assert field["prompts"].shape[0] == len(out.prompt_ids)
    assert field["rm_scores"][-1] == out.reward_score
    list_of_dict_to_tensordict([field, dict(field)])


async def _check_chain(out: AgentLoopOutput, server: ModelServer, tokenizer, env_id, env_kwargs, seed, options,
                       max_turns: int, response_length: int = RESPONSE_LEN):
    """Exact checks of one chain-mode output against what the model sampled and a replay of the env."""
    _check_schema(out)
    ef = out.extra_fields
    calls = server.of(ef["trajectory_id"])
    assert calls, "one request_id per trajectory"
    assert not ef["error"], ef["error"]
    chat = ChatTokenizer(tokenizer)
    replies = [c["token_ids"] for c in calls]
    obs0, observations, total, steps, done = await _replay(env_id, env_kwargs, seed, options, replies, tokenizer)
    # prompt = the rendered first prompt, which is what the server got first
    prompt = type(gymnasium.make(env_id, **env_kwargs).unwrapped).agent_prompt
    first = [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.first_message(obs0)}]
    assert out.prompt_ids == tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)
    assert calls[0]["prompt_ids"] == out.prompt_ids
    # every later call saw exactly prompt + response so far
    full = out.prompt_ids + out.response_ids
    runs = [r for r in _runs(out.response_mask)]
    ones = [r for r in runs if r[2] == 1]
    assert len(ones) == len(calls) or (ef["response_truncated"] and len(ones) <= len(calls))
    expected_ids, expected_mask, expected_lp = [], [], []
    for k, c in enumerate(calls):
        if k > 0:
            assert c["prompt_ids"] == (out.prompt_ids + expected_ids)[: len(c["prompt_ids"])] or ef["response_truncated"]
        expected_ids += c["token_ids"]
        expected_mask += [1] * len(c["token_ids"])
        expected_lp += c["log_probs"]
        if k < len(calls) - 1 or not (done or len(calls) == max_turns):   # the chain went on: next observation
            env_ids = chat.close_assistant_ids(c["token_ids"]) + chat.append_ids(
                [{"role": "user", "content": prompt.turn_message(observations[k])}])
        else:
            env_ids = chat.close_assistant_ids(c["token_ids"])
        expected_ids += env_ids
        expected_mask += [0] * len(env_ids)
        expected_lp += [0.0] * len(env_ids)
    assert ef["response_truncated"] == (len(expected_ids) > response_length)
    # cut to response_length, then the trailing ids the policy did not sample are dropped
    n = min(len(expected_ids), response_length)
    while n and expected_mask[n - 1] == 0:
        n -= 1
    assert len(out.response_ids) == n
    assert n > 0
    assert out.response_ids == expected_ids[:n]          # sampled ids verbatim, env/template ids exact
    assert out.response_mask == expected_mask[:n]
    assert all(math.isclose(a, b, rel_tol=0, abs_tol=1e-6) for a, b in zip(out.response_logprobs, expected_lp[:n]))
    assert full[: len(out.prompt_ids)] == out.prompt_ids
    # reward = the env's return for these actions
    assert steps == ef["num_steps"] == len(calls)
    assert math.isclose(out.reward_score, total)
    assert math.isclose(ef["env_return"], total)
    assert out.metrics.generate_sequences > 0


async def _check_steps(outs: list[AgentLoopOutput], server: ModelServer, tokenizer, env_id, env_kwargs, seed,
                       options, prompt_length: int = PROMPT_LEN):
    assert isinstance(outs, list)
    assert outs
    for o in outs:
        _check_schema(o, prompt_length)
    ef0 = outs[0].extra_fields
    assert not ef0["error"], ef0["error"]
    calls = server.of(ef0["trajectory_id"])
    assert len(calls) == len(outs) == ef0["num_steps"]
    obs0, observations, total, steps, _ = await _replay(env_id, env_kwargs, seed, options,
                                                     [c["token_ids"] for c in calls], tokenizer)
    assert steps == len(outs)
    chat = ChatTokenizer(tokenizer)
    anchors = [obs0] + observations[:-1]
    for i, (o, c) in enumerate(zip(outs, calls)):
        ef = o.extra_fields
        assert ef["step"] == i
        assert ef["trajectory_id"] == ef0["trajectory_id"]
        assert ef["group_id"] == ef0["group_id"]
        assert ef["anchor_obs"] == anchors[i]
        assert o.prompt_ids == c["prompt_ids"]                       # the fresh prompt the server saw
        if c["token_ids"]:                                           # sampled ids verbatim, nothing after them
            assert o.response_ids == c["token_ids"]
            assert o.response_mask == [1] * len(c["token_ids"])
            assert o.response_logprobs == pytest.approx(c["log_probs"], abs=1e-6)
        else:                                                        # nothing sampled: verl's one mask-0 token
            assert o.response_ids == [chat.eot_token_id]
            assert o.response_mask == [0]
        assert math.isclose(o.reward_score, total)
    assert math.isclose(sum(o.extra_fields["step_reward"] for o in outs), total)


@pytest.fixture
async def clean_runtime():
    """Closes the plugin's per-worker manager after the test and checks that no engine/JVM the test started outlives it
    (one an earlier test module left behind is not this plugin's: counted apart)."""
    before = set(_children(("stockfish", "scienceworld.jar")))
    yield
    await aclose()
    assert not wait_gone([p for p in _children(("stockfish", "scienceworld.jar")) if p not in before], 20)


# ---------------------------------------------------------------------- tests

@pytest.mark.slow
def test_dataset_builder_and_cli(tmp_path, tiny_qwen):
    """build_dataset writes what verl's RLHFDataset reads; the CLI entry writes the same and rejects bad input."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    cfg = _trainer_config()
    rows = _rows(tmp_path, tok, cfg, "Chess", [PUZZLE, "abc"], mode="step", max_turns=3, env_kwargs={"mode": "puzzle"},
                 check=False)  # a bad task id on purpose: the loop must turn it into an error row
    assert [r["extra_info"]["task_id"] for r in rows] == [PUZZLE, "abc"]
    r = rows[1]
    assert r["agent_name"] == "agentfly_step"
    assert r["data_source"] == "agentfly/Chess-v0"
    assert r["index"] == 1
    assert r["extra_info"]["max_turns"] == 3
    assert r["extra_info"]["mode"] == "step"
    assert r["raw_prompt"][0]["role"] == "system"
    assert "chess" in r["raw_prompt"][0]["content"].lower()
    out = tmp_path / "cli.parquet"
    assert dataset_main(["ScienceWorld", "-o", str(out), "-n", "3", "--split", "dev", "--seed", "5"]) == 0
    import pyarrow.parquet as pq

    got = pq.read_table(out).to_pylist()
    assert [g["extra_info"]["seed"] for g in got] == [5, 6, 7]
    assert got[0]["extra_info"]["env_kwargs"] == '{"split": "dev"}'
    assert got[0]["agent_name"] == "agentfly_chain"
    assert dataset_main(["Chess", "-o", str(tmp_path / "bad.parquet"), "-n", "2", "--split", "dev"]) == 2
    assert dataset_main(["NoSuchEnv", "-o", str(tmp_path / "bad.parquet"), "-n", "2"]) == 2
    assert not (tmp_path / "bad.parquet").exists()


@pytest.mark.slow
async def test_chess_chain_and_step_with_a_real_model(tmp_path, policy, clean_runtime):
    """Chain and step mode on a Chess puzzle (verl's RLHFDataset rows, the YAML's loops)."""
    tok = policy.tokenizer
    cfg = _trainer_config()
    server = ModelServer(policy)
    env_kwargs = {"mode": "puzzle"}
    (row,) = _rows(tmp_path, tok, cfg, "Chess", [PUZZLE], max_turns=3, env_kwargs=env_kwargs)
    chain = _make_loop("agentfly_chain", server, tok, cfg, max_tokens_per_turn=24)
    step = _make_loop("agentfly_step", server, tok, cfg, max_tokens_per_turn=24)
    out_c, out_s = await asyncio.gather(chain.run(_sampling(cfg), **row), step.run(_sampling(cfg), **row))
    opts = {"task_id": PUZZLE}
    await _check_chain(out_c, server, tok, "agentfly/Chess-v0", env_kwargs, 0, opts, 3)
    assert out_c.extra_fields["group_id"] == "uid-0"
    assert out_c.extra_fields["task_id"] == PUZZLE
    await _check_steps(out_s, server, tok, "agentfly/Chess-v0", env_kwargs, 0, opts)
    assert out_c.extra_fields["trajectory_id"] != out_s[0].extra_fields["trajectory_id"]

    # a short response_length: the chain is cut at the end, ids/mask/logprobs alike, never longer
    cfg_short = _trainer_config(response_length=40)
    server2 = ModelServer(policy)
    short = _make_loop("agentfly_chain", server2, tok, cfg_short, max_tokens_per_turn=24)
    out = await short.run(_sampling(cfg_short), **row)
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) <= 40
    await _check_chain(out, server2, tok, "agentfly/Chess-v0", env_kwargs, 0, opts, 3, response_length=40)
    assert all(c["max_tokens"] <= 40 for c in server2.calls)


async def test_solved_puzzle_reward(tmp_path, policy, clean_runtime):
    """A reply with the solution (scripted server) gives reward 1.0 in both modes, success in extra_fields."""
    tok = policy.tokenizer
    cfg = _trainer_config(response_length=2048)
    server = ScriptedServer(tok, [f"Best is {m}.\nAction: {m}" for m in ("e5e3", "f6a1", "a8a1")])
    (row,) = _rows(tmp_path, tok, cfg, "Chess", [PUZZLE], max_turns=3, env_kwargs={"mode": "puzzle"})
    out_c = await _make_loop("agentfly_chain", server, tok, cfg).run(_sampling(cfg), **row)
    out_s = await _make_loop("agentfly_step", server, tok, cfg).run(_sampling(cfg), **row)
    assert out_c.reward_score == 1.0
    assert out_c.extra_fields["success"]
    assert out_c.extra_fields["terminated"]
    assert out_c.num_turns == 6
    assert out_c.extra_fields["turn_scores"] == [0.0, 0.0, 1.0]
    assert out_c.extra_fields["reward_extra_info"] == {"acc": 1.0}
    ones = [t for t, m in zip(out_c.response_ids, out_c.response_mask) if m == 1]
    assert ones == sum(server.replies, [])
    assert [o.reward_score for o in out_s] == [1.0, 1.0, 1.0]
    assert [o.extra_fields["step_reward"] for o in out_s] == [0.0, 0.0, 1.0]
    assert [o.extra_fields["action"] for o in out_s] == ["e5e3", "f6a1", "a8a1"]


async def test_chess_game_against_stockfish_step_mode(tmp_path, policy, clean_runtime):
    """Step mode on a game vs a real Stockfish (engine moves first); the engine is released with the manager."""
    tok = policy.tokenizer
    cfg = _trainer_config()
    server = ModelServer(policy)
    env_kwargs = {"mode": "play", "agent_color": "black", "skill_level": None, "engine_depth": 2}  # deterministic
    (row,) = _rows_n(tmp_path, tok, cfg, "Chess", 1, mode="step", max_turns=2, env_kwargs=env_kwargs)
    outs = await _make_loop("agentfly_step", server, tok, cfg, max_tokens_per_turn=16).run(_sampling(cfg), **row)
    assert len(_children(("stockfish",))) == 1      # pooled, alive until shutdown
    await _check_steps(outs, server, tok, "agentfly/Chess-v0", env_kwargs, 0, None)


def _rows_n(tmp_path, tokenizer, cfg, env_id, n, **kw):
    path = build_dataset(env_id, None, n, tmp_path / "seeded.parquet", **kw)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=cfg.data, processor=None)
    rows = [dict(ds[i]) for i in range(len(ds))]
    for i, r in enumerate(rows):
        r["uid"] = f"uid-{i}"
        r.pop("dummy_tensor", None)
    return rows


@pytest.mark.slow
async def test_scienceworld_chain_and_step(tmp_path, policy, clean_runtime):
    """ScienceWorld (one pooled JVM shared by the two trajectories of the worker) in both modes."""
    tok = policy.tokenizer
    cfg = _trainer_config(response_length=400)
    server = ModelServer(policy)
    env_kwargs = {"max_instances": 1}
    (row,) = _rows(tmp_path, tok, cfg, "ScienceWorld", [SW_TASK], max_turns=2, env_kwargs=env_kwargs)
    loop = _make_loop("agentfly", server, tok, cfg, max_tokens_per_turn=16)     # mode from the row
    out_c = await loop.run(_sampling(cfg), **row)
    row_s = dict(row, extra_info=dict(row["extra_info"], mode="step"))
    out_s = await _make_loop("agentfly", server, tok, cfg, max_tokens_per_turn=16).run(_sampling(cfg), **row_s)
    opts = {"task_id": SW_TASK}
    await _check_chain(out_c, server, tok, "agentfly/ScienceWorld-v0", env_kwargs, 0, opts, 2, response_length=400)
    await _check_steps(out_s, server, tok, "agentfly/ScienceWorld-v0", env_kwargs, 0, opts)
    assert out_c.extra_fields["mode"] == "chain"
    assert out_s[0].extra_fields["mode"] == "step"
    (pool,) = [p for p in get_manager().metrics().values()]
    assert pool["started"] == 1                        # one JVM served both trajectories and both replays


async def test_failing_env_leaves_no_row_under_v1_and_an_error_row_under_the_legacy_trainer(tmp_path, policy,
                                                                                           clean_runtime):
    """A bad task id, an unknown env or bad env kwargs never raise.  V1: no row (verl's convention), the
    failure counted per worker; legacy trainer (one output per trajectory): a row with reward 0, mask 0,
    the error text and verl's global step as its weights version."""
    from agentfly_gym_verl.runtime import failure_metrics, reset_failure_metrics

    tok = policy.tokenizer
    cfg = _trainer_config()
    server = ModelServer(policy)
    (row,) = _rows(tmp_path, tok, cfg, "Chess", ["no-such-puzzle"], max_turns=2, env_kwargs={"mode": "puzzle"},
                   check=False)  # written unchecked on purpose
    reset_failure_metrics()
    bad_env = dict(row, extra_info=dict(row["extra_info"], env_id="agentfly/Nope-v0"))
    bad_kw = dict(row, extra_info=dict(row["extra_info"], env_kwargs='{"mode": "blitz"}'))
    for name, r in (("agentfly_chain", row), ("agentfly_step", row), ("agentfly_chain", bad_env),
                    ("agentfly_chain", bad_kw)):
        assert await _make_loop(name, server, tok, cfg).run(_sampling(cfg), **r, global_steps=3) == []
    counts = failure_metrics()
    assert counts["failed_trajectories"] == 4
    assert counts["by_error"] == {"ConfigError": 4}
    assert counts["by_mode"] == {"chain": 3, "step": 1}
    assert server.calls == []
    cfg_v0 = _trainer_config(use_v1=False)
    out = await _make_loop("agentfly_chain", server, tok, cfg_v0).run(_sampling(cfg_v0), **row, global_steps=3)
    assert isinstance(out, AgentLoopOutput)
    assert out.reward_score == 0.0
    assert "ConfigError" in out.extra_fields["error"]
    assert "no-such-puzzle" in out.extra_fields["error"]
    assert set(out.response_mask) == {0}
    assert server.calls == []
    assert out.extra_fields["status"] == "error"
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 3
    _check_schema(out)
    out = await _make_loop("agentfly_chain", server, tok, cfg_v0).run(_sampling(cfg_v0), **bad_env)
    assert "unknown environment" in out.extra_fields["error"]
    assert out.reward_score == 0.0
    out = await _make_loop("agentfly_chain", server, tok, cfg_v0).run(_sampling(cfg_v0), **bad_kw)
    assert "blitz" in out.extra_fields["error"]
    reset_failure_metrics()
    # step mode under the legacy trainer is a configuration error, said loudly
    with pytest.raises(agentfly_gym.errors.ConfigError, match="use_v1"):
        await _make_loop("agentfly_step", server, tok, cfg_v0).run(_sampling(cfg_v0), **row)


async def test_step_prompts_over_prompt_length_keep_the_system_prompt(tmp_path, policy, clean_runtime):
    """A prompt_length that the full history does not fit: the oldest history goes first, the system
    prompt stays whole, what the server saw is what the row holds, and the row says what was dropped."""
    tok = policy.tokenizer
    replies = [f"Best is {m}.\nAction: {m}" for m in ("e5e3", "f6a1", "a8a1")]
    (row,) = _rows(tmp_path, tok, _trainer_config(), "Chess", [PUZZLE], mode="step", max_turns=3, history=2,
                   env_kwargs={"mode": "puzzle"})
    server = ScriptedServer(tok, replies)
    cfg = _trainer_config()
    cfg.data.max_prompt_length = 8192
    full = await _make_loop("agentfly_step", server, tok, cfg).run(_sampling(cfg), **row)
    sizes = [len(o.prompt_ids) for o in full]
    assert [o.extra_fields["history_shown"] for o in full] == [0, 1, 2]
    assert sizes[2] > sizes[1] > sizes[0]
    assert not any(o.extra_fields["prompt_truncated"] for o in full)
    cfg.data.max_prompt_length = sizes[2] - 1                 # step 2 cannot show both past steps
    server = ScriptedServer(tok, replies)
    outs = await _make_loop("agentfly_step", server, tok, cfg).run(_sampling(cfg), **row)
    await _check_steps(outs, server, tok, "agentfly/Chess-v0", {"mode": "puzzle"}, 0, {"task_id": PUZZLE},
                       prompt_length=sizes[2] - 1)
    assert [o.prompt_ids for o in outs[:2]] == [o.prompt_ids for o in full[:2]]
    last = outs[2]
    assert len(last.prompt_ids) <= sizes[2] - 1
    assert last.extra_fields["history_shown"] == 1
    assert last.extra_fields["prompt_truncated"]
    assert last.extra_fields["prompt_cut"] == 0
    system = tok.apply_chat_template(row["raw_prompt"][:1], tokenize=True, return_dict=False)
    assert all(o.prompt_ids[:len(system)] == system for o in outs)
    text = tok.decode(last.prompt_ids)
    assert "[Step 2]" in text
    assert "[Step 1]" not in text


def test_dataset_builder_rejects_tasks_and_options_the_env_rejects(tmp_path):
    from agentfly_gym.errors import ConfigError
    from agentfly_gym_verl.dataset import build_dataset

    with pytest.raises(ConfigError, match="ZZZZ"):
        build_dataset("Chess", tasks=["ZZZZ"], out_path=tmp_path / "a.parquet")
    with pytest.raises(ConfigError, match="bogus"):
        build_dataset("Chess", n=2, out_path=tmp_path / "b.parquet", reset_options={"bogus": 1})
    assert not (tmp_path / "a.parquet").exists()
    assert not (tmp_path / "b.parquet").exists()
    assert build_dataset("Chess", tasks=["tewjc"], out_path=tmp_path / "c.parquet").exists()
