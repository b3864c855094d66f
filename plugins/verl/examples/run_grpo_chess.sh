#!/usr/bin/env bash
# GRPO on Chess puzzles with verl 0.9.1 (agentfly-gym verl plugin) on ONE GPU with Qwen/Qwen3-0.6B and vLLM.
# NOT RUN by the agentfly-gym developers (no GPU where it was written); the config keys were checked
# against verl 0.9.1's trainer config (hydra compose of the overrides below).
#
#   MODE=chain bash plugins/verl/examples/run_grpo_chess.sh     # one training row per trajectory
#   MODE=step  bash plugins/verl/examples/run_grpo_chess.sh     # one row per env step (V1 trainer)
#
# Needs: pip install 'agentfly-gym[verl]' vllm (a vLLM build matching your torch/CUDA) and the model weights.
# No data folder: the 300-puzzle Lichess sample ships in the package (`agentfly-gym data download chess` gets the
# full database, which the env then prefers). PREPARE_ONLY=1 writes and checks the two data sets, then stops.
set -euo pipefail

MODE=${MODE:-chain}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
DATA=${DATA:-$HOME/data/agentfly_chess_$MODE}
N_TRAIN=${N_TRAIN:-1024}
N_VAL=${N_VAL:-64}
MAX_TURNS=${MAX_TURNS:-4}

YAML=$(python -c "import agentfly_gym_verl; print(agentfly_gym_verl.config_path())")
ENV_KWARGS='{"mode": "puzzle", "max_rating": 1600}'
# Two data sets, because verl trains on one file and validates on another: the train split and the validation
# split of the puzzles share no puzzle (a hash of the puzzle id), and `dataset check` proves it (exit 1 if not).
build() {  # build <out> <n> <split>
  python -m agentfly_gym dataset Chess -o "$1" -n "$2" --split "$3" --mode "$MODE" --max-turns "$MAX_TURNS" \
    --env-kwargs "$ENV_KWARGS" --overwrite
}
mkdir -p "$DATA"
build "$DATA/train.parquet" "$N_TRAIN" train
build "$DATA/val.parquet" "$N_VAL" validation
python -m agentfly_gym dataset check "$DATA/train.parquet" "$DATA/val.parquet"
if [ "${PREPARE_ONLY:-0}" = 1 ]; then exit 0; fi

python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=false \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/val.parquet" \
  data.train_batch_size=32 \
  data.max_prompt_length=2048 \
  data.max_response_length=4096 \
  data.filter_overlong_prompts=false \
  +data.apply_chat_template_kwargs.enable_thinking=false \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.agent.num_workers=4 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$YAML" \
  actor_rollout_ref.rollout.agent.default_agent_loop="agentfly_$MODE" \
  trainer.use_v1=true \
  trainer.n_gpus_per_node=1 \
  trainer.nnodes=1 \
  trainer.logger='["console"]' \
  trainer.project_name=agentfly-gym \
  trainer.experiment_name="chess-grpo-$MODE" \
  trainer.val_before_train=true \
  trainer.test_freq=10 \
  trainer.save_freq=-1 \
  trainer.total_epochs=1 "$@"
