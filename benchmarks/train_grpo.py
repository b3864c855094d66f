"""GRPO through TRL on agentfly-gym environments (agentfly_gym.bridges.trl): the example and the benchmark.

Trains a causal LM with TRL's ``GRPOTrainer(rollout_func=AgentFlyRollout(...))``, rollouts sampled with the
weights being trained, and records per step: mean reward, success, KL, loss, grad norm, clipped ratio and
seconds per step (rollout and whole step), and the fraction of the attention query weights (every ``q_proj``)
that the step changed, to ``train_grpo.json`` and a plot ``train_grpo.png`` in ``--out`` (benchmarks/results by
default).

Precision: the weights stay float32 (the optimizer's master copy) on every device; on a GPU with bfloat16 the
forward and backward passes run in bf16 mixed precision (``bf16=True``, the Trainer's autocast, as TRL's and
transformers' documentation recommend for training).  Pure bf16 weights lose most small updates to rounding
(a bf16 weight of magnitude ``w`` ignores an update below about ``w / 512`` to ``w / 256``): three GRPO steps on a GPU
changed 15% of ``q_proj``'s elements that way.

    python benchmarks/train_grpo.py --steps 2                       # CPU, the bundled SmolLM2-135M
    python benchmarks/train_grpo.py --model Qwen/Qwen3-1.7B --device cuda --steps 50 --env ALFWorld-v0 \
        --num-generations 8 --tasks 64 --max-turns 10 --max-tokens 128     # a GPU run

Needs ``pip install 'agentfly-gym[trl]'``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental by TRL


def build_trainer(model: Any, tokenizer: Any, rollout: Any, train_dataset: Any, *, out_dir: str | Path,
                  steps: int, num_generations: int, learning_rate: float = 1e-5, beta: float = 0.04,
                  device: str = "cpu", callbacks: list | None = None, reward_funcs: list | None = None) -> Any:
    """A ``GRPOTrainer`` over ``train_dataset`` with ``rollout`` as its ``rollout_func``: one prompt (task) per
    step, ``num_generations`` episodes of it (a GRPO group), one optimizer step per generation batch; rewards
    ``reward_funcs`` (default: the bridge's ``env_return`` and ``env_success``)."""
    from trl import GRPOConfig, GRPOTrainer

    from agentfly_gym.bridges.trl import env_return, env_success

    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=num_generations,
        num_generations=num_generations, gradient_accumulation_steps=1, learning_rate=learning_rate, beta=beta,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=device == "cpu", bf16=_mixed_bf16(device),
        gradient_checkpointing=False, shuffle_dataset=False, temperature=1.0, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_funcs or [env_return, env_success],
                       train_dataset=train_dataset, rollout_func=rollout, args=args, callbacks=callbacks)


def _mixed_bf16(device: str) -> bool:
    """bf16 mixed precision (fp32 master weights) on a CUDA device that supports it; never on the CPU."""
    import torch

    return device != "cpu" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


class WeightChange:
    """Per optimizer step, the fraction of the watched weights' elements that the step changed (exactly: any
    bit).  Watched: every ``q_proj`` weight (the attention query projections; biases left out), else every
    2-D weight.  A snapshot of them is kept between ``begin`` and ``end`` (their size again, on their device)."""

    def __init__(self, model: Any) -> None:
        named = [(n, p) for n, p in model.named_parameters() if "q_proj" in n and n.endswith("weight") and p.requires_grad]
        self.params = [p for _, p in named] or [p for p in model.parameters() if p.dim() == 2 and p.requires_grad]
        self.before: list[Any] = []
        self.last: float | None = None

    def begin(self) -> None:
        self.before = [p.detach().clone() for p in self.params]

    def end(self) -> float | None:
        if not self.before:
            return None
        changed = sum(int((p.detach() != b).sum()) for p, b in zip(self.params, self.before))
        self.before = []
        self.last = changed / max(1, sum(p.numel() for p in self.params))
        return self.last


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="a model folder or hub name; smollm2: the bundled model")
    p.add_argument("--env", default="Chess-v0")
    p.add_argument("--tasks", type=int, default=8, help="data-set rows (tasks drawn from seeds 0..N-1)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--num-generations", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    C.setup_env_vars()
    res = C.Result("train_grpo", a)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from agentfly_gym.bridges.trl import AgentFlyRollout, task_dataset

    path = a.model
    if path == "smollm2":
        from agentfly_gym.rollout.models import smollm2_dir

        path = str(smollm2_dir())
    tokenizer = AutoTokenizer.from_pretrained(path)
    # float32 master weights everywhere (bf16 autocast on a GPU: see the module docstring)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if a.device != "cpu":
        model.to(a.device)
    watch = WeightChange(model)
    rollout = AgentFlyRollout(max_turns=a.max_turns, max_tokens=a.max_tokens, seed=a.seed)
    timing: dict[str, float] = {}

    def timed(prompts, trainer):  # the rollout's own time per step
        t0 = time.perf_counter()
        try:
            return rollout(prompts, trainer)
        finally:
            timing["rollout_s"] = time.perf_counter() - t0

    class Record(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []
            self.t0 = time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            watch.begin()

        def on_step_end(self, args, state, control, **kw):
            watch.end()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                now = time.perf_counter()
                self.steps.append({"step": state.global_step, "reward": logs.get("reward"),
                                   "success": logs.get("rewards/env_success/mean"), "kl": logs.get("kl"),
                                   "loss": logs.get("loss"), "grad_norm": logs.get("grad_norm"),
                                   "clipped_ratio": logs.get("completions/clipped_ratio"),
                                   "rollout_s": timing.get("rollout_s"), "step_s": now - self.t0,
                                   "q_proj_changed": watch.last})
                self.t0 = now

    rec = Record()
    steps = C.scaled(a.steps, a.scale)
    trainer = build_trainer(model, tokenizer, timed, task_dataset(a.env, n=max(a.tasks, steps), seed=a.seed),
                            out_dir=Path(a.out) / "train_grpo_trainer", steps=steps, num_generations=a.num_generations,
                            learning_rate=a.lr, beta=a.beta, device=a.device, callbacks=[rec])
    try:
        trainer.train()
    finally:
        rollout.close()
    res.data.update({"model": a.model, "env": a.env, "device": a.device, "weights_dtype": "float32",
                     "mixed_precision": "bf16" if _mixed_bf16(a.device) else None, "num_generations": a.num_generations,
                     "max_turns": a.max_turns, "max_tokens": a.max_tokens, "results": rec.steps})
    for s in rec.steps:
        print(json.dumps(s))

    def plot(res: C.Result) -> None:
        fig, axes = C.subplots(1, 3, figsize=(12, 3.2))
        xs = [s["step"] for s in rec.steps]
        for ax, key in zip(axes, ("reward", "kl", "step_s")):
            ax.plot(xs, [s[key] if s[key] is not None else math.nan for s in rec.steps], marker="o")
            ax.set_title(key)
            ax.set_xlabel("step")
        C.save_figure(res, fig)

    return C.finish(res, plot)


if __name__ == "__main__":
    sys.exit(main())
