"""The plugin's outputs through verl 0.9.1's own V1 worker and trainer code, down to the advantages.

What runs is verl's: the V1 agent-loop worker (``AgentLoopWorkerTQ``: ``_run_prompt`` spawning
``rollout.n`` sessions, ``_run_agent_loop`` instantiating the plugin's YAML entry with hydra,
``_agent_loop_postprocess`` building the rows and their staleness tags), and the V1 trainer's
``_compute_advantage`` (``compute_advantage_for_multi_trajectories``: GRPO and GAE) and
``_compute_metrics`` (which builds int arrays from ``min/max_global_steps``).  The worker is
built with verl's ``AgentLoopWorker.__init__`` from verl's generated ``ppo_trainer`` config
(the tiny Qwen2 model's folder as the model path).

Stand-ins, where the real thing cannot run here: the inference server (GPU) is a scripted server
with verl's ``generate`` signature and ``TokenOutput`` (:class:`ScriptedServer`), the critic (GPU)
is a value function of 0 (so GAE's returns are the discounted rewards), and TransferQueue (a Ray
service between worker and trainer) is the in-memory :class:`KVStore` that keeps what the worker
puts and hands it back to the trainer's reads, converted by verl's own ``list_of_dict_to_tensordict``.
The environment is real: Chess puzzle ``tewjc`` (setup e5e3, solution f6a1, mate).
"""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest
from verltools import trainer_config
import torch

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, get_trajectory_info
    from verl.trainer.ppo.v1 import agent_loop_tq, trainer_base
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput
    from transfer_queue import KVBatchMeta
except ImportError as e:  # pragma: no cover
    pytest.skip(f"verl 0.9.1 (with its V1 trainer) cannot be imported ({e})", allow_module_level=True)

import agentfly_gym_verl
from agentfly_gym_verl.dataset import build_dataset
from agentfly_gym_verl.runtime import aclose, failure_metrics, reset_failure_metrics

PUZZLE = "tewjc"
SOLVE = [f"Best is {m}.\nAction: {m}" for m in ("e5e3", "f6a1", "a8a1")]   # three moves, the last one mates
MISS = ["Action: a1a2"] * 3                                                   # never the solution: reward 0
GLOBAL_STEPS = 7


class ScriptedServer:
    """verl's ``generate(request_id, *, prompt_ids, sampling_params)`` -> ``TokenOutput``: the j-th
    trajectory (request id, in order of first request) plays ``scripts[j % len(scripts)]``: its k-th
    request gets reply ``k`` + ``end`` (logprob -0.25 each).  The ``fail``-th trajectory gets a server
    error instead.  Reports no ``global_steps`` (as a server that does not know the weights version)."""

    def __init__(self, tokenizer, scripts: list[list[str]], end: str = "<|im_end|>", fail: int | None = None) -> None:
        end_id = tokenizer.convert_tokens_to_ids(end)
        self.scripts = [[tokenizer.encode(r, add_special_tokens=False) + [end_id] for r in replies]
                        for replies in scripts]
        self.fail = fail
        self.order: list[str] = []
        self.calls: dict[str, int] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        if request_id not in self.calls:
            self.order.append(request_id)
            self.calls[request_id] = 0
        k = self.calls[request_id]
        self.calls[request_id] += 1
        if self.fail is not None and self.order.index(request_id) == self.fail:
            raise ConnectionError("inference server unreachable")
        replies = self.scripts[self.order.index(request_id) % len(self.scripts)]
        ids = replies[k % len(replies)][: int(sampling_params["max_tokens"])]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


class KVStore:
    """In-memory stand-in for TransferQueue's key-value calls used by the V1 worker and trainer."""

    def __init__(self, to_tensordict) -> None:
        self.to_tensordict = to_tensordict
        self.rows: dict[str, dict] = {}
        self.tags: dict[str, dict] = {}
        self.status: dict[str, str] = {}
        self._last: list[dict] = []

    def recording_to_tensordict(self, dicts):
        self._last = list(dicts)
        return self.to_tensordict(dicts)

    async def async_kv_put(self, key, partition_id=None, fields=None, tag=None, **kw):
        self.status[key] = tag["status"]

    async def async_kv_batch_put(self, keys, partition_id=None, fields=None, tags=None, **kw):
        assert len(self._last) == len(keys)
        for k, row, tag in zip(keys, self._last, tags):
            self.rows[k], self.tags[k] = dict(row), dict(tag)

    def kv_batch_get(self, keys, partition_id=None, select_fields=None, **kw):
        """Per-token fields come back as jagged nested tensors (as TransferQueue stores them), the rest as
        verl's list_of_dict_to_tensordict makes them."""
        rows = [self.rows[k] for k in keys]
        names = [f for f in select_fields if f in rows[0]]
        jagged = [f for f in names if all(isinstance(r[f], torch.Tensor) and r[f].dim() >= 1 for r in rows)]
        td = self.to_tensordict([{f: r[f] for f in names if f not in jagged} or {"_": 0} for r in rows])
        td.pop("_", None)
        for f in jagged:
            td[f] = torch.nested.as_nested_tensor([r[f] for r in rows], layout=torch.jagged)
        return td

    def kv_batch_put(self, keys, partition_id=None, fields=None, **kw):
        for i, k in enumerate(keys):
            for name in fields.keys():
                self.rows[k][name] = fields[name][i]
        return KVBatchMeta(keys=list(keys), tags=[self.tags[k] for k in keys], partition_id=partition_id)


@pytest.fixture
def store(monkeypatch):
    s = KVStore(agent_loop_tq.list_of_dict_to_tensordict)
    for name in ("async_kv_put", "async_kv_batch_put", "kv_batch_get", "kv_batch_put"):
        monkeypatch.setattr(agent_loop_tq.tq, name, getattr(s, name))
        monkeypatch.setattr(trainer_base.tq, name, getattr(s, name))
    monkeypatch.setattr(agent_loop_tq, "list_of_dict_to_tensordict", s.recording_to_tensordict)
    reset_failure_metrics()
    yield s
    reset_failure_metrics()


def _config(tiny_qwen, n: int, response_length: int = 2048):
    cfg = trainer_config(1024, response_length)
    cfg.actor_rollout_ref.model.path = str(tiny_qwen)
    cfg.actor_rollout_ref.rollout.name = "vllm"
    cfg.actor_rollout_ref.rollout.n = n
    cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path = str(agentfly_gym_verl.config_path())
    return cfg


def _worker(cfg, server):
    """verl's V1 agent-loop worker (the class inside the Ray actor), built by verl's own __init__."""
    worker = object.__new__(AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    AgentLoopWorker.__init__(worker, cfg, server)
    worker.background_tasks = set()
    return worker


def _prompts(tmp_path, worker, cfg, tasks: list[str], agent_name: str) -> list[dict]:
    path = build_dataset("Chess", tasks, None, tmp_path / f"{agent_name}.parquet", max_turns=3,
                         env_kwargs={"mode": "puzzle"}, check=False)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=worker.tokenizer, config=cfg.data, processor=None)
    out = []
    for i in range(len(ds)):
        row = dict(ds[i])
        row.pop("dummy_tensor", None)
        row.update(uid=f"uid{i}", global_steps=GLOBAL_STEPS, agent_name=agent_name)
        out.append(row)
    return out


async def _generate(worker, cfg, prompts: list[dict]) -> None:
    """What the V1 worker's generate_sequences does for each prompt (rollout.n sessions each)."""
    r = cfg.actor_rollout_ref.rollout
    sampling = dict(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, repetition_penalty=1.0,
                    logprobs=r.calculate_log_probs)
    infos = await get_trajectory_info(GLOBAL_STEPS, [p["index"] for p in prompts], False)
    try:
        await asyncio.gather(*(worker._run_prompt(dict(p), sampling, info) for p, info in zip(prompts, infos)))
    finally:
        await aclose()


def _trainer(cfg, estimator: str):
    """The V1 trainer's state that _compute_advantage / _compute_metrics read (no GPU workers)."""
    cfg.algorithm.adv_estimator = estimator
    cfg.algorithm.gamma, cfg.algorithm.lam = 1.0, 1.0
    cfg.algorithm.rollout_correction = None   # it needs the actor's recomputed log-probs (a GPU step)
    return types.SimpleNamespace(config=cfg, use_critic=estimator == "gae", _rollout_moe_lb_metrics_accumulator=None,
                                 _get_n_gpus_for_throughput=lambda: 1)


def _train_step(store: KVStore, cfg, estimator: str) -> tuple[KVBatchMeta, dict]:
    """verl's V1 advantage and metric steps over every row the worker stored."""
    keys = sorted(store.rows)
    for k in keys:  # the critic's values (stand-in: 0), written where V1's _compute_values writes them
        store.rows[k]["values"] = torch.zeros(len(store.rows[k]["responses"]))
    batch = KVBatchMeta(keys=keys, tags=[store.tags[k] for k in keys], partition_id="train")
    trainer = _trainer(cfg, estimator)
    metrics: dict = {}
    batch = PPOTrainer._compute_advantage(trainer, batch, metrics)
    PPOTrainer._compute_metrics(trainer, batch, metrics, {"step": 1.0, "gen": 0.5}, GLOBAL_STEPS + 1, 0)
    return batch, metrics


@pytest.mark.slow
async def test_a_failed_session_leaves_no_row_and_no_shifted_group(tmp_path, tiny_qwen, store):
    """Three sessions of one puzzle, two solve it, the third loses its server: no row for it, GRPO
    advantages 0 (not +0.577: a reward-0 row would have joined the group), GAE returns 1, every tag an int."""
    cfg = _config(tiny_qwen, n=3)
    worker = _worker(cfg, None)
    worker.llm_client = ScriptedServer(worker.tokenizer, [SOLVE], fail=1)
    await _generate(worker, cfg, _prompts(tmp_path, worker, cfg, [PUZZLE], "agentfly_chain"))
    assert store.status == {"uid0": "finished"}
    assert len(store.rows) == 2
    assert all(k.startswith("uid0_") and k.endswith("_0") for k in store.rows)
    for k, tag in store.tags.items():
        assert tag["min_global_steps"] == tag["max_global_steps"] == GLOBAL_STEPS     # verl's global_steps
        assert float(store.rows[k]["rm_scores"].sum()) == 1.0
    assert failure_metrics()["failed_trajectories"] == 1
    assert failure_metrics()["by_error"] == {"ConnectionError": 1}
    for estimator in ("grpo", "gae"):
        batch, metrics = _train_step(store, cfg, estimator)
        for k in batch.keys:
            row = store.rows[k]
            mask = row["response_mask"].bool()
            if estimator == "grpo":
                assert torch.all(row["advantages"] == 0.0)                   # 1 - mean(1, 1) = 0
            else:
                assert torch.allclose(row["returns"][mask], torch.ones(int(mask.sum())))
        assert metrics["training/off_policy/trajectory_spans/mean"] == 1.0
        assert metrics["training/off_policy/trajectory_staleness/max"] == 0


@pytest.mark.slow
async def test_a_batch_with_a_failing_prompt_trains(tmp_path, tiny_qwen, store):
    """One prompt whose env fails before any generation (an unknown puzzle id) next to a good one:
    the good one's rows go through verl's V1 metric step (which needs int staleness tags)."""
    cfg = _config(tiny_qwen, n=2)
    worker = _worker(cfg, None)
    worker.llm_client = ScriptedServer(worker.tokenizer, [SOLVE])
    prompts = _prompts(tmp_path, worker, cfg, [PUZZLE, "no-such-puzzle"], "agentfly_step")
    await _generate(worker, cfg, prompts)
    assert store.status == {"uid0": "finished", "uid1": "finished"}
    assert sorted(store.rows) == [f"uid0_{s}_{i}" for s in (0, 1) for i in range(3)]   # 3 steps each, uid1: none
    assert failure_metrics()["by_env"] == {"agentfly/Chess-v0": 2}
    assert all(isinstance(t["min_global_steps"], int) for t in store.tags.values())
    batch, metrics = _train_step(store, cfg, "grpo")
    assert np.isfinite(metrics["training/off_policy/trajectory_staleness/mean"])
    assert all(torch.all(store.rows[k]["advantages"] == 0.0) for k in batch.keys)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["agentfly_chain", "agentfly_step"])
async def test_the_reward_sits_on_a_sampled_token(tmp_path, tiny_qwen, store, mode):
    """Replies that stop on <|endoftext|> (another eos than the template's <|im_end|>): the closing
    <|im_end|> (mask 0) is not the last token, so verl's reward lands on a sampled token: GAE's
    return is the episode's return at every trained token (it was 0 with a mask-0 last token), and
    GRPO gives the solver +0.707 and the other session -0.707 on every trained token."""
    cfg = _config(tiny_qwen, n=2)
    worker = _worker(cfg, None)
    worker.llm_client = ScriptedServer(worker.tokenizer, [SOLVE, MISS], end="<|endoftext|>")
    await _generate(worker, cfg, _prompts(tmp_path, worker, cfg, [PUZZLE], mode))
    eos = worker.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    returns = {k: float(row["rm_scores"].sum()) for k, row in store.rows.items()}
    assert sorted(set(returns.values())) == [0.0, 1.0]
    for row in store.rows.values():
        assert int(row["response_mask"][-1]) == 1
        assert int(row["responses"][-1]) == eos
        assert float(row["rm_scores"][-1]) == float(row["rm_scores"].sum())      # on the last, sampled token
    for estimator in ("gae", "grpo"):
        batch, _ = _train_step(store, cfg, estimator)
        for k in batch.keys:
            row = store.rows[k]
            mask = row["response_mask"].bool()
            if estimator == "gae":
                assert torch.allclose(row["returns"][mask], torch.full((int(mask.sum()),), returns[k]))
            else:
                sign = 1.0 if returns[k] == 1.0 else -1.0
                assert torch.allclose(row["advantages"][mask], torch.full((int(mask.sum()),), sign * 2 ** -0.5),
                                      atol=1e-4)
