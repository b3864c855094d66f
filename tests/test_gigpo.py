"""GiGPO (plugins/verl/agentfly_gym_verl/gigpo.py) through verl 0.9.1's advantage-estimator registry.

Hand-computed batches check the formula (episode groups, step groups of identical anchors,
anchors seen once, ties, all-equal rewards, both normalisations); the last test plays real
step-mode rollouts (the plugin's agent loop on a real Chess puzzle) and runs their rows through
verl's own ``compute_advantage``.  The one stand-in there: verl's GPU server manager, replaced by a
server that replies with fixed moves (the tokens of a fixed text), so the anchors are known.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from verltools import trainer_config

ROOT = Path(__file__).resolve().parents[1]
try:
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
except ImportError as e:  # pragma: no cover
    pytest.skip(f"verl 0.9.1 cannot be imported ({e})", allow_module_level=True)

from agentfly_gym.errors import ConfigError
import agentfly_gym_verl
from agentfly_gym_verl.gigpo import (GiGPOOptions, StepKey, compute_gigpo_advantage, gigpo_scores,
                                     step_index)

PUZZLE = "tewjc"


def K(uid, traj, step, anchor, reward=0.0):
    return StepKey(uid=uid, trajectory_id=traj, step=step, anchor=anchor, reward=reward)


def _batch(returns, keys, lengths=None):
    """A verl batch: each row's return on its last response token, response mask of ``lengths`` ones."""
    lengths = lengths or [3] * len(keys)
    T = max(lengths) + 1
    mask = torch.zeros(len(keys), T)
    rewards = torch.zeros(len(keys), T)
    for i, (n, r) in enumerate(zip(lengths, returns)):
        mask[i, :n] = 1
        rewards[i, n - 1] = r
    idx = np.empty(len(keys), dtype=object)
    idx[:] = keys
    return rewards, mask, idx


def test_registered_and_hand_computed_mean_norm():
    """Two trajectories of one task; anchors shared, one anchor seen once, gamma 0.5, mean_norm."""
    assert get_adv_estimator_fn("gigpo") is compute_gigpo_advantage
    keys = [K("u", "A", 0, "s0", 0.0), K("u", "A", 1, "s1", 1.0),
            K("u", "B", 0, "s0", 0.0), K("u", "B", 1, "s2", 0.0), K("u", "B", 2, "s1", 0.0)]
    returns = [1.0, 1.0, 0.0, 0.0, 0.0]
    # episode: mean over rows 0.4 -> A +0.6, B -0.4; discounted returns A0 0.5, A1 1, B* 0
    # step groups: s0 {A0 .5, B0 0} -> +-.25; s1 {A1 1, B2 0} -> +-.5; s2 {B1} seen once -> 0
    expected = [0.85, 1.1, -0.65, -0.4, -0.9]
    rewards, mask, idx = _batch(returns, keys, lengths=[2, 3, 1, 4, 2])
    cfg = OmegaConf.create({"gamma": 0.5, "gigpo": {"mode": "mean_norm"}})
    adv, ret = compute_gigpo_advantage(rewards, mask, idx, config=cfg)
    assert torch.equal(adv, ret)
    for i, e in enumerate(expected):
        n = int(mask[i].sum())
        assert adv[i, :n].tolist() == pytest.approx([e] * n, abs=1e-6)
        assert adv[i, n:].abs().sum() == 0                        # nothing outside the response mask
    # Eq. 3 as printed: episode statistics over trajectories (mean 0.5)
    scores, stats = gigpo_scores(returns, keys, GiGPOOptions(gamma=0.5, mode="mean_norm", episode_stats="trajectories"))
    assert scores.tolist() == pytest.approx([0.75, 1.0, -0.75, -0.5, -1.0])
    assert stats == {"step_groups": 3.0, "step_group_size_mean": 5 / 3, "singleton_ratio": pytest.approx(1 / 3)}
    # the step weight scales only the step part
    scores, _ = gigpo_scores(returns, keys, GiGPOOptions(gamma=0.5, mode="mean_norm", step_advantage_w=0.0))
    assert scores.tolist() == pytest.approx([0.6, 0.6, -0.4, -0.4, -0.4])


def test_std_norm_singleton_episode_group_and_groups_kept_per_task():
    """mean_std_norm (unbiased std, as torch.std); a task with one row keeps its raw return (GRPO's rule);
    the same anchor text under another uid is another step group."""
    keys = [K("u", "A", 0, "s0", 1.0), K("u", "B", 0, "s0", 0.0), K("v", "C", 0, "s0", 3.0)]
    rewards, mask, idx = _batch([1.0, 0.0, 3.0], keys)
    adv, _ = compute_gigpo_advantage(rewards, mask, idx, config=AlgoConfig(gamma=1.0))
    s = 1 / (np.sqrt(0.5) + 1e-6) * 0.5                            # (1 - .5) / (std .7071 + eps)
    assert adv[:, 0].tolist() == pytest.approx([2 * s, -2 * s, 3.0 / (1 + 1e-6)], rel=1e-5)


def test_ties_loops_and_all_equal_rewards():
    """Tied returns inside a step group give step advantage 0; an anchor revisited within one trajectory
    joins its group twice; all-equal rewards give all-zero advantages in both modes."""
    keys = [K("u", "A", 0, "s0", 0.0), K("u", "A", 1, "s1", 0.0), K("u", "A", 2, "s0", 1.0),
            K("u", "B", 0, "s0", 1.0)]
    # returns gamma 1: A0 1, A1 1, A2 1, B0 1 -> every step group tied; episode returns 1 vs 1 -> tied
    for mode in ("mean_norm", "mean_std_norm"):
        scores, stats = gigpo_scores([1.0, 1.0, 1.0, 1.0], keys, GiGPOOptions(mode=mode))
        assert scores.tolist() == [0.0] * 4
        assert stats["step_groups"] == 2.0
    # episode tie broken, step tie kept: A returns 1, B returns 0 (B's step reward 0)
    keys[3] = K("u", "B", 0, "s0", 0.0)
    scores, _ = gigpo_scores([1.0, 1.0, 1.0, 0.0], keys, GiGPOOptions(mode="mean_norm"))
    # episode mean 0.75; s0 group {A0 1, A2 1, B0 0} mean 2/3; s1 {A1} seen once -> 0
    assert scores.tolist() == pytest.approx([0.25 + 1 / 3, 0.25, 0.25 + 1 / 3, -0.75 - 2 / 3])


def test_clear_errors():
    rewards, mask, _ = _batch([1.0, 0.0], [None, None])
    plain = np.array(["uid-0", "uid-0"], dtype=object)
    with pytest.raises(ConfigError, match="StepKey.*step_index"):
        compute_gigpo_advantage(rewards, mask, plain)
    idx = np.array([K("u", "A", 0, "s"), K("u", "B", 0, "s")], dtype=object)
    with pytest.raises(ConfigError, match="mode='std'"):
        compute_gigpo_advantage(rewards, mask, idx, config=OmegaConf.create({"gigpo": {"mode": "std"}}))
    with pytest.raises(ConfigError, match="unknown algorithm.gigpo keys \\['w'\\]"):
        compute_gigpo_advantage(rewards, mask, idx, config=OmegaConf.create({"gigpo": {"w": 1}}))
    with pytest.raises(ConfigError, match="two rows for one step"):
        gigpo_scores([1.0, 1.0], [K("u", "A", 0, "s"), K("u", "A", 0, "t")])
    with pytest.raises(ConfigError, match="not a step-mode row"):
        step_index(["u"], [{"trajectory_id": "A", "step": -1, "mode": "chain"}])


@pytest.mark.slow
def test_selectable_in_a_fresh_trainer_process():
    """verl's VERL_USE_EXTERNAL_MODULES hook imports the module; then 'gigpo' is in the registry."""
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="agentfly_gym_verl.gigpo",
               PYTHONPATH=os.pathsep.join([str(ROOT / "plugins" / "verl"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]))
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "print(get_adv_estimator_fn('gigpo').__module__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "agentfly_gym_verl.gigpo"


# ---------------------------------------------------------------------- a real rollout

class _FixedMoves:
    """Stands in for verl's GPU server manager: replies ``Action: <move>`` (the tokenizer's ids + <|im_end|>)
    with the k-th move at the k-th request of a trajectory."""

    def __init__(self, tokenizer, moves):
        from verl.workers.rollout.replica import TokenOutput

        self._out = TokenOutput
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = [tokenizer.encode(f"Action: {m}", add_special_tokens=False) + [eot] for m in moves]
        self.n = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        ids = self.replies[self.n % len(self.replies)][: int(sampling_params["max_tokens"])]
        self.n += 1
        return self._out(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@pytest.mark.slow
async def test_compute_advantage_on_real_step_rows(tmp_path, tiny_qwen):
    """Four step-mode rollouts of one Chess puzzle (rollout.n = 4), their AgentLoopOutputs turned into a
    batch as verl's V1 trainer does (``as_dict``: rm_scores, response_mask), then verl's compute_advantage
    and the V1 multi-trajectory entry with adv_estimator="gigpo"; advantages checked by hand."""
    import hydra
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentfly_gym_verl.dataset import build_dataset
    from agentfly_gym_verl.runtime import aclose

    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    cfg = trainer_config(4096, 64)
    path = build_dataset("Chess", [PUZZLE], None, tmp_path / "d.parquet", mode="step", max_turns=4,
                         env_kwargs={"mode": "puzzle"})
    row = dict(RLHFDataset(data_files=[str(path)], tokenizer=tok, config=cfg.data, processor=None)[0])
    row.pop("dummy_tensor", None)
    row["uid"] = "uid-0"
    entry = {e.name: e for e in OmegaConf.load(agentfly_gym_verl.config_path())}["agentfly_step"]
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    scripts = [["e5e3", "f6a1", "a8a1"], ["e5e3", "a8a1", "f6a1", "a8a1"], ["f6a1", "h7h5"], ["f6a1", "a8a1"]]
    sessions = []
    try:
        for moves in scripts:
            loop = hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=cfg),
                                           server_manager=_FixedMoves(tok, moves), tokenizer=tok, processor=None,
                                           hf_model_type="qwen2", dataset_cls=RLHFDataset,
                                           data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
            sessions.append(await loop.run(dict(sampling), **row))
    finally:
        await aclose()
    assert [len(s) for s in sessions] == [3, 4, 2, 4]
    assert [s[-1].reward_score for s in sessions] == [1.0, 1.0, 0.0, 0.0]
    assert not any(o.extra_fields["error"] for s in sessions for o in s)
    a = [[o.extra_fields["anchor_obs"] for o in s] for s in sessions]
    # the start position is every session's first anchor; the same moves lead to the same positions
    assert a[0][0] == a[1][0] == a[2][0] == a[3][0]
    assert a[0][1] == a[1][1]
    assert a[0][2] == a[1][3]
    assert a[2][1] == a[3][1] == a[3][3]
    distinct = {a[0][0], a[0][1], a[0][2], a[1][2], a[2][1], a[3][2]}
    assert len(distinct) == 6                                     # a[1][2] and a[3][2] are seen once

    outs = [o for s in sessions for o in s]
    fields = [o.as_dict() for o in outs]
    T = max(f["response_mask"].shape[0] for f in fields)
    mask = torch.zeros(len(outs), T, dtype=torch.int64)
    scores = torch.zeros(len(outs), T)
    for i, f in enumerate(fields):
        n = f["response_mask"].shape[0]
        mask[i, :n], scores[i, :n] = f["response_mask"], f["rm_scores"]
    keys = step_index(["uid-0"] * len(outs), [o.extra_fields for o in outs])
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": keys})
    algo = OmegaConf.create({"adv_estimator": "gigpo", "gamma": 0.5, "gigpo": {"mode": "mean_norm"}})
    got = compute_advantage(data, adv_estimator="gigpo", gamma=0.5, config=algo).batch["advantages"]

    # by hand: 13 rows, 7 of return 1 -> episode +6/13 (sessions 0, 1) or -7/13 (2, 3);
    # discounted step returns (gamma .5): s0 .25 .5 1; s1 .125 .25 .5 1; s2, s3 0
    # step groups: start {.25, .125, 0, 0} mean .09375; {s0[1] .5, s1[1] .25}; {s0[2] 1, s1[3] 1} tie;
    # {s2[1], s3[1], s3[3]} all 0; s1[2] and s3[2] seen once -> 0
    ep_win, ep_loss = 6 / 13, -7 / 13
    expected = [ep_win + .15625, ep_win + .125, ep_win,
                ep_win + .03125, ep_win - .125, ep_win, ep_win,
                ep_loss - .09375, ep_loss,
                ep_loss - .09375, ep_loss, ep_loss, ep_loss]
    for i in range(len(outs)):
        m = mask[i].bool()
        assert got[i][m].tolist() == pytest.approx([expected[i]] * int(m.sum()), abs=1e-6), i
        assert got[i][~m].abs().sum() == 0
    # the V1 trainer's entry (trainer.use_v1=true) delegates a non-GRPO estimator unchanged
    batch_keys = [f"uid-0_{s}_{k}" for s, sess in enumerate(sessions) for k in range(len(sess))]
    v1 = compute_advantage_for_multi_trajectories(data, batch_keys, "gigpo", gamma=0.5, config=algo)
    assert torch.allclose(v1.batch["advantages"], got)
