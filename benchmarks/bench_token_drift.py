"""Re-tokenization drift on real trajectories: what naive decode + re-encode would change, and
a check that our stored ids ARE the sampled ids.

For every environment available, trajectories are rolled out in chain mode (the library's
runner) with (1) the bundled SmolLM2-135M-Instruct and (2) a tiny random Qwen2 on the Qwen3
tokenizer (so its ids are Qwen3 ids).  Every generation is recorded as the policy returned it;
then

* ours: each trajectory's mask-1 runs are compared with the recorded sampled ids (must be
  identical: 0 drifted trajectories, 0 changed tokens);
* naive: :func:`agentfly_gym.rollout.drift.measure_drift` (decode the whole chain and encode
  it again; decode each assistant turn and encode it again).

Paper (AgentFly): 36% of trajectories and 0.07% of tokens drifted.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import _common as C

ENVS = {"Chess": "agentfly/Chess-v0", "ScienceWorld": "agentfly/ScienceWorld-v0", "WebShop": "agentfly/WebShop-v0",
        "ALFWorld": "agentfly/ALFWorld-v0", "R2EGym": "agentfly/R2EGym-v0"}
ENV_KWARGS = {"agentfly/ScienceWorld-v0": {"max_instances": 2}, "agentfly/ALFWorld-v0": {"max_instances": 2},
              "agentfly/R2EGym-v0": {"max_instances": 2}}


class Recording:
    """Wraps a TextPolicy and keeps every generation's sampled ids, in call order per prompt."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.tokenizer = policy, policy.tokenizer
        self.generations: list[tuple[list[int], list[int]]] = []

    async def generate(self, prompt_ids, sampling):
        g = await self.policy.generate(prompt_ids, sampling)
        self.generations.append((list(prompt_ids), list(g.token_ids)))
        return g


def check_ours(trajs: list[Any], rec: Recording) -> dict[str, Any]:
    """For each trajectory: do its mask-1 runs equal the sampled ids of the generations whose prompt
    was its chain at that point?  Returns counts of trajectories/tokens that differ."""
    from agentfly_gym.rollout.drift import assistant_segments

    by_prompt: dict[tuple[int, ...], list[list[int]]] = {}
    for prompt, ids in rec.generations:
        by_prompt.setdefault(tuple(prompt), []).append(ids)
    bad_traj = bad_tok = tokens = checked = 0
    for t in trajs:
        if not t.prompt_ids:
            continue
        chain = list(t.prompt_ids) + list(t.response_ids)
        segs = assistant_segments(t.response_ids, t.response_mask)
        # the start of each mask-1 run within the chain
        starts, i = [], 0
        mask = t.response_mask
        while i < len(mask):
            if mask[i] == 1 and (i == 0 or mask[i - 1] == 0):
                starts.append(len(t.prompt_ids) + i)
            i += 1
        diff = 0
        for seg, s in zip(segs, starts):
            cands = by_prompt.get(tuple(chain[:s]), [])
            tokens += len(seg)
            if seg not in cands:
                diff += len(seg)
        checked += 1
        bad_traj += diff > 0
        bad_tok += diff
    return {"trajectories": checked, "trajectories_drifted": bad_traj, "tokens": tokens, "tokens_changed": bad_tok,
            "trajectory_share": bad_traj / checked if checked else 0.0, "token_share": bad_tok / tokens if tokens else 0.0}


def available(env_id: str) -> str | None:
    import gymnasium

    try:
        if env_id == "agentfly/R2EGym-v0":
            from agentfly_gym.envs.r2egym.local_tasks import default_tasks_dir

            if not (default_tasks_dir() / "tasks.jsonl").is_file():
                return "the local R2E-Gym task set is not built (agentfly-gym r2e build-tasks)"
        gymnasium.make(env_id, **ENV_KWARGS.get(env_id, {})).close()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


async def roll(model: str, env_ids: list[str], per_env: int, turns: int, max_tokens: int, seed: int) -> dict[str, Any]:
    from agentfly_gym.data.paths import resolve_data_dir
    from agentfly_gym.rollout import RolloutConfig, SamplingParams, run_rollouts
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.drift import measure_drift
    from agentfly_gym.rollout.models import smollm2_dir, tiny_qwen_dir
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    if model == "smollm2":
        policy = TransformersPolicy(smollm2_dir(), seed=seed, max_batch_size=16)
        chat = ChatTokenizer(policy.tokenizer)
    else:
        policy = TransformersPolicy(tiny_qwen_dir(resolve_data_dir("tokenizers") / "qwen3"), seed=seed,
                                    max_batch_size=16)
        chat = ChatTokenizer(policy.tokenizer, chat_template_kwargs={"enable_thinking": False})
    rec = Recording(policy)
    try:
        cfg = RolloutConfig(env_ids=env_ids, num_trajectories=per_env * len(env_ids), concurrency=16,
                            max_turns=turns, seed=seed, sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0),
                            env_kwargs={e: ENV_KWARGS.get(e, {}) for e in env_ids})
        result = await run_rollouts(cfg, rec, chat, progress=False)
    finally:
        await policy.aclose()
    trajs = result.trajectories
    out: dict[str, Any] = {"tokenizer": str(policy.tokenizer.name_or_path).rsplit("/", 1)[-1],
                           "errors": [t.error for t in trajs if t.error]}
    naive = measure_drift(trajs, policy.tokenizer)
    out["naive"] = {k: v for k, v in naive.items() if k != "per_trajectory"}
    out["ours"] = check_ours(trajs, rec)
    out["per_env"] = {}
    for e in env_ids:
        ts = [t for t in trajs if t.env_id == e]
        d = measure_drift(ts, policy.tokenizer)
        out["per_env"][e] = {"naive_chain": d["chain"], "naive_turn": d["turn"], "ours": check_ours(ts, rec),
                             "sampled_tokens": sum(t.num_sampled_tokens for t in ts)}
    return out


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default=",".join(ENVS))
    p.add_argument("--models", default="smollm2,tiny-qwen3")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    C.setup_env_vars()
    import agentfly_gym  # noqa: F401

    res = C.Result("bench_token_drift", args)
    tiny = args.scale == 0
    per_env = C.scaled(4, args.scale) if not tiny else 1
    turns = args.turns if not tiny else 2
    max_tokens = args.max_tokens if not tiny else 8
    names = [e.strip() for e in args.envs.split(",") if e.strip()]
    if tiny:
        names = [n for n in names if n == "Chess"] or names[:1]
    env_ids = []
    for n in names:
        why = available(ENVS[n]) if n in ENVS else f"unknown env; known {sorted(ENVS)}"
        if why:
            res.skip(n, why)
        else:
            env_ids.append(ENVS[n])
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if tiny:
        models = ["tiny-qwen3"]
    res.data["config"] = {"envs": env_ids, "trajectories_per_env": per_env, "max_turns": turns,
                          "max_tokens": max_tokens, "temperature": 1.0, "models": models}
    res.data["paper"] = {"trajectory_share": 0.36, "token_share": 0.0007}
    res.data["results"] = {}
    for model in models:
        print(f"[{model}] rolling out {per_env} trajectories on each of {env_ids}", flush=True)
        with C.skip_on_error(res, model, trace=False, prefix="") as guard:
            out = asyncio.run(roll(model, env_ids, per_env, turns, max_tokens, args.seed))
        if guard.failed:
            continue
        res.data["results"][model] = out
        nv, ours = out["naive"], out["ours"]
        print(f"  naive chain: {100 * nv['chain']['trajectory_share']:.0f}% trajectories, "
              f"{100 * nv['chain']['token_share']:.3f}% tokens; naive per turn: "
              f"{100 * nv['turn']['trajectory_share']:.0f}% trajectories, {100 * nv['turn']['token_share']:.2f}% "
              f"sampled tokens; ours: {ours['trajectories_drifted']} trajectories, {ours['tokens_changed']} tokens",
              flush=True)
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    data = res.data["results"]
    if not data:
        return
    fig, axes = C.subplots(1, 2, figsize=(11, 4.2))
    models = list(data)
    groups = [("naive: whole chain", lambda d: d["naive"]["chain"]), ("naive: each turn", lambda d: d["naive"]["turn"]),
              ("ours (stored ids)", lambda d: d["ours"])]
    colors = ["#d95f02", "#e6ab02", "#1b9e77"]
    w = 0.26
    for j, (label, get) in enumerate(groups):
        xs = [i + (j - 1) * w for i in range(len(models))]
        ts = [100 * get(data[m])["trajectory_share"] for m in models]
        ks = [100 * get(data[m])["token_share"] for m in models]
        axes[0].bar(xs, ts, w, label=label, color=colors[j])
        axes[1].bar(xs, ks, w, label=label, color=colors[j])
        for x, v in zip(xs, ts):
            axes[0].text(x, v + 1, f"{v:.0f}", ha="center", fontsize=7)
        for x, v in zip(xs, ks):
            axes[1].text(x, v * 1.02, f"{v:.2f}", ha="center", fontsize=7)
    axes[0].axhline(36, ls="--", color="grey", lw=1)
    axes[0].text(len(models) - 0.5, 37, "paper 36%", ha="right", fontsize=8, color="grey")
    axes[1].axhline(0.07, ls="--", color="grey", lw=1)
    axes[1].text(len(models) - 0.5, 0.075, "paper 0.07%", ha="right", fontsize=8, color="grey")
    axes[0].set_ylabel("% of trajectories that would change")
    axes[1].set_ylabel("% of tokens that would change")
    C.label_bars(axes, models)
    cfg = res.data["config"]
    fig.suptitle(f"Re-tokenization drift on real trajectories ({len(cfg['envs'])} envs, {cfg['trajectories_per_env']} "
                 f"per env, {cfg['max_turns']} turns, {cfg['max_tokens']} tokens/turn, T=1)", fontsize=10)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
