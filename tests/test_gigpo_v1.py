"""GiGPO in verl 0.9.1's V1 trainer: ``trainer.v1.trainer_mode=gigpo_sync`` (agentfly_gym_verl.gigpo_trainer).

What runs is verl's: the V1 agent-loop worker (``AgentLoopWorkerTQ._run_prompt`` spawning
``rollout.n`` sessions of the plugin's ``agentfly_step`` loop, ``_agent_loop_postprocess`` storing
one row per step under ``{uid}_{session}_{index}`` with its ``extra_fields``), the trainer class
verl's ``main_ppo`` resolves with ``get_trainer_cls(trainer.v1.trainer_mode)``, built by verl's own
``PPOTrainer.__init__`` (replay buffer included), and its ``_compute_advantage`` step.

Stand-ins, where the real thing cannot run here (as in tests/test_verl_training.py, whose helpers
are reused): the inference server (GPU) is a scripted server with verl's ``generate`` signature
replying fixed moves, and TransferQueue (a Ray service between worker and trainer) is the
in-memory ``KVStore`` that keeps what the worker puts and hands it back converted by verl's own
``list_of_dict_to_tensordict``.  The environment is real: Chess puzzle ``tewjc``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

try:
    import torch
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.dataset.rl_dataset import RLHFDataset
except ImportError as e:  # pragma: no cover
    pytest.skip(f"verl 0.9.1 (with its V1 trainer) cannot be imported ({e})", allow_module_level=True)

from test_verl_training import GLOBAL_STEPS, ScriptedServer, _config, _generate, _worker, store  # noqa: E402,F401

from agentfly_gym.errors import ConfigError
from agentfly_gym_verl.dataset import build_dataset
from agentfly_gym_verl.gigpo_trainer import TRAINER_MODES, GiGPOTrainerSync

PUZZLE = "tewjc"
# the four sessions' moves (cycled): two mate (reward 1), two never do (reward 0); the same moves from
# the start position lead to the same positions, so anchors repeat across sessions
SCRIPTS = [("e5e3", "f6a1", "a8a1"), ("e5e3", "a8a1", "f6a1", "a8a1"), ("f6a1", "h7h5"), ("f6a1", "a8a1")]
WIN, LOSS = 6 / 13, -7 / 13   # 13 rows, 7 of return 1: episode advantage 1 - 7/13 or 0 - 7/13 (mean_norm)
# by hand, gamma 0.5: discounted step returns s0 .25 .5 1; s1 .125 .25 .5 1; s2, s3 0.  Step groups:
# start {.25, .125, 0, 0} (mean .09375); {s0[1] .5, s1[1] .25}; {s0[2] 1, s1[3] 1}; {s2[1], s3[1], s3[3]};
# s1[2] and s3[2] seen once (step advantage 0)
EXPECTED = [[WIN + .15625, WIN + .125, WIN],
            [WIN + .03125, WIN - .125, WIN, WIN],
            [LOSS - .09375, LOSS],
            [LOSS - .09375, LOSS, LOSS, LOSS]]


def _prompts(tmp_path, worker, cfg, agent_name: str) -> list[dict]:
    path = build_dataset("Chess", [PUZZLE], None, tmp_path / f"{agent_name}.parquet", max_turns=4,
                         env_kwargs={"mode": "puzzle"}, check=False)
    row = dict(RLHFDataset(data_files=[str(path)], tokenizer=worker.tokenizer, config=cfg.data, processor=None)[0])
    row.pop("dummy_tensor", None)
    row.update(uid="uid0", global_steps=GLOBAL_STEPS, agent_name=agent_name)
    return [row]


async def _rollout(tmp_path, tiny_qwen, agent_name: str):
    cfg = _config(tiny_qwen, n=len(SCRIPTS), response_length=64)
    cfg.data.max_prompt_length = 4096
    worker = _worker(cfg, None)
    server = ScriptedServer(worker.tokenizer, [[f"Action: {m}" for m in s] for s in SCRIPTS])
    worker.llm_client = server
    await _generate(worker, cfg, _prompts(tmp_path, worker, cfg, agent_name))
    return cfg, server


def _gigpo_config(cfg, mode: str = "gigpo_sync"):
    cfg.trainer.v1.trainer_mode = mode
    cfg.algorithm.adv_estimator = "gigpo"
    cfg.algorithm.gamma, cfg.algorithm.lam = 0.5, 1.0
    cfg.algorithm.rollout_correction = None   # it needs the actor's recomputed log-probs (a GPU step)
    cfg.algorithm.gigpo = {"mode": "mean_norm"}
    return cfg


def _batch(store) -> KVBatchMeta:
    keys = sorted(store.rows)
    return KVBatchMeta(keys=keys, tags=[store.tags[k] for k in keys], partition_id="train")


@pytest.mark.slow
def test_selectable_in_a_fresh_trainer_process():
    """verl's VERL_USE_EXTERNAL_MODULES hook imports the module: the trainer names resolve through
    verl's get_trainer_cls (what main_ppo calls) and the "gigpo" estimator is registered."""
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="agentfly_gym_verl.gigpo_trainer",
               PYTHONPATH=os.pathsep.join([str(ROOT / "plugins" / "verl"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]))
    code = ("import verl\nfrom verl.trainer.ppo.v1 import get_trainer_cls\n"
            "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "print(get_adv_estimator_fn('gigpo').__module__, "
            "*(get_trainer_cls(m).__name__ + ':' + get_trainer_cls(m).base_mode for m in "
            "('gigpo_sync', 'gigpo_colocate_async', 'gigpo_separate_async')))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].split() == [
        "agentfly_gym_verl.gigpo", "GiGPOTrainerSync:sync", "GiGPOTrainerColocateAsync:colocate_async",
        "GiGPOTrainerSeparateAsync:separate_async"]
    assert TRAINER_MODES == {"gigpo_sync": "sync", "gigpo_colocate_async": "colocate_async",
                             "gigpo_separate_async": "separate_async"}


@pytest.mark.slow
async def test_gigpo_advantages_through_the_v1_worker_and_trainer(tmp_path, tiny_qwen, store):
    """Four step-mode sessions of one puzzle through verl's V1 worker; the gigpo_sync trainer (built by
    verl's __init__, so it runs as verl's sync trainer) writes GiGPO advantages equal to the hand-computed
    ones on every response token; verl's own sync trainer fails on the same batch with GiGPO's ConfigError."""
    cfg, server = await _rollout(tmp_path, tiny_qwen, "agentfly_step")
    assert store.status == {"uid0": "finished"}
    sessions: dict[int, list[str]] = {}
    for k in sorted(store.rows, key=lambda k: (int(k.split("_")[1]), int(k.split("_")[2]))):
        sessions.setdefault(int(k.split("_")[1]), []).append(k)
    # which script each session played (the server hands them out in order of first request): by its moves
    script_of = {s: next((j for j, moves in enumerate(SCRIPTS)
                          if [store.rows[k]["extra_fields"]["action"] for k in keys]
                          == [moves[i % len(moves)] for i in range(len(keys))]), None)
                 for s, keys in sessions.items()}
    assert sorted(script_of.values()) == [0, 1, 2, 3]
    assert {s: len(keys) for s, keys in sessions.items()} == {s: len(EXPECTED[j]) for s, j in script_of.items()}

    cfg = _gigpo_config(cfg)
    assert get_trainer_cls("gigpo_sync") is GiGPOTrainerSync
    trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(config=cfg)
    assert trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer
    assert cfg.trainer.v1.trainer_mode == "gigpo_sync"                      # the caller's config untouched

    with pytest.raises(ConfigError, match="gigpo_sync"):                   # the gap this trainer closes
        PPOTrainerSync._compute_advantage(trainer, _batch(store), {})
    assert not any("advantages" in row for row in store.rows.values())

    metrics: dict = {}
    trainer._compute_advantage(_batch(store), metrics)
    for s, keys in sessions.items():
        for k, expected in zip(keys, EXPECTED[script_of[s]]):
            row = store.rows[k]
            mask = row["response_mask"].bool()
            assert row["advantages"].shape == mask.shape
            assert int(mask.sum()) > 0
            assert row["advantages"][mask].tolist() == pytest.approx([expected] * int(mask.sum()), abs=1e-6), k
            assert row["advantages"][~mask].abs().sum() == 0
            assert torch.equal(row["returns"], row["advantages"])
    assert metrics["gigpo/step_groups"] == 6.0
    assert metrics["gigpo/singleton_ratio"] == pytest.approx(2 / 6)

    # any other estimator is verl's own step: GRPO on each session's final row, broadcast (+-0.866 here)
    trainer.config.algorithm.adv_estimator = "grpo"           # the trainer's own copy of the config
    trainer._compute_advantage(_batch(store), {})
    for s, keys in sessions.items():
        sign = 1.0 if script_of[s] < 2 else -1.0
        for k in keys:
            mask = store.rows[k]["response_mask"].bool()
            assert torch.allclose(store.rows[k]["advantages"][mask], torch.full((int(mask.sum()),), sign * 0.866),
                                  atol=1e-3)


@pytest.mark.slow
async def test_chain_rows_get_a_clear_error(tmp_path, tiny_qwen, store):
    """Rows of the chain-mode loop carry no steps: the trainer names the loop GiGPO needs, writes nothing."""
    cfg, _ = await _rollout(tmp_path, tiny_qwen, "agentfly_chain")
    trainer = GiGPOTrainerSync(_gigpo_config(cfg))
    with pytest.raises(ConfigError, match="agentfly_step"):
        trainer._compute_advantage(_batch(store), {})
    assert not any("advantages" in row for row in store.rows.values())


def test_async_modes_keep_verls_behaviour(tiny_qwen):
    """gigpo_colocate_async is verl's colocate_async trainer (its async replay buffer, its settings)."""
    cfg = _gigpo_config(_config(tiny_qwen, n=2), "gigpo_colocate_async")
    trainer = get_trainer_cls("gigpo_colocate_async")(config=cfg)
    assert trainer.trainer_mode == "colocate_async"
    assert type(trainer.replay_buffer) is ReplayBufferAsync


def test_the_documented_overrides_compose():
    """The README's command-line keys compose with verl's own ppo_trainer config (hydra) and select the
    trainer main_ppo would build and GiGPO's options."""
    import verl
    from hydra import compose, initialize_config_dir

    from agentfly_gym_verl.gigpo import GiGPOOptions

    overrides = ["trainer.use_v1=true", "trainer.v1.trainer_mode=gigpo_sync", "algorithm.adv_estimator=gigpo",
                 "algorithm.gamma=0.95", "+algorithm.gigpo.step_advantage_w=0.5", "+algorithm.gigpo.mode=mean_norm",
                 "actor_rollout_ref.rollout.agent.default_agent_loop=agentfly_step"]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode) is GiGPOTrainerSync
    assert GiGPOOptions.from_config(cfg.algorithm) == GiGPOOptions(step_advantage_w=0.5, mode="mean_norm", gamma=0.95)
