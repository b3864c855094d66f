"""The verl plugin's self-play agent loop (agentfly_gym_verl.selfplay) against verl 0.9.1's real classes.

Built as verl's ``AgentLoopWorker`` builds it (``hydra.utils.instantiate`` of the plugin YAML's
``agentfly_selfplay`` entry with verl's generated trainer config), run as verl's V1 worker runs the
``rollout.n`` sessions of one data row (concurrent tasks with ``uid`` and ``session_id``), and every
output passed through what verl's V1 post-processing does with it (``AgentLoopOutput.as_dict`` and
``list_of_dict_to_tensordict``).

The one stand-in, as in tests/test_verl_plugin.py: verl's server manager (GPU inference servers)
cannot run here, so a real tiny model on CPU (or, for a decisive game with known rewards, the tokens of
scripted replies) answers behind verl's ``generate`` signature with verl's own ``TokenOutput``.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from verltools import trainer_config

pytest.importorskip("pettingzoo")
try:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.workers.rollout.replica import TokenOutput
except ImportError as e:  # pragma: no cover
    pytest.skip(f"verl 0.9.1 cannot be imported ({e})", allow_module_level=True)

import agentfly_gym_verl  # noqa: F401,E402  (the plugin, as a trainer imports it)
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.policies.base import SamplingParams
from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy
from agentfly_gym_verl.agent_loop import EXTRA_FIELD_DEFAULTS
from agentfly_gym_verl.runtime import aclose
from agentfly_gym_verl.selfplay import pending_games, selfplay_rows

PROMPT_LEN, RESPONSE_LEN = 1024, 1500  # a chess observation is ~250 tokens
FOOLS_MATE = {"white": ["I open.\nAction: f3", "Action: g4"], "black": ["Action: e5", "Mate!\nAction: Qh4#"]}


class ModelServer:
    """verl's ``generate`` signature and ``TokenOutput`` over a real tiny model on CPU; records calls."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        sp = SamplingParams(max_tokens=int(sampling_params["max_tokens"]))
        gen = await self.policy.generate(list(prompt_ids), sp)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "token_ids": list(gen.token_ids),
                           "log_probs": list(gen.logprobs)})
        return TokenOutput(token_ids=list(gen.token_ids), log_probs=list(gen.logprobs), stop_reason="completed")


class ScriptedServer(ModelServer):
    """Replies with the tokens of the next scripted reply of the player named by the request id."""

    def __init__(self, tokenizer, replies: dict[str, list[str]]) -> None:
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = {a: [tokenizer.encode(r, add_special_tokens=False) + [eot] for r in rs] for a, rs in replies.items()}
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        agent = request_id.rsplit("-", 1)[1]
        k = sum(1 for c in self.calls if c["request_id"] == request_id)
        ids = self.replies[agent][k]
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "token_ids": ids,
                           "log_probs": [-0.5] * len(ids)})
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def _cfg(use_v1: bool = True):
    return trainer_config(PROMPT_LEN, RESPONSE_LEN, use_v1=use_v1)


def _loop(server, tokenizer, cfg, **overrides):
    entries = {e.name: e for e in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)}
    entry = OmegaConf.merge(entries["agentfly_selfplay"], overrides)
    return hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                                   tokenizer=tokenizer, processor=None, hf_model_type="qwen2",
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap([]))


def _row(tmp_path, tokenizer, cfg, **kw) -> dict:
    """One self-play data row as verl's RLHFDataset yields it (written to parquet and read back)."""
    import pandas as pd

    path = tmp_path / "selfplay.parquet"
    pd.DataFrame(selfplay_rows(1, **kw)).to_parquet(path)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=cfg.data, processor=None)
    row = dict(ds[0])
    row.pop("dummy_tensor", None)
    row["uid"] = "uid-7"
    return row


async def _sessions(cfg, server, tok, row, n=2, legacy=False, **overrides):
    """The ``rollout.n`` sessions of one row, as verl's V1 worker runs them (concurrent tasks with a
    ``session_id``), or as the legacy worker does (``legacy=True``: repeated rows, no session id)."""
    r = cfg.actor_rollout_ref.rollout
    sampling = dict(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, logprobs=True)
    loops = [_loop(server, tok, cfg, **overrides) for _ in range(n)]
    ids = [{} if legacy else {"session_id": i} for i in range(n)]
    return await asyncio.gather(*(lp.run(sampling, **ids[i], **row) for i, lp in enumerate(loops)))


def _postprocess(outs) -> None:
    """What verl's V1 post-processing does with the rows: as_dict, then stack them."""
    fields = []
    for o in outs:
        assert set(o.extra_fields) == set(EXTRA_FIELD_DEFAULTS)
        assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) >= 1
        assert len(o.response_ids) <= RESPONSE_LEN
        assert len(o.prompt_ids) <= PROMPT_LEN
        f = o.as_dict()
        assert f["rm_scores"][-1] == o.reward_score
        fields.append(f)
    list_of_dict_to_tensordict(fields)


@pytest.fixture
async def clean_runtime():
    yield
    from agentfly_gym_verl.runtime import current_runtime

    runtime = current_runtime()
    await aclose()
    # the pairing belongs to the worker's runtime (not to module dicts): closing the runtime drops it
    assert pending_games() == 0
    assert (runtime is None or (runtime.selfplay is None and runtime.manager.closed))


@pytest.fixture(scope="module")
def qwen_tok(test_data):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3")


async def test_fools_mate_rows_carry_each_sides_reward(tmp_path, qwen_tok, clean_runtime):
    """Sessions 0 and 1 of one row play one game; Black mates: Black's rows +1, White's -1 (chain and step)."""
    cfg = _cfg()
    row = _row(tmp_path, qwen_tok, cfg)
    for mode in ("chain", "step"):
        server = ScriptedServer(qwen_tok, FOOLS_MATE)
        white, black = await _sessions(cfg, server, qwen_tok, row, mode=mode)
        if mode == "chain":
            white, black = [white], [black]
        _postprocess(white + black)
        assert [o.reward_score for o in white] == [-1.0] * len(white)
        assert [o.reward_score for o in black] == [1.0] * len(black)
        ew, eb = white[-1].extra_fields, black[-1].extra_fields
        assert ew["group_id"] == eb["group_id"] == "uid-7-g0"
        assert ew["trajectory_id"] != eb["trajectory_id"]
        assert not ew["error"]
        assert not eb["error"]
        assert eb["success"]
        assert not ew["success"]
        assert ew["num_steps"] == eb["num_steps"] == 2
        # one request id per player; the sampled ids are in that player's rows verbatim, with logprobs
        by_player = {a: [c for c in server.calls if c["request_id"] == f"uid-7-g0-{a}"] for a in ("white", "black")}
        for outs, a in ((white, "white"), (black, "black")):
            sampled = [i for o in outs for i, m in zip(o.response_ids, o.response_mask) if m == 1]
            assert sampled == [i for c in by_player[a] for i in c["token_ids"]]
            lps = [lp for o in outs for lp, m in zip(o.response_logprobs, o.response_mask) if m == 1]
            assert lps == [-0.5] * len(sampled)
        if mode == "chain":
            # Black's second request saw its first prompt + its reply + White's g4 in its next observation
            c2 = by_player["black"][1]["prompt_ids"]
            assert c2 == black[0].prompt_ids + black[0].response_ids[:len(c2) - len(black[0].prompt_ids)]
            assert "White played g4 (g2g4)" in qwen_tok.decode(c2[len(black[0].prompt_ids):])
        else:
            assert [o.extra_fields["step"] for o in black] == [0, 1]
            assert [o.prompt_ids for o in black] == [c["prompt_ids"] for c in by_player["black"]]


@pytest.mark.slow
async def test_tiny_model_self_play_exact_ids_and_unpaired_session(tmp_path, tiny_qwen, clean_runtime):
    """A real model on both sides: exact sampled ids; White forfeits (random text), Black never moves and gets a
    row that trains nothing with +1; a third, unpaired session plays its own game without waiting."""
    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=4, batch_wait_s=0.02)
    try:
        tok = policy.tokenizer
        cfg = _cfg()
        row = _row(tmp_path, tok, cfg, env_kwargs={"max_invalid_moves": 2})
        server = ModelServer(policy)
        outs = await _sessions(cfg, server, tok, row, n=3, mode="chain", max_tokens_per_turn=16)
        _postprocess(outs)
        white, black, lone = outs
        assert white.reward_score == -1.0
        assert black.reward_score == 1.0
        assert white.extra_fields["num_steps"] == 2
        assert black.extra_fields["num_steps"] == 0
        assert black.response_mask == [0] * len(black.response_mask)
        calls = [c for c in server.calls if c["request_id"] == "uid-7-g0-white"]
        assert white.prompt_ids == calls[0]["prompt_ids"]
        sampled = [i for i, m in zip(white.response_ids, white.response_mask) if m == 1]
        assert sampled == [i for c in calls for i in c["token_ids"]]
        lps = [lp for lp, m in zip(white.response_logprobs, white.response_mask) if m == 1]
        assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(lps, [x for c in calls for x in c["log_probs"]]))
        chat = ChatTokenizer(tok)
        assert white.response_ids[len(calls[0]["token_ids"]):][:1] == chat.close_assistant_ids(calls[0]["token_ids"])[:1]
        # the unpaired third session (game 1, White) played its own game to the end
        assert lone.extra_fields["group_id"] == "uid-7-g1"
        assert lone.reward_score == -1.0
        assert pending_games() == 1  # its Black rows wait for a partner until claim_timeout
        from agentfly_gym_verl.runtime import current_runtime

        current_runtime().selfplay.purge(0.0)  # the pairing belongs to the worker's runtime
        assert pending_games() == 0
    finally:
        policy.close()


async def test_legacy_trainer_pairs_by_arrival_and_refuses_step_mode(tmp_path, qwen_tok, clean_runtime):
    cfg = _cfg(use_v1=False)
    row = _row(tmp_path, qwen_tok, cfg)
    row["uid"] = "uid-legacy"
    white, black = await _sessions(cfg, ScriptedServer(qwen_tok, FOOLS_MATE), qwen_tok, row, legacy=True, mode="chain")
    _postprocess([white, black])
    assert (white.reward_score, black.reward_score) == (-1.0, 1.0)
    assert white.extra_fields["group_id"] == black.extra_fields["group_id"] == "uid-legacy-g0"
    from agentfly_gym.errors import ConfigError

    with pytest.raises(ConfigError, match="use_v1"):
        await _sessions(cfg, ScriptedServer(qwen_tok, FOOLS_MATE), qwen_tok, row, n=1, legacy=True, mode="step")


async def test_bad_row_leaves_no_row_under_v1_and_an_error_row_under_legacy(tmp_path, qwen_tok, clean_runtime):
    for use_v1 in (True, False):
        cfg = _cfg(use_v1=use_v1)
        row = _row(tmp_path, qwen_tok, cfg)
        row["extra_info"] = dict(row["extra_info"], env_id="agentfly/Chess-v0")
        (out,) = await _sessions(cfg, ScriptedServer(qwen_tok, FOOLS_MATE), qwen_tok, row, n=1, legacy=not use_v1,
                                 mode="chain")
        if use_v1:
            assert out == []
        else:
            _postprocess([out])
            assert "not a multi-agent environment" in out.extra_fields["error"]
            assert out.reward_score == 0.0
