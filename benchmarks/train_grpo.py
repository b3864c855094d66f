"""GRPO through TRL on agentfly-gym environments (agentfly_gym.bridges.trl): the example and the benchmark.

Trains a causal LM with TRL's ``GRPOTrainer(rollout_func=AgentFlyRollout(...))``, rollouts sampled with the
weights being trained, and records per step: mean reward, success, KL, loss, grad norm, clipped ratio and
seconds per step (rollout and whole step) to ``train_grpo.json`` and a plot ``train_grpo.png``.

    python benchmarks/train_grpo.py --steps 2                       # CPU, the bundled SmolLM2-135M
    python benchmarks/train_grpo.py --model Qwen/Qwen3-1.7B --device cuda --steps 50 --env ALFWorld-v0 \
        --num-generations 8 --tasks 64 --max-turns 10 --max-tokens 128     # a GPU run

Needs ``pip install 'agentfly-gym[trl]'``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental by TRL


def build_trainer(model: Any, tokenizer: Any, rollout: Any, train_dataset: Any, *, out_dir: str | Path,
                  steps: int, num_generations: int, learning_rate: float = 1e-5, beta: float = 0.04,
                  device: str = "cpu", callbacks: list | None = None) -> Any:
    """A ``GRPOTrainer`` over ``train_dataset`` with ``rollout`` as its ``rollout_func``: one prompt (task) per
    step, ``num_generations`` episodes of it (a GRPO group), one optimizer step per generation batch."""
    from trl import GRPOConfig, GRPOTrainer

    from agentfly_gym.bridges.trl import env_return, env_success

    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=num_generations,
        num_generations=num_generations, gradient_accumulation_steps=1, learning_rate=learning_rate, beta=beta,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=device == "cpu", bf16=False,
        gradient_checkpointing=False, shuffle_dataset=False, temperature=1.0, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[env_return, env_success],
                       train_dataset=train_dataset, rollout_func=rollout, args=args, callbacks=callbacks)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a model folder or hub name; smollm2: the bundled model")
    ap.add_argument("--env", default="Chess-v0")
    ap.add_argument("--tasks", type=int, default=8, help="data-set rows (tasks drawn from seeds 0..N-1)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="runs/train_grpo")
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from agentfly_gym.bridges.trl import AgentFlyRollout, task_dataset

    path = a.model
    if path == "smollm2":
        from agentfly_gym.rollout.models import smollm2_dir

        path = str(smollm2_dir())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32 if a.device == "cpu" else torch.bfloat16)
    rollout = AgentFlyRollout(max_turns=a.max_turns, max_tokens=a.max_tokens, seed=0)
    timing: dict[str, float] = {}
    inner = rollout.__call__

    def timed(prompts, trainer):  # the rollout's own time per step
        t0 = time.perf_counter()
        try:
            return inner(prompts, trainer)
        finally:
            timing["rollout_s"] = time.perf_counter() - t0

    class Record(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []
            self.t0 = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                now = time.perf_counter()
                self.steps.append({"step": state.global_step, "reward": logs.get("reward"),
                                   "success": logs.get("rewards/env_success/mean"), "kl": logs.get("kl"),
                                   "loss": logs.get("loss"), "grad_norm": logs.get("grad_norm"),
                                   "clipped_ratio": logs.get("completions/clipped_ratio"),
                                   "rollout_s": timing.get("rollout_s"), "step_s": now - self.t0})
                self.t0 = now

    rec = Record()
    trainer = build_trainer(model, tokenizer, timed, task_dataset(a.env, n=a.tasks, seed=0), out_dir=a.out,
                            steps=a.steps, num_generations=a.num_generations, learning_rate=a.lr, beta=a.beta,
                            device=a.device, callbacks=[rec])
    try:
        trainer.train()
    finally:
        rollout.close()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": a.model, "env": a.env, "device": a.device, "num_generations": a.num_generations,
              "max_turns": a.max_turns, "max_tokens": a.max_tokens, "steps": rec.steps}
    (out / "train_grpo.json").write_text(json.dumps(result, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
        xs = [s["step"] for s in rec.steps]
        for ax, key in zip(axes, ("reward", "kl", "step_s")):
            ax.plot(xs, [s[key] if s[key] is not None else math.nan for s in rec.steps], marker="o")
            ax.set_title(key)
            ax.set_xlabel("step")
        fig.tight_layout()
        fig.savefig(out / "train_grpo.png", dpi=100)
    except ImportError:
        pass
    for s in rec.steps:
        print(json.dumps(s))
    return result


if __name__ == "__main__":
    main()
