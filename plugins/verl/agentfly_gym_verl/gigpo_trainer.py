"""GiGPO in a real verl 0.9.1 V1 training run: trainers that hand the estimator its step keys.

verl's V1 trainer (``trainer.use_v1=true``, the only trainer with step mode) computes advantages in
``PPOTrainer._compute_advantage`` (``verl/trainer/ppo/v1/trainer_base.py``): it reads only
``uid``, ``response_mask``, ``rm_scores`` and the log-prob/value columns from TransferQueue, so the
step keys GiGPO groups by (trajectory id, step, anchor observation, step reward) never reach the
estimator, and :func:`agentfly_gym_verl.gigpo.compute_gigpo_advantage` refuses plain uids.  Those
keys are stored already: the V1 agent-loop worker (``AgentLoopWorkerTQ._agent_loop_postprocess``
in ``verl/trainer/ppo/v1/agent_loop_tq.py``) puts each row's ``AgentLoopOutput.as_dict()``,
``extra_fields`` included, under the key ``{uid}_{session_id}_{index}``; verl's own trainer reads
that column back the same way for its validation and speculative-decoding metrics.

The trainers here, registered through verl's ``register_trainer``, are verl's ``sync``,
``colocate_async`` and ``separate_async`` trainers with one change: when
``algorithm.adv_estimator=gigpo`` their ``_compute_advantage`` also reads ``extra_fields``, turns
``uid`` into GiGPO's :class:`~agentfly_gym_verl.gigpo.StepKey` index
(:func:`~agentfly_gym_verl.gigpo.step_index`) and calls verl's ``compute_advantage`` directly;
every other step (KL in reward, rollout correction, writing ``advantages`` / ``returns`` back as
nested tensors) is verl 0.9.1's, in its order.  Any other estimator goes to verl's method unchanged.
The step logs ``gigpo/step_groups``, ``gigpo/step_group_size_mean`` and ``gigpo/singleton_ratio``.

Selection (trainer process)::

    VERL_USE_EXTERNAL_MODULES=agentfly_gym_verl.gigpo_trainer \\
    python -m verl.trainer.main_ppo trainer.use_v1=true trainer.v1.trainer_mode=gigpo_sync \\
        algorithm.adv_estimator=gigpo +algorithm.gigpo.step_advantage_w=1.0 \\
        actor_rollout_ref.rollout.agent.default_agent_loop=agentfly_step ...

``trainer.v1.trainer_mode`` is ``gigpo_sync``, ``gigpo_colocate_async`` or ``gigpo_separate_async``
(``TRAINER_MODES``).  verl also uses ``trainer_mode`` as a behaviour switch (``== "sync"`` picks
the replay buffer and refill rules, ``trainer.v1.<mode>`` holds the mode's settings), so each
trainer runs with a copy of the config whose ``trainer_mode`` is its base mode: ``gigpo_sync``
behaves as ``sync`` and reads ``trainer.v1.sync``.  Importing this module imports verl's V1
trainer (ray, transfer_queue) and registers the ``gigpo`` estimator too.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from omegaconf import open_dict
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from agentfly_gym.errors import ConfigError
from agentfly_gym_verl.gigpo import NAME, step_group_stats, step_index

__all__ = ["GiGPOAdvantageMixin", "GiGPOTrainerSync", "GiGPOTrainerColocateAsync", "GiGPOTrainerSeparateAsync",
           "TRAINER_MODES"]

#: Registered ``trainer.v1.trainer_mode`` names -> the verl mode each one behaves as.
TRAINER_MODES: dict[str, str] = {"gigpo_sync": "sync", "gigpo_colocate_async": "colocate_async",
                                 "gigpo_separate_async": "separate_async"}

_FIELDS = ["uid", "response_mask", "rm_scores", "extra_fields", "rollout_log_probs", "old_log_probs",
           "ref_log_prob", "values"]


def _rows(column: Any, n: int) -> list[Mapping[str, Any]]:
    """The ``extra_fields`` column read from TransferQueue (a ``NonTensorStack``) as n dicts."""
    if column is None:
        raise ConfigError("the batch has no extra_fields column: GiGPO needs step-mode rows from the agentfly_step "
                          "agent loop (actor_rollout_ref.rollout.agent.default_agent_loop=agentfly_step)")
    rows = column.tolist() if hasattr(column, "tolist") else list(column)
    if len(rows) != n or not all(isinstance(r, Mapping) for r in rows):
        raise ConfigError(f"extra_fields should hold {n} dicts, got {[type(r).__name__ for r in rows][:5]} "
                          f"({len(rows)} rows)")
    return rows


class GiGPOAdvantageMixin:
    """Put before a verl V1 trainer class: runs it as ``base_mode`` and feeds GiGPO its step keys.

    Attributes:
        base_mode: the verl ``trainer.v1.trainer_mode`` whose behaviour the trainer keeps.
    """

    base_mode: str = "sync"

    def __init__(self, config: Any) -> None:
        if config.trainer.v1.trainer_mode != self.base_mode:
            config = copy.deepcopy(config)  # the caller's config (the agent-loop manager's) stays as given
            with open_dict(config):
                config.trainer.v1.trainer_mode = self.base_mode
        super().__init__(config)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        """verl 0.9.1's ``PPOTrainer._compute_advantage`` with GiGPO's index in ``uid``.

        Args:
            batch: ``transfer_queue.KVBatchMeta`` of the step's rows (keys ``{uid}_{session}_{index}``).
            metrics: the step's metrics dict; gains ``gigpo/*`` entries.

        Returns:
            the ``KVBatchMeta`` verl's ``kv_batch_put`` returns after writing ``advantages`` and
            ``returns`` (nested, per response token).

        Raises:
            ConfigError: a row has no step-mode ``extra_fields`` (chain-mode rows, another agent loop).
        """
        algo = self.config.algorithm
        if algo.adv_estimator != NAME:
            return super()._compute_advantage(batch, metrics)
        tq = trainer_base.tq
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=_FIELDS)
        extra_fields = _rows(data.pop("extra_fields", None), len(batch))

        response_mask = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        keys = step_index(data.batch.pop("uid").tolist(), extra_fields)
        data.non_tensor_batch["uid"] = keys
        metrics.update({f"gigpo/{k}": v for k, v in step_group_stats(keys).items()})

        if algo.use_kl_in_reward:
            data, kl_metrics = trainer_base.apply_kl_penalty(data, kl_ctrl=self.kl_ctrl_in_reward,
                                                             kl_penalty=algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        rollout_corr_config = algo.get("rollout_correction", None)
        bypass = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass
        if rollout_correction:
            data, is_metrics = trainer_base.compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
            metrics.update(is_metrics)

        # verl's V1 entry (compute_advantage_for_multi_trajectories) hands any non-GRPO estimator to
        # compute_advantage unchanged; called directly so that the StepKey index is what it receives.
        data = compute_advantage(data, adv_estimator=algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                                 num_repeat=self.config.actor_rollout_ref.rollout.n,
                                 norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True), config=algo)

        fields = ["advantages", "returns"]
        if algo.use_kl_in_reward:
            fields.append("token_level_rewards")
        if rollout_correction:
            fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                fields.append("rollout_is_weights")
        output = TensorDict({f: trainer_base.response_to_nested(data.batch[f], response_mask) for f in fields},
                            batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


@register_trainer("gigpo_sync")
class GiGPOTrainerSync(GiGPOAdvantageMixin, PPOTrainerSync):
    """verl's ``sync`` V1 trainer with GiGPO's step keys (``trainer.v1.trainer_mode=gigpo_sync``)."""

    base_mode = "sync"


@register_trainer("gigpo_colocate_async")
class GiGPOTrainerColocateAsync(GiGPOAdvantageMixin, PPOTrainerColocateAsync):
    """verl's ``colocate_async`` V1 trainer with GiGPO's step keys."""

    base_mode = "colocate_async"


@register_trainer("gigpo_separate_async")
class GiGPOTrainerSeparateAsync(GiGPOAdvantageMixin, PPOTrainerSeparateAsync):
    """verl's ``separate_async`` V1 trainer with GiGPO's step keys."""

    base_mode = "separate_async"

