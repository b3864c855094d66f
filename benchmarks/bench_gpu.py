"""Generation at GPU speed: TransformersPolicy against plain ``model.generate``, async against lockstep with real
generation, peak memory, KV reuse and the logprob gap to a trainer's forward pass.

The model is built from a real family's configuration with random weights (Qwen3-0.6B's shape, bf16 on the GPU)
and the shipped Qwen3 tokenizer (``tests/data/tokenizers/qwen3``): nothing is downloaded.  Parts:

  generate     tokens/s of the policy (``TransformersPolicy.from_model``: one request per row, sampled at T=1)
               against ``model.generate(do_sample=True)`` on the same rows, prompt length and new tokens, at
               64 and 256 rows; peak GPU memory of each (``torch.cuda.max_memory_allocated``).  The policy runs
               with ``prefix_cache_bytes=0`` here (one turn: nothing to reuse).  Goal: >= 3x generate at 64 rows.
  engine       transformers' own continuous batching (``model.generate_batch``, paged KV cache,
               ``return_logprobs``) on the same rows, for reference: it serves one sampling configuration and one
               random stream for the whole batch (no per-request seed, no greedy/sampled mix) and reports the
               logprob after top-k/top-p truncation, so the policy does not use it (see the policy's docstring).
  schedule     async (``run_rollouts``, every trajectory its own task, B in flight) against lockstep (waves of B
               trajectories, every turn waiting for all live ones before generating, as a synchronous batch loop
               does) through the same policy and ``run_rollouts`` code, on a bench env whose episode lengths
               follow a profile: ``uniform`` (every trajectory the same turns, no tool time) and ``heavy_tailed``
               (R2E-Gym's turn counts, compressed to ``--max-turns``, and its tool-call durations, from
               ``bench_trace_rollout.make_profiles()['r2e']`` times ``--time-scale``).  Goals: >= 1.0x, >= 1.5x.
  reuse        prefill tokens per turn of the uniform async run with KV reuse, against the prompt tokens a
               policy without reuse prefills (the same run's prompt lengths), and the wall time without reuse.
  logprobs     the stored (bf16) logprobs against a trainer's forward pass of the same bf16 weights and of an
               fp32 copy: max and mean absolute gap (nats), and the off-by-one control (reading the position
               next to the right one) that shows what a real misalignment looks like.

``--smoke`` runs every part but ``engine`` tiny (a 2-layer model of the same family, a few rows) on the CPU: the
smoke test's run, not a measurement.

Run on one GPU with no network (a session lent the device machine: Python 3.12, torch and transformers there;
gymnasium and chess carried as wheels).  Build the wheels here, into the git-ignored ``dist/gpu-wheels``::

    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d dist/gpu-wheels gymnasium==1.4.0 farama-notifications==0.0.6 \\
        trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
    python -m pip wheel --no-deps -w dist/gpu-wheels chess==1.11.2

then one device call (the ``run`` tool, ``carry=["dist/gpu-wheels"]``, ``timeout_s=540``); the wheels are pure
Python, unpacked with the standard library (no pip, no index, no install into the machine's Python)::

    for w in dist/gpu-wheels/*.whl; do python -m zipfile -e "$w" /tmp/wh; done && \\
    PYTHONPATH=$PWD:/tmp/wh python benchmarks/bench_gpu.py --out $OUT

and commit the returned ``bench_gpu.json``/``.png`` under ``benchmarks/results/``.  The JSON's ``summary`` holds
``gpu`` (the device's name), ``ours_over_generate`` (64 rows, sampled), ``async_over_lockstep``
(``uniform``, ``heavy_tailed``) and the memory ratio.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import _common as C  # noqa: E402

from agentfly_gym.envs.base import AgentFlyEnv  # noqa: E402

ENV_ID = "agentfly/GpuBenchTurns-v0"
TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "tokenizers" / "qwen3"
#: Qwen3-0.6B's configuration (its config.json), random weights
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, vocab_size=151936)
TINY = dict(QWEN3_06B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


# ----------------------------------------------------------------------------- the bench env
class Wave:
    """Lockstep's turn barrier: a generation starts only when every live trajectory of the wave asked for one."""

    def __init__(self, live: int) -> None:
        self.live, self.arrived, self.turn = live, 0, 0
        self.cond = asyncio.Condition()

    def _release(self) -> None:
        if self.arrived and self.arrived >= self.live:
            self.arrived, self.turn = 0, self.turn + 1
            self.cond.notify_all()

    async def arrive(self) -> None:
        async with self.cond:
            turn = self.turn
            self.arrived += 1
            self._release()
            await self.cond.wait_for(lambda: self.turn != turn)

    async def leave(self) -> None:
        async with self.cond:
            self.live -= 1
            self._release()


WAVE: dict[str, Wave | None] = {"now": None}  # the running lockstep wave (None: async)


class TurnsEnv(AgentFlyEnv):
    """An episode of a drawn number of turns, each with a drawn tool-call time (``profile``: ``uniform`` or
    ``heavy_tailed``); the action is ignored.  Terminates after its turns (telling the lockstep wave)."""

    env_name = "GpuBenchTurns"

    def __init__(self, *, profile: str = "uniform", turns: int = 4, time_scale: float = 0.02, **kwargs: Any):
        super().__init__(**kwargs)
        self.profile, self.turns, self.time_scale = profile, turns, time_scale
        self._plan: tuple[int, list[float]] = (0, [])
        self._t = 0

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._plan = plan(self.profile, int(seed or 0), self.turns, self.time_scale)
        self._t = 0
        return await super().areset(seed=seed, options=options)

    async def _reset_episode(self, scope, options):
        self._task_id = f"turns-{self._plan[0]}"
        return "Answer with one move.", {}

    async def _step_episode(self, action: str):
        tool = self._plan[1][self._t]
        if tool > 0:
            await asyncio.sleep(tool)  # a tool call that waits on something else (a container, a simulator)
        self._t += 1
        done = self._t >= self._plan[0]
        if done and WAVE["now"] is not None:
            await WAVE["now"].leave()
        return f"Observation {self._t}: fine.", float(done), done, False, {"won": done, "score": float(done)}


def plan(profile: str, seed: int, turns: int, time_scale: float) -> tuple[int, list[float]]:
    """``(turn count, tool seconds per turn)`` of trajectory ``seed``: uniform is ``turns`` turns and no tool
    time; heavy_tailed draws R2E-Gym's trace (turns out of 100 scaled to ``turns``, tool seconds times
    ``time_scale``)."""
    if profile == "uniform":
        return turns, [0.0] * turns
    from bench_trace_rollout import make_profiles

    r2e = make_profiles()["r2e"]
    tr = r2e.trace(seed)
    n = max(1, min(turns, round(tr["turns"] * turns / r2e.max_turns)))
    return n, [s * time_scale for s in tr["tool_s"][:n]]


class LockstepPolicy:
    """The policy behind the turn barrier of the running wave."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.tokenizer = inner, inner.tokenizer

    async def generate(self, prompt_ids, sampling):
        await WAVE["now"].arrive()
        return await self.inner.generate(prompt_ids, sampling)


# ----------------------------------------------------------------------------- helpers
def build_model(cfg: dict[str, Any], device: str, dtype: Any, seed: int):
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3Config(**cfg, eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None


def random_prompts(rows: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(200, 150000) for _ in range(length)] for _ in range(rows)]


# ----------------------------------------------------------------------------- parts
def part_generate(model, tok, device: str, rows: int, prompt_len: int, new: int, seed: int) -> dict[str, Any]:
    import torch

    from agentfly_gym.rollout.policies.base import SamplingParams
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    prompts = random_prompts(rows, prompt_len, seed)
    ids = torch.tensor(prompts, device=device)
    out: dict[str, Any] = {"rows": rows, "prompt_tokens": prompt_len, "new_tokens": new}
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                           top_p=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=tok.pad_token_id)
    sync(device)
    wall = time.perf_counter() - t0
    out["generate"] = {"wall_s": wall, "tokens": int((g.shape[1] - prompt_len) * rows),
                       "tokens_per_s": (g.shape[1] - prompt_len) * rows / wall, "peak_bytes": peak(device)}
    del g
    policy = TransformersPolicy.from_model(model, tok, max_batch_size=rows, batch_wait_s=0.05, seed=seed,
                                           prefix_cache_bytes=0)
    s = SamplingParams(max_tokens=new, temperature=1.0)

    async def go():
        return await asyncio.gather(*(policy.generate(p, s) for p in prompts))

    try:
        reset_peak(device)
        t0 = time.perf_counter()
        gens = asyncio.run(go())
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        policy.close()
    n = sum(len(x.token_ids) for x in gens)
    out["ours"] = {"wall_s": wall, "tokens": n, "tokens_per_s": n / wall, "peak_bytes": peak(device),
                   "forward_passes": policy.num_forward_passes, "prefills": policy.num_batches}
    out["ours_over_generate"] = out["ours"]["tokens_per_s"] / out["generate"]["tokens_per_s"]
    if out["generate"]["peak_bytes"]:
        out["memory_over_generate"] = out["ours"]["peak_bytes"] / out["generate"]["peak_bytes"]
    return out


def part_engine(model, tok, device: str, rows: int, prompt_len: int, new: int, seed: int) -> dict[str, Any]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    prompts = random_prompts(rows, prompt_len, seed)
    gc = GenerationConfig(max_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          eos_token_id=-1, pad_token_id=tok.pad_token_id)
    cbc = ContinuousBatchingConfig(return_logprobs=True, seed=seed)
    prev = model.config._attn_implementation
    model.set_attn_implementation("paged|sdpa")
    try:
        reset_peak(device)
        t0 = time.perf_counter()
        outs = model.generate_batch(prompts, generation_config=gc, continuous_batching_config=cbc,
                                    progress_bar=False, warmup=False)
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        model.set_attn_implementation(prev)
    n = sum(len(o.generated_tokens) for o in outs.values())
    return {"rows": rows, "wall_s": wall, "tokens": n, "tokens_per_s": n / wall, "peak_bytes": peak(device),
            "logprobs_returned": all(o.logprobs for o in outs.values())}


async def _rollouts(policy, chat, n: int, b: int, seed: int, env_kwargs: dict[str, Any], max_turns: int,
                    max_tokens: int, lockstep: bool) -> float:
    from agentfly_gym.rollout.policies.base import SamplingParams
    from agentfly_gym.rollout.runner import RolloutConfig, run_rollouts

    def config(num: int, s: int) -> RolloutConfig:
        return RolloutConfig(env_ids=[ENV_ID], num_trajectories=num, concurrency=b, max_turns=max_turns + 1,
                             seed=s, sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0),
                             env_kwargs={ENV_ID: env_kwargs}, order="arrival")

    t0 = time.perf_counter()
    if not lockstep:
        result = await run_rollouts(config(n, seed), policy, chat, progress=False)
        errors = [t.error for t in result.trajectories if t.error]
    else:
        errors = []
        for start in range(0, n, b):
            m = min(b, n - start)
            WAVE["now"] = Wave(m)
            try:
                result = await run_rollouts(config(m, seed + start), LockstepPolicy(policy), chat, progress=False)
            finally:
                WAVE["now"] = None
            errors += [t.error for t in result.trajectories if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} trajectories failed, e.g. {errors[0]}")
    return time.perf_counter() - t0


def part_schedule(model, tok, chat, device: str, profile: str, n: int, b: int, turns: int, max_tokens: int,
                  time_scale: float, seed: int, reuse: bool = True) -> dict[str, Any]:
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    kw = {"profile": profile, "turns": turns, "time_scale": time_scale}
    out: dict[str, Any] = {"profile": profile, "trajectories": n, "slots": b, "max_turns": turns,
                           "max_tokens": max_tokens,
                           "turns_drawn": [plan(profile, seed + k, turns, time_scale)[0] for k in range(n)]}
    for sched in ("lockstep", "async"):
        policy = TransformersPolicy.from_model(model, tok, max_batch_size=b, batch_wait_s=0.02, seed=seed,
                                               prefix_cache_bytes=None if reuse else 0)
        try:
            wall = asyncio.run(_rollouts(policy, chat, n, b, seed, kw, turns, max_tokens, sched == "lockstep"))
        finally:
            policy.close()
            policy.prefix_cache.clear()  # its device memory, before the next schedule's policy
        out[sched] = {"wall_s": wall, "trajectories_per_s": n / wall, "requests": policy.num_requests,
                      "forward_passes": policy.num_forward_passes, "prefill_tokens": policy.num_prefill_tokens,
                      "prompt_tokens": policy.num_prompt_tokens, "reused_tokens": policy.prefix_cache.reused_tokens}
    out["async_over_lockstep"] = out["lockstep"]["wall_s"] / out["async"]["wall_s"]
    return out


def part_logprobs(model, tok, device: str, rows: int, prompt_len: int, new: int, seed: int) -> dict[str, Any]:
    import copy

    import torch

    from agentfly_gym.rollout.policies.base import SamplingParams
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    prompts = random_prompts(rows, prompt_len, seed + 1)
    policy = TransformersPolicy.from_model(model, tok, max_batch_size=rows, batch_wait_s=0.05, seed=seed)

    async def go():
        return await asyncio.gather(*(policy.generate(p, SamplingParams(max_tokens=new, temperature=1.0))
                                      for p in prompts))

    try:
        gens = asyncio.run(go())
    finally:
        policy.close()
    fp32 = copy.deepcopy(model).float()
    res: dict[str, Any] = {"rows": rows, "prompt_tokens": prompt_len, "new_tokens": new,
                           "policy_dtype": str(model.dtype).replace("torch.", ""),
                           "fp32_logprobs_offered": False}
    for name, trainer in (("trainer_same_dtype", model), ("trainer_fp32", fp32)):
        gaps, shifted = [], []
        for p, g in zip(prompts, gens):
            ids = torch.tensor([p + g.token_ids], device=device)
            with torch.inference_mode():
                lp = torch.log_softmax(trainer(input_ids=ids).logits[0].float(), dim=-1)
            for i, (t, stored) in enumerate(zip(g.token_ids, g.logprobs)):
                gaps.append(abs(stored - lp[len(p) - 1 + i, t].item()))
                shifted.append(abs(stored - lp[len(p) - 2 + i, t].item()))
        res[name] = {"max_gap": max(gaps), "mean_gap": statistics.fmean(gaps),
                     "shift_gap_median": statistics.median(shifted), "tokens": len(gaps)}
    del fp32
    return res


# ----------------------------------------------------------------------------- main
def checkpoint(res: C.Result) -> None:
    """Write the JSON as it stands, with its summary (a run cut short by the device's time limit keeps the parts
    done)."""
    results, cfg = res.data["results"], res.data["config"]
    first = results.get(f"generate/{cfg['rows'][0]}", {})
    reuse = results.get("reuse", {})
    res.data["summary"] = {
        "gpu": cfg["gpu"], "device": cfg["device"], "rows": cfg["rows"][0],
        "ours_over_generate": first.get("ours_over_generate"),
        "memory_over_generate": first.get("memory_over_generate"),
        "async_over_lockstep": {k: results.get(f"schedule/{k}", {}).get("async_over_lockstep")
                                for k in ("uniform", "heavy_tailed")},
        "prefill_tokens_per_turn": reuse.get("prefill_tokens_per_turn"),
        "prefill_tokens_per_turn_without_reuse": reuse.get("prefill_tokens_per_turn_without_reuse"),
        "logprob_max_gap": results.get("logprobs", {}).get("trainer_same_dtype", {}).get("max_gap")}
    raw = res.data
    res.data = C.clean(raw)
    res.save()
    res.data = raw


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="every part tiny, on the CPU (the smoke test)")
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--tiny", action="store_true", help="the 2-layer model of --smoke with the other sizes as given "
                                                       "(a CPU measurement)")
    p.add_argument("--parts", default="generate,engine,schedule,reuse,logprobs")
    p.add_argument("--rows", default="64,256", help="batch sizes of the generate part")
    p.add_argument("--prompt-tokens", type=int, default=1800)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--slots", type=int, default=64, help="trajectories in flight in the schedule part")
    p.add_argument("--max-turns", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=0.02)
    args = p.parse_args()
    sys.modules.setdefault("bench_gpu", sys.modules[__name__])  # the env's entry point is this module
    import gymnasium
    import torch

    from agentfly_gym.rollout.chat import ChatTokenizer

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point="bench_gpu:TurnsEnv")
    device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    res = C.Result("bench_gpu", args)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if args.smoke:
        torch.set_num_threads(1)
        cfg, rows, plen, new = TINY, [4], 16, 4
        n_uni, n_heavy, b, turns, max_tokens = 4, 4, 2, 3, 3
        if "engine" in parts:  # its scheduler thread polls: on a loaded 2-core CPU a few tokens take a minute
            parts.discard("engine")
            res.skip("engine/transformers_continuous_batching", "--smoke: measured on the GPU run only")
    else:
        cfg = TINY if args.tiny else QWEN3_06B
        rows, plen, new = [int(x) for x in args.rows.split(",")], args.prompt_tokens, args.new_tokens
        b = args.slots
        n_uni, n_heavy, turns, max_tokens = 2 * b, 4 * b, args.max_turns, args.new_tokens
    dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    model, tok = build_model(cfg, device, dtype, args.seed)
    chat = ChatTokenizer(tok)
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    res.data["config"] = {"device": device, "gpu": gpu, "dtype": str(dtype).replace("torch.", ""),
                          "model": "Qwen3 (random weights), " + ("tiny" if cfg is TINY else "0.6B shape"),
                          "model_config": cfg, "parts": sorted(parts), "rows": rows}
    res.data["results"] = results = {}
    # warm-up: kernels, allocator, the policy's thread
    part_generate(model, tok, device, 2, 8, 2, args.seed)
    if "generate" in parts:
        for r in rows:
            with C.skip_on_error(res, f"generate/{r}"):
                results[f"generate/{r}"] = x = part_generate(model, tok, device, r, plen, new, args.seed)
                print(f"[generate {r} rows] ours {x['ours']['tokens_per_s']:.0f} tok/s, generate "
                      f"{x['generate']['tokens_per_s']:.0f} tok/s: {x['ours_over_generate']:.2f}x", flush=True)
            checkpoint(res)
    for profile, n in (("uniform", n_uni), ("heavy_tailed", n_heavy)):
        if "schedule" in parts:
            with C.skip_on_error(res, f"schedule/{profile}"):
                results[f"schedule/{profile}"] = x = part_schedule(model, tok, chat, device, profile, n, b, turns,
                                                                   max_tokens, args.time_scale, args.seed)
                print(f"[schedule {profile}] async {x['async']['wall_s']:.1f} s, lockstep "
                      f"{x['lockstep']['wall_s']:.1f} s: {x['async_over_lockstep']:.2f}x", flush=True)
            checkpoint(res)
    if "reuse" in parts and "schedule/uniform" in results:
        with C.skip_on_error(res, "reuse"):
            with_reuse = results["schedule/uniform"]["async"]
            off = part_schedule(model, tok, chat, device, "uniform", n_uni, b, turns, max_tokens, args.time_scale,
                                args.seed, reuse=False)["async"]
            req = with_reuse["requests"]
            results["reuse"] = {"prefill_tokens_per_turn": with_reuse["prefill_tokens"] / req,
                                "prefill_tokens_per_turn_without_reuse": with_reuse["prompt_tokens"] / req,
                                "wall_s_with_reuse": with_reuse["wall_s"], "wall_s_without_reuse": off["wall_s"]}
            print(f"[reuse] prefill tokens per turn {results['reuse']['prefill_tokens_per_turn']:.0f} with reuse, "
                  f"{results['reuse']['prefill_tokens_per_turn_without_reuse']:.0f} without", flush=True)
        checkpoint(res)
    if "logprobs" in parts:
        with C.skip_on_error(res, "logprobs"):
            results["logprobs"] = x = part_logprobs(model, tok, device, min(rows[0], 16), min(plen, 256), new,
                                                    args.seed)
            print(f"[logprobs] max gap {x['trainer_same_dtype']['max_gap']:.3g} nats (same dtype), "
                  f"{x['trainer_fp32']['max_gap']:.3g} (fp32 trainer)", flush=True)
        checkpoint(res)
    if "engine" in parts:
        with C.skip_on_error(res, "engine/transformers_continuous_batching"):
            results["engine/transformers_continuous_batching"] = x = part_engine(model, tok, device, rows[0], plen,
                                                                                 new, args.seed)
            print(f"[engine {rows[0]} rows] transformers continuous batching {x['tokens_per_s']:.0f} tok/s", flush=True)
    checkpoint(res)
    print(f"[bench_gpu] summary {res.data['summary']}", flush=True)
    try:
        plot(res)
    except ImportError as e:  # matplotlib missing (the GPU machine has none unless carried): the JSON is what counts
        res.skip("plot", f"{type(e).__name__}: {e}")
        res.save()
    return 0


def plot(res: C.Result) -> None:
    r = res.data["results"]
    fig, axes = C.subplots(1, 3, figsize=(13, 4))
    gens = [k for k in r if k.startswith("generate/")]
    xs = range(len(gens))
    axes[0].bar([x - 0.2 for x in xs], [r[k]["ours"]["tokens_per_s"] for k in gens], 0.4, label="policy",
                color="#1b9e77")
    axes[0].bar([x + 0.2 for x in xs], [r[k]["generate"]["tokens_per_s"] for k in gens], 0.4,
                label="model.generate", color="#d95f02")
    axes[0].set_xticks(list(xs))
    axes[0].set_xticklabels([f"{r[k]['rows']} rows" for k in gens])
    axes[0].set_ylabel("sampled tokens/s")
    axes[0].legend(fontsize=8)
    scheds = [k for k in r if k.startswith("schedule/")]
    axes[1].bar(range(len(scheds)), [r[k]["async_over_lockstep"] for k in scheds], color="#7570b3")
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_xticks(range(len(scheds)))
    axes[1].set_xticklabels([k.split("/")[1] for k in scheds])
    axes[1].set_ylabel("async / lockstep (trajectories/s)")
    if "reuse" in r:
        u = r["reuse"]
        axes[2].bar([0, 1], [u["prefill_tokens_per_turn"], u["prefill_tokens_per_turn_without_reuse"]],
                    color=["#1b9e77", "#999999"])
        axes[2].set_xticks([0, 1])
        axes[2].set_xticklabels(["KV reuse", "no reuse"])
        axes[2].set_ylabel("prefill tokens per turn")
    cfg = res.data["config"]
    fig.suptitle(f"Generation on {cfg['gpu'] or cfg['device']} ({cfg['model']}, {cfg['dtype']})", fontsize=10)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
