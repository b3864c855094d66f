"""The vector env keeps Gymnasium 1.x's vector contract: compared side by side with Gymnasium's own
``SyncVectorEnv`` over the same real Chess environments (real Stockfish-free puzzles, Lichess sample)."""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import agentfly_gym  # noqa: F401
from agentfly_gym.envs.chess import ChessEnv
from agentfly_gym.utils.aio import run_sync

#: info values that name the env instance (a process-wide counter), not the episode's content
PER_INSTANCE = {"episode_id"}


def _same_structure(ours: dict, theirs: dict, path: str = "infos") -> None:
    """Same keys, masks and values; nested dicts (final_info) batched the same way."""
    assert set(ours) == set(theirs), (path, sorted(set(ours) ^ set(theirs)))
    for key, want in theirs.items():
        got = ours[key]
        if isinstance(want, dict):
            assert isinstance(got, dict), f"{path}[{key!r}] is {type(got).__name__}, Gymnasium gives a dict"
            _same_structure(got, want, f"{path}[{key!r}]")
            continue
        assert isinstance(got, np.ndarray) and got.shape == want.shape, (path, key, got, want)
        if key.startswith("_"):
            assert got.dtype == np.bool_ and got.tolist() == want.tolist(), (path, key, got, want)
        elif key not in PER_INSTANCE:
            mask = theirs[f"_{key}"]
            assert [g for g, m in zip(got.tolist(), mask) if m] == [w for w, m in zip(want.tolist(), mask) if m], \
                (path, key)

def test_same_step_final_info_is_a_dict_of_arrays_as_in_sync_vector_env():
    """Sub-env 0 plays a wrong move (its puzzle ends), sub-env 1 an invalid one (its puzzle goes on): the
    infos of both vector envs have the same keys, masks and values, and ``final_info`` indexes as Gymnasium's
    documentation shows: ``infos["final_info"]["won"][infos["_final_info"]]``."""
    ours = gymnasium.make_vec("agentfly/Chess-v0", num_envs=2,
                              autoreset_mode=AutoresetMode.SAME_STEP)
    theirs = SyncVectorEnv([lambda: ChessEnv() for _ in range(2)], autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        obs_a, info_a = ours.reset(seed=21)
        obs_b, info_b = theirs.reset(seed=21)
        assert tuple(obs_a) == tuple(obs_b)
        _same_structure(info_a, info_b)
        expert = run_sync(ours.envs[0].expert_action())
        actions = [next(a for a in info_a["admissible_actions"][0] if a != expert), "not a move"]
        obs_a, rew_a, term_a, trunc_a, info_a = ours.step(actions)
        obs_b, rew_b, term_b, trunc_b, info_b = theirs.step(actions)
        assert term_a.tolist() == term_b.tolist() == [True, False]
        assert rew_a.tolist() == rew_b.tolist()
        assert tuple(obs_a) == tuple(obs_b)
        assert isinstance(info_a["final_info"], dict)
        _same_structure(info_a, info_b)
        assert info_a["_final_info"].tolist() == [True, False]
        assert info_a["final_info"]["won"][info_a["_final_info"]].tolist() == [False]
        assert info_a["final_obs"][0] == info_b["final_obs"][0]
        assert info_a["final_obs"][1] is None
    finally:
        ours.close()
        theirs.close()

def test_partial_reset_returns_the_current_observations_of_the_others():
    """``reset(options={"reset_mask": ...})`` returns, for the sub-envs it does not reset, their current
    observation (Gymnasium's ``SyncVectorEnv`` does the same), and infos only for those it reset."""
    ours = gymnasium.make_vec("agentfly/Chess-v0", num_envs=2,
                              autoreset_mode=AutoresetMode.DISABLED)
    theirs = SyncVectorEnv([lambda: ChessEnv() for _ in range(2)], autoreset_mode=AutoresetMode.DISABLED)
    try:
        obs_a, info_a = ours.reset(seed=4)
        theirs.reset(seed=4)
        expert = run_sync(ours.envs[0].expert_action())
        actions = [next(a for a in info_a["admissible_actions"][0] if a != expert), "not a move"]
        stepped, *_ = ours.step(actions)
        theirs.step(actions)
        mask = np.array([True, False])
        obs_a, info_a = ours.reset(seed=[30, None], options={"reset_mask": mask})
        obs_b, info_b = theirs.reset(seed=[30, None], options={"reset_mask": mask.copy()})
        assert obs_a[1] == stepped[1] != ""
        assert tuple(obs_a) == tuple(obs_b)
        _same_structure(info_a, info_b)
        assert info_a["_task_id"].tolist() == [True, False]
    finally:
        ours.close()
        theirs.close()
