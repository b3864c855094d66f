"""Tokens against the trainer: the log-probs stored with each rollout against a plain transformers forward pass
of the very same weights, per environment and mode (chain, step).

A trainer (PPO/GRPO) recomputes the log-probs of the stored token ids with its own forward pass and takes the
ratio with the stored ones; if the ids, the response mask or the log-probs were off (a re-tokenized reply, a
shifted mask, a log-prob of the wrong position or temperature) the ratio would be wrong from the first step.
Here every trajectory is rolled out with :meth:`TransformersPolicy.from_model` on a model object, and then
that same object scores each stored sequence (``prompt_ids + response_ids`` in chain mode; each step row's
``prompt_ids + response_ids`` in step mode) in one forward pass: the log-prob of token ``t`` at position ``p``
is ``log_softmax(logits[p - 1] / T)[t]``.  Reported per (env, mode): the trajectories and sampled (mask-1)
tokens compared, the max and mean absolute gap in nats, and, to show the check has teeth, the median gap when
the forward pass is read one position off (``shift_gap_median``: an off-by-one mask or id shift).

Models: the bundled SmolLM2-135M-Instruct (default) and a tiny random Qwen2 on the Qwen3 tokenizer
(``--models tiny-qwen3``; ``--scale 0`` uses it alone, on Chess).  Sampling at temperature 1.0.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any

import _common as C

ENVS = {"Chess": "agentfly/Chess-v0", "ALFWorld": "agentfly/ALFWorld-v0", "ScienceWorld": "agentfly/ScienceWorld-v0",
        "WebShop": "agentfly/WebShop-v0"}
ENV_KWARGS = {"agentfly/ScienceWorld-v0": {"max_instances": 1}, "agentfly/ALFWorld-v0": {"max_instances": 2}}
MODES = ("chain", "step")


def load_model(name: str) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, chat)`` of ``"smollm2"`` or ``"tiny-qwen3"`` (float32, CPU, eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentfly_gym.data.paths import resolve_data_dir
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir, tiny_qwen_dir

    if name == "smollm2":
        path, kw = smollm2_dir(), {}
    elif name == "tiny-qwen3":
        path, kw = tiny_qwen_dir(resolve_data_dir("tokenizers") / "qwen3"), {"enable_thinking": False}
    else:
        raise ValueError(f"unknown model {name!r}; known: smollm2, tiny-qwen3")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tok, ChatTokenizer(tok, chat_template_kwargs=kw)


def sequences(traj: Any) -> list[tuple[list[int], list[int], list[int], list[float]]]:
    """The ``(prompt_ids, response_ids, response_mask, response_logprobs)`` a trainer scores: the chain of a
    chain-mode trajectory, or each step row of a step-mode one."""
    rows = traj.steps if traj.mode == "step" else [traj]
    return [(list(r.prompt_ids), list(r.response_ids), list(r.response_mask), list(r.response_logprobs))
            for r in rows if r.response_ids]


def score(model: Any, seqs: list[tuple[list[int], list[int], list[int], list[float]]],
          temperature: float = 1.0) -> dict[str, Any]:
    """Compare stored log-probs with one forward pass per sequence.

    Returns:
        ``{"sequences", "tokens" (mask-1 tokens compared), "max_gap", "mean_gap" (nats), "shift_gap_median"
        (nats, the forward pass read one position late), "nonfinite" (stored mask-1 log-probs that are NaN/inf),
        "mask_len_mismatch" (sequences whose mask or log-probs differ in length from the ids)}``.
    """
    import torch

    gaps: list[float] = []
    shifted: list[float] = []
    nonfinite = mismatch = 0
    for prompt, resp, mask, lps in seqs:
        if not (len(resp) == len(mask) == len(lps)):
            mismatch += 1
            continue
        ids = prompt + resp
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits[:-1] / temperature, -1)
        fwd = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()  # fwd[p - 1]: log-prob of ids[p]
        for j, (m, lp) in enumerate(zip(mask, lps)):
            if m != 1:
                continue
            if lp is None or not math.isfinite(lp):
                nonfinite += 1
                continue
            p = len(prompt) + j
            gaps.append(abs(lp - fwd[p - 1]))
            if p < len(fwd):
                shifted.append(abs(lp - fwd[p]))
    return {"sequences": len(seqs), "tokens": len(gaps), "max_gap": max(gaps) if gaps else None,
            "mean_gap": sum(gaps) / len(gaps) if gaps else None, "shift_gap_median": C.median(shifted),
            "nonfinite": nonfinite, "mask_len_mismatch": mismatch}


async def measure(model: Any, tok: Any, chat: Any, env_id: str, mode: str, *, episodes: int, turns: int,
                  max_tokens: int, seed: int, temperature: float = 1.0) -> dict[str, Any]:
    """Roll out ``episodes`` episodes of ``env_id`` in ``mode`` with ``model`` and score them (see :func:`score`);
    adds ``trajectories``, ``errors``, ``rollout_s`` and ``records`` (the scored sequences, see :func:`sequences`;
    :func:`main` drops them from the JSON)."""
    import time

    from agentfly_gym.rollout import SamplingParams, TaskRunner
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy.from_model(model, tok, seed=seed, max_batch_size=8)
    t0 = time.monotonic()
    try:
        async with TaskRunner(policy, chat, mode=mode, concurrency=4, max_turns=turns,
                              sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature),
                              env_kwargs={env_id: ENV_KWARGS.get(env_id, {})}) as runner:
            trajs = await runner.aplay([(env_id, None, seed + i) for i in range(episodes)])
    finally:
        await policy.aclose()
    rollout_s = time.monotonic() - t0
    seqs = [s for t in trajs for s in sequences(t)]
    out = await asyncio.to_thread(score, model, seqs, temperature)
    out.update(trajectories=len(trajs), errors=[t.error for t in trajs if t.error], rollout_s=rollout_s, records=seqs)
    return out


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default=",".join(ENVS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--models", default="smollm2")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args()
    C.setup_env_vars()
    import torch

    import agentfly_gym  # noqa: F401

    torch.manual_seed(args.seed)
    res = C.Result("bench_trainer_gap", args)
    tiny = args.scale == 0
    episodes = 1 if tiny else C.scaled(2, args.scale)
    turns, max_tokens = (2, 8) if tiny else (args.turns, args.max_tokens)
    names = [e.strip() for e in args.envs.split(",") if e.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    models = ["tiny-qwen3"] if tiny else [m.strip() for m in args.models.split(",") if m.strip()]
    if tiny:
        names = [n for n in names if n == "Chess"] or names[:1]
    res.data["config"] = {"envs": names, "modes": modes, "models": models, "episodes": episodes, "max_turns": turns,
                          "max_tokens": max_tokens, "temperature": 1.0}
    res.data["results"] = {}
    for name in models:
        model, tok, chat = load_model(name)
        for env in names:
            if env not in ENVS:
                res.skip(f"{name}/{env}", f"unknown env; known {sorted(ENVS)}")
                continue
            for mode in modes:
                key = f"{name}/{env}/{mode}"
                with C.skip_on_error(res, key, trace=False) as guard:
                    r = asyncio.run(measure(model, tok, chat, ENVS[env], mode, episodes=episodes, turns=turns,
                                            max_tokens=max_tokens, seed=args.seed))
                if guard.failed:
                    continue
                r.pop("records")
                res.data["results"][key] = r
                print(f"[{key}] {r['tokens']} tokens in {r['sequences']} sequences: max gap {r['max_gap']:.2e} nats, "
                      f"mean {r['mean_gap']:.2e}; shifted by one: median {r['shift_gap_median']:.2f} nats", flush=True)
    gaps = [r["max_gap"] for r in res.data["results"].values() if r["max_gap"] is not None]
    res.data["max_gap"] = max(gaps) if gaps else None
    print(f"[bench_trainer_gap] max gap over all: {res.data['max_gap']}", flush=True)
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    data = res.data["results"]
    if not data:
        return
    keys = list(data)
    fig, ax = C.subplots(figsize=(max(6.0, 0.9 * len(keys) + 2), 4.2))
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], [max(data[k]["max_gap"] or 0, 1e-9) for k in keys], 0.4, label="max gap (stored)",
           color="#1b9e77")
    ax.bar([x + 0.2 for x in xs], [max(data[k]["shift_gap_median"] or 0, 1e-9) for k in keys], 0.4,
           label="median gap, read one position off", color="#d95f02")
    ax.set_yscale("log")
    ax.set_ylabel("|stored - forward| log-prob (nats)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([k.replace("/", "\n", 1) for k in keys], fontsize=7)
    ax.legend(fontsize=8)
    fig.suptitle("Stored rollout log-probs against a forward pass of the same weights (T=1)", fontsize=10)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
