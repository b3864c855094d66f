"""Self-play rows through verl 0.9.1's own V1 worker and trainer code, down to the GRPO advantages.

The harness of tests/test_verl_training.py (verl's ``AgentLoopWorkerTQ._run_prompt`` spawning the
``rollout.n`` sessions of a row and post-processing their rows, the V1 trainer's
``_compute_advantage``; stand-ins: a scripted inference server and an in-memory TransferQueue, see
that module's docstring) on one ``agentfly_selfplay`` data row with ``rollout.n = 2``: the two
sessions play one real game (Fool's mate, Black wins), and GRPO must score Black's rows above White's.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pettingzoo")
from test_verl_training import GLOBAL_STEPS, ScriptedServer, _config, _generate, _train_step, _worker, store  # noqa: E402,F401

FOOLS_MATE = [["I open.\nAction: f3", "Action: g4"], ["Action: e5", "Mate!\nAction: Qh4#"]]  # White, Black


def _prompt(worker, cfg, tmp_path, mode: str) -> dict:
    import pandas as pd
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentfly_gym_verl.selfplay import selfplay_rows

    path = tmp_path / f"selfplay-{mode}.parquet"
    pd.DataFrame(selfplay_rows(1, mode=mode)).to_parquet(path)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=worker.tokenizer, config=cfg.data, processor=None)
    row = dict(ds[0])
    row.pop("dummy_tensor", None)
    row.update(uid="uid0", global_steps=GLOBAL_STEPS)
    return row


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "step"])
async def test_selfplay_sessions_get_each_sides_reward_and_opposite_advantages(tmp_path, tiny_qwen, store, mode):
    cfg = _config(tiny_qwen, n=2)
    worker = _worker(cfg, None)
    worker.llm_client = ScriptedServer(worker.tokenizer, FOOLS_MATE)
    await _generate(worker, cfg, [_prompt(worker, cfg, tmp_path, mode)])
    assert store.status == {"uid0": "finished"}
    per_turn = 2 if mode == "step" else 1
    assert sorted(store.rows) == [f"uid0_{s}_{i}" for s in (0, 1) for i in range(per_turn)]
    # session 0 played White (lost), session 1 Black (won); each row carries its own side's reward
    for k, row in store.rows.items():
        assert float(row["rm_scores"].sum()) == (-1.0 if k.startswith("uid0_0_") else 1.0)
    batch, _ = _train_step(store, cfg, "grpo")
    for k in batch.keys:
        row = store.rows[k]
        mask = row["response_mask"].bool()
        adv = row["advantages"][mask]
        assert mask.any()
        expected = -0.7071 if k.startswith("uid0_0_") else 0.7071      # (r - mean) / std over the two sessions
        assert torch.allclose(adv, torch.full_like(adv, expected), atol=1e-3), (k, adv)
