"""GiGPO as a verl 0.9.1 advantage estimator (``algorithm.adv_estimator=gigpo``).

Group-in-Group Policy Optimization (Feng et al., 2025, arXiv 2505.10978) gives every step row of
step mode two relative advantages and adds them (Eq. 8)::

    A(row) = A_episode(row) + step_advantage_w * A_step(row)

* episode level (Eq. 3): the row's episode return, normalised within its episode group (the rows
  of one dataset prompt, verl's ``uid``; the ``rollout.n`` trajectories of one task);
* step level (Eq. 6-7): rows of one episode group whose *anchor observation* (the observation
  the step acted on, recorded by :func:`agentfly_gym.rollout.step.run_step_episode`) is
  identical form a step group; the row's discounted return from that step on (Eq. 5,
  ``gamma`` = ``algorithm.gamma``) is normalised within the step group.

Normalisation follows verl-agent's reference implementation (``gigpo/core_gigpo.py``), quirks
included: ``mode="mean_std_norm"`` divides by the unbiased standard deviation plus ``epsilon``,
``mode="mean_norm"`` only subtracts the mean; an episode group of ONE row keeps its raw score
(mean 0, std 1, as verl's GRPO); a step group of one row gets a step advantage of 0 (its own
mean); episode statistics are taken over rows (``episode_stats="steps"``, verl-agent's default)
or over trajectories (``"trajectories"``, Eq. 3 as printed).

How the anchors reach the estimator.  verl's ``compute_advantage`` hands a registered estimator
``token_level_rewards``, ``response_mask``, ``config`` and ``index`` (the ``uid`` column) only.
GiGPO's groups are therefore carried IN the index: each entry is a :class:`StepKey` (hashable;
the episode group id plus trajectory id, step, anchor and step reward), built from the agent
loop's ``extra_fields`` by :func:`step_index`.  Given plain uids (no step data) the estimator
raises :class:`~agentfly_gym.errors.ConfigError` rather than silently training GRPO.

Selection: ``import agentfly_gym_verl.gigpo`` registers ``"gigpo"`` in verl's
``ADV_ESTIMATOR_REGISTRY``.  verl's V1 trainer does not pass ``extra_fields`` to the estimator; the
trainers of :mod:`agentfly_gym_verl.gigpo_trainer` do: in the trainer process set
``VERL_USE_EXTERNAL_MODULES=agentfly_gym_verl.gigpo_trainer`` (verl imports the listed modules when
it is imported), ``trainer.v1.trainer_mode=gigpo_sync`` and ``algorithm.adv_estimator=gigpo``.
Options: ``+algorithm.gigpo.step_advantage_w`` (float, default 1.0), ``+algorithm.gigpo.mode``
(``"mean_std_norm"`` default, or ``"mean_norm"``), ``+algorithm.gigpo.episode_stats``
(``"steps"`` default, or ``"trajectories"``), ``+algorithm.gigpo.epsilon`` (1e-6).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from agentfly_gym.errors import ConfigError

__all__ = ["StepKey", "GiGPOOptions", "step_index", "discounted_step_returns", "gigpo_scores",
           "step_group_stats", "compute_gigpo_advantage", "NAME"]

NAME = "gigpo"
MODES = ("mean_std_norm", "mean_norm")
EPISODE_STATS = ("steps", "trajectories")


@dataclasses.dataclass(frozen=True)
class StepKey:
    """One row's place in GiGPO's two groupings (an entry of verl's ``index`` array).

    Attributes:
        uid: the episode group (verl's ``uid``: one dataset prompt, ``rollout.n`` trajectories).
        trajectory_id: the trajectory the row belongs to.
        step: 0-based step of the row within its trajectory.
        anchor: the anchor observation (text) the step acted on.
        reward: the env reward of this step (not yet discounted).
    """

    uid: str
    trajectory_id: str
    step: int
    anchor: str
    reward: float


@dataclasses.dataclass(frozen=True)
class GiGPOOptions:
    """GiGPO's settings (``algorithm.gigpo.*``); see the module docstring."""

    step_advantage_w: float = 1.0
    mode: str = "mean_std_norm"
    episode_stats: str = "steps"
    epsilon: float = 1e-6
    gamma: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"algorithm.gigpo.mode={self.mode!r} is not one of {MODES}")
        if self.episode_stats not in EPISODE_STATS:
            raise ConfigError(f"algorithm.gigpo.episode_stats={self.episode_stats!r} is not one of {EPISODE_STATS}")
        for name in ("step_advantage_w", "epsilon", "gamma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"algorithm.gigpo.{name}={v!r} must be a finite number")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"algorithm.gamma={self.gamma!r} must lie in [0, 1] for GiGPO's step returns")

    @classmethod
    def from_config(cls, config: Any) -> GiGPOOptions:
        """From verl's algorithm config (``AlgoConfig`` or a ``DictConfig``; None gives the defaults)."""
        if config is None:
            return cls()
        sub = _get(config, "gigpo", None) or {}
        if hasattr(sub, "items") and not isinstance(sub, Mapping):
            from omegaconf import OmegaConf

            sub = OmegaConf.to_container(sub, resolve=True)
        if not isinstance(sub, Mapping):
            raise ConfigError(f"algorithm.gigpo must be a mapping, got {sub!r}")
        unknown = set(sub) - {"step_advantage_w", "mode", "episode_stats", "epsilon"}
        if unknown:
            raise ConfigError(f"unknown algorithm.gigpo keys {sorted(unknown)}; valid: step_advantage_w, mode, "
                              "episode_stats, epsilon")
        gamma = _get(config, "gamma", 1.0)
        return cls(gamma=float(1.0 if gamma is None else gamma), **{k: v for k, v in sub.items() if v is not None})


def _get(config: Any, key: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:  # noqa: BLE001, S110  (a dataclass config's get may reject unknown keys)
            pass
    return getattr(config, key, default)


def step_index(uids: Sequence[Any], extra_fields: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """verl's ``index`` array for GiGPO: one :class:`StepKey` per row.

    Args:
        uids: length-B episode group ids (verl's ``uid`` column).
        extra_fields: length-B ``extra_fields`` of the agent loop's step-mode rows
            (keys ``trajectory_id``, ``step``, ``anchor_obs``, ``step_reward``; see
            :data:`agentfly_gym_verl.agent_loop.EXTRA_FIELD_DEFAULTS`).

    Returns:
        numpy object array of shape (B,).

    Raises:
        ConfigError: lengths differ, or a row is not a step-mode row (``step`` < 0).
    """
    if len(uids) != len(extra_fields):
        raise ConfigError(f"{len(uids)} uids for {len(extra_fields)} extra_fields rows")
    out = np.empty(len(uids), dtype=object)
    for i, (uid, ef) in enumerate(zip(uids, extra_fields)):
        step = int(ef.get("step", -1))
        if step < 0:
            raise ConfigError(f"row {i} (trajectory {ef.get('trajectory_id')!r}, mode {ef.get('mode')!r}) is not a "
                              "step-mode row; GiGPO needs the agentfly_step agent loop")
        out[i] = StepKey(uid=str(uid), trajectory_id=str(ef["trajectory_id"]), step=step,
                         anchor=str(ef.get("anchor_obs", "")), reward=float(ef.get("step_reward", 0.0)))
    return out


def discounted_step_returns(keys: Sequence[StepKey], gamma: float) -> np.ndarray:
    """Per row, the discounted return from its step to the end of its trajectory (Eq. 5):
    ``R_t = r_t + gamma * R_{t+1}`` over the rows present of that trajectory, ordered by step.

    Returns:
        float64 array of shape (B,).

    Raises:
        ConfigError: two rows of one trajectory claim the same step.
    """
    by_traj: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        by_traj[(k.uid, k.trajectory_id)].append(i)
    out = np.zeros(len(keys), dtype=np.float64)
    for (_, traj), rows in by_traj.items():
        rows.sort(key=lambda i: keys[i].step)
        steps = [keys[i].step for i in rows]
        if len(set(steps)) != len(steps):
            raise ConfigError(f"trajectory {traj!r} has two rows for one step (steps {steps})")
        running = 0.0
        for i in reversed(rows):
            running = keys[i].reward + gamma * running
            out[i] = running
    return out


def _normalise(values: np.ndarray, groups: Sequence[Any], *, std: bool, epsilon: float,
               singleton_mean_zero: bool, stat_rows: Sequence[int] | None = None) -> np.ndarray:
    """Group-relative values: (v - mean_g) [/ (std_g + epsilon)], std unbiased (torch.std)."""
    members: dict[Any, list[int]] = defaultdict(list)
    for i in (range(len(values)) if stat_rows is None else stat_rows):
        members[groups[i]].append(i)
    stats: dict[Any, tuple[float, float]] = {}
    for g, rows in members.items():
        v = values[rows]
        if len(rows) == 1:
            stats[g] = (0.0, 1.0) if singleton_mean_zero else (float(v[0]), 1.0)
        else:
            stats[g] = (float(v.mean()), float(v.std(ddof=1)))
    out = np.empty(len(values), dtype=np.float64)
    for i, g in enumerate(groups):
        mean, sd = stats[g]
        out[i] = (values[i] - mean) / (sd + epsilon) if std else values[i] - mean
    return out


def gigpo_scores(episode_returns: Sequence[float], keys: Sequence[StepKey], options: GiGPOOptions = GiGPOOptions()
                 ) -> tuple[np.ndarray, dict[str, float]]:
    """GiGPO's per-row scalar advantage (Eq. 8) and step-group statistics.

    Args:
        episode_returns: length-B episode return of each row's trajectory (verl: the row's
            ``token_level_rewards`` summed).
        keys: length-B :class:`StepKey` (from :func:`step_index`).
        options: :class:`GiGPOOptions`.

    Returns:
        (advantages, stats): float64 array of shape (B,); stats has ``step_groups``,
        ``step_group_size_mean`` and ``singleton_ratio`` (share of step groups of one row).
    """
    scores = np.asarray(episode_returns, dtype=np.float64)
    if scores.shape != (len(keys),):
        raise ConfigError(f"{scores.shape} episode returns for {len(keys)} rows")
    std = options.mode == "mean_std_norm"
    uids = [k.uid for k in keys]
    stat_rows = None
    if options.episode_stats == "trajectories":  # one row per trajectory enters the statistics
        seen: dict[tuple[str, str], int] = {}
        for i, k in enumerate(keys):
            seen.setdefault((k.uid, k.trajectory_id), i)
        stat_rows = sorted(seen.values())
    episode = _normalise(scores, uids, std=std, epsilon=options.epsilon, singleton_mean_zero=True,
                         stat_rows=stat_rows)
    groups = [(k.uid, k.anchor) for k in keys]
    returns = discounted_step_returns(keys, options.gamma)
    step = _normalise(returns, groups, std=std, epsilon=options.epsilon, singleton_mean_zero=False)
    return episode + options.step_advantage_w * step, step_group_stats(keys)


def step_group_stats(keys: Sequence[StepKey]) -> dict[str, float]:
    """Statistics of GiGPO's step groups (rows of one ``uid`` with identical anchors).

    Returns:
        ``step_groups`` (count), ``step_group_size_mean`` (rows per group) and ``singleton_ratio``
        (share of groups of one row); all 0.0 for no rows.
    """
    sizes: dict[Any, int] = defaultdict(int)
    for k in keys:
        sizes[(k.uid, k.anchor)] += 1
    return {"step_groups": float(len(sizes)),
            "step_group_size_mean": float(np.mean(list(sizes.values()))) if sizes else 0.0,
            "singleton_ratio": float(np.mean([s == 1 for s in sizes.values()])) if sizes else 0.0}


@register_adv_est(NAME)
def compute_gigpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                            config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``"gigpo"`` (called by ``verl.trainer.ppo.ray_trainer.compute_advantage``).

    Args:
        token_level_rewards: (B, T) float; a row's episode return is its sum over T.
        response_mask: (B, T) 0/1.
        index: (B,) object array of :class:`StepKey` (:func:`step_index`).
        config: verl's algorithm config (``gamma``, ``gigpo.*``).
        **kwargs: other arguments verl passes (``reward_baselines``, ...), unused.

    Returns:
        (advantages, returns): both (B, T), the row's scalar GiGPO advantage on its response
        tokens, 0 elsewhere (verl's outcome estimators return the same tensor twice).

    Raises:
        ConfigError: ``index`` holds plain uids (no anchors), or a bad ``algorithm.gigpo`` option.
    """
    options = GiGPOOptions.from_config(config)
    keys = list(index)
    bad = next((k for k in keys if not isinstance(k, StepKey)), None)
    if bad is not None:
        raise ConfigError(
            f"GiGPO needs a StepKey per row in verl's index (uid column), got {type(bad).__name__} {bad!r}: build "
            "it from the step-mode rows' extra_fields with agentfly_gym_verl.gigpo.step_index(uids, extra_fields); in "
            "verl's V1 trainer set trainer.v1.trainer_mode=gigpo_sync (agentfly_gym_verl.gigpo_trainer) to do so")
    with torch.no_grad():
        episode_returns = token_level_rewards.sum(dim=-1).detach().cpu().double().numpy()
        scores, _ = gigpo_scores(episode_returns, keys, options)
        adv = torch.as_tensor(scores, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        adv = adv.unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)
    return adv, adv
