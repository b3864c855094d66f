"""Asynchronous vs batch-synchronous rollout on the same environments, policy and resources.

Schedules (each runs N trajectories with B parallel slots; trajectory k always resets with
seed k and replays the same per-turn latencies and exploration choices, so every schedule
plays the same episodes):

  lockstep  batches of B as in verl-agent / RAGEN: generate for every live rollout, then step
            every live rollout, gather, repeat; the next batch starts when the slowest
            rollout of the batch has finished.
  gym_async Gymnasium's own ``gymnasium.vector.AsyncVectorEnv`` (B subprocess workers, each
            ``gymnasium.make``s its env, ``step_async``/``step_wait``; a finished worker gets
            the next trajectory at the next step, as Gymnasium's reset_mask allows).
  ours      every trajectory its own asyncio task (``run_chain_episode``, as the runner does,
            chat-template token ids included) with at most B in flight, all through ONE shared
            ResourceManager.

Policy: a latency model that replays generation latencies measured on the bundled SmolLM2
(CPU, one thread; measured once and cached in ``results/smollm2_latency.json``) times
``--latency-scale`` (default 0.05: ~0.7 s per 48-token reply, a GPU server), assuming the server
serves concurrent requests in parallel (lockstep's generation phase lasts as long as its
slowest request).  Actions: the env's expert, or with probability ``--explore`` a random
admissible/exploration action, so episode lengths vary as in RL.  At a small size the real
SmolLM2 policy is also run (lockstep vs ours).

Schedule efficiency = ideal makespan / actual wall time, where ideal = max(the longest
trajectory's own total of reset + generation + step durations, total work / B) from the
durations measured in that same run.
"""

from __future__ import annotations

import asyncio
import functools
import random
import sys
import time
from pathlib import Path
from typing import Any

import _common as C

ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "ScienceWorld": {"id": "agentfly/ScienceWorld-v0", "kwargs": {}, "options": {"expert": True},
                     "explore": ["look around", "inventory", "wait1"], "max_turns": 6, "cap_key": "max_instances"},
    "WebShop": {"id": "agentfly/WebShop-v0", "kwargs": {}, "options": None, "explore": [], "max_turns": 10,
                "cap_key": None},
    "Chess": {"id": "agentfly/Chess-v0", "kwargs": {"mode": "puzzle"}, "options": None, "explore": [],
              "max_turns": 8, "cap_key": None},
    "R2EGym": {"id": "agentfly/R2EGym-v0", "kwargs": {"bash_timeout": 60.0, "test_timeout": 120.0},
               "options": None, "max_turns": 6, "cap_key": "max_instances",
               "explore": ['{"name": "execute_bash", "arguments": {"cmd": "python3 -m pytest -q -x 2>&1 | tail -3"}}',
                           '{"name": "file_editor", "arguments": {"command": "view", "path": "/testbed"}}',
                           '{"name": "search", "arguments": {"search_term": "def ", "path": "/testbed"}}']},
}


# ----------------------------------------------------------------------------- latency model
def measure_smollm2_latency(n_calls: int, max_tokens: int) -> dict[str, Any]:
    """Per-call latency (seconds) of the bundled SmolLM2 on real Chess/ScienceWorld-style prompts,
    one request at a time, one torch thread, temperature 1."""
    import gymnasium

    import agentfly_gym  # noqa: F401
    from agentfly_gym.rollout import SamplingParams
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    async def run() -> list[dict[str, float]]:
        policy = TransformersPolicy(smollm2_dir(), seed=0, max_batch_size=1, torch_threads=1)
        chat = ChatTokenizer(policy.tokenizer)
        env = gymnasium.make("agentfly/Chess-v0").unwrapped
        out = []
        try:
            for i in range(n_calls):
                obs, _ = await env.areset(seed=i)
                ids = chat.prompt_ids([{"role": "system", "content": env.agent_prompt.system},
                                       {"role": "user", "content": env.agent_prompt.first_message(obs)}])
                t0 = time.perf_counter()
                g = await policy.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i))
                out.append({"latency_s": time.perf_counter() - t0, "tokens": len(g.token_ids),
                            "prompt_tokens": len(ids)})
        finally:
            await env.aclose()
            await policy.aclose()
        return out

    calls = asyncio.run(run())
    return {"model": "SmolLM2-135M-Instruct (bundled, CPU, 1 torch thread)", "max_tokens": max_tokens,
            "calls": calls, "latencies_s": [c["latency_s"] for c in calls],
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": C.machine_info()}


class LatencyModel:
    """Replays measured latencies: turn t of trajectory k takes ``lat[h(k, t)] * scale`` seconds."""

    def __init__(self, latencies: list[float], scale: float, seed: int) -> None:
        self.lat, self.scale, self.seed = list(latencies), scale, seed

    def latency(self, k: int, t: int) -> float:
        return random.Random(f"lat-{self.seed}-{k}-{t}").choice(self.lat) * self.scale


class BenchPolicy:
    """An ActionPolicy for trajectory ``k``: the expert, or with probability ``explore`` a random
    admissible / exploration action; each call lasts the model's latency for (k, turn)."""

    def __init__(self, k: int, model: LatencyModel, explore: float, explore_actions: list[str], seed: int) -> None:
        self.k, self.model, self.explore, self.explore_actions, self.seed = k, model, explore, explore_actions, seed
        self.turn = 0

    def choose(self, info: dict[str, Any], expert: str | None) -> str:
        rng = random.Random(f"act-{self.seed}-{self.k}-{self.turn}")
        if expert is None or rng.random() < self.explore:
            pool = list(info.get("admissible_actions") or []) or self.explore_actions
            if pool:
                return rng.choice(pool)
        return expert if expert is not None else "look around"

    async def act(self, observation: str, info: dict[str, Any], env: Any) -> str:
        lat = self.model.latency(self.k, self.turn)
        t0 = time.monotonic()
        try:
            expert = await env.expert_action()
        except Exception:  # noqa: BLE001  (no expert action left: explore)
            expert = None
        action = self.choose(info, expert)
        self.turn += 1
        await asyncio.sleep(max(0.0, lat - (time.monotonic() - t0)))
        return action


def _summ(name: str, wall: float, work: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """Throughput and schedule efficiency of one run from per-trajectory durations."""
    totals = [w["reset"] + sum(w["gen"]) + sum(w["env"]) for w in work]
    ideal = max(max(totals, default=0.0), sum(totals) / slots)
    return {"schedule": name, "wall_s": wall, "trajectories": len(work),
            "trajectories_per_s": len(work) / wall if wall > 0 else 0.0,
            "ideal_makespan_s": ideal, "schedule_efficiency": ideal / wall if wall > 0 else 0.0,
            "work_s": sum(totals), "generate_s": sum(sum(w["gen"]) for w in work),
            "env_s": sum(sum(w["env"]) for w in work), "reset_s": sum(w["reset"] for w in work),
            "turns": [len(w["env"]) for w in work], "success": [bool(w.get("won")) for w in work],
            "step_s_p50": C.pct([x for w in work for x in w["env"]], 0.5),
            "step_s_p99": C.pct([x for w in work for x in w["env"]], 0.99),
            "step_s_max": max((x for w in work for x in w["env"]), default=0.0)}


def _record(runs: dict[str, list[dict[str, Any]]], res: dict[str, Any], repeat: int, label: str) -> None:
    """Keep one schedule's result under its name and print it."""
    res["repeat"] = repeat
    runs[res["schedule"]].append(res)
    print(f"  {label} {res['schedule']:11s} rep {repeat}: {res['wall_s']:6.2f} s, {res['trajectories_per_s']:.4f} "
          f"traj/s, efficiency {res['schedule_efficiency']:.2f}", flush=True)


# ----------------------------------------------------------------------------- schedules
async def run_lockstep(envs: list[Any], n: int, cfg: dict[str, Any], policy_for, seed: int) -> dict[str, Any]:
    """Batches of len(envs): generate all, step all, repeat until the whole batch is done."""
    b = len(envs)
    work: list[dict[str, Any]] = []
    t_start = time.monotonic()
    for start in range(0, n, b):
        ks = list(range(start, min(n, start + b)))
        pols = {k: policy_for(k) for k in ks}
        recs = {k: {"reset": 0.0, "gen": [], "env": [], "won": False} for k in ks}

        async def reset(i: int, k: int):
            t0 = time.monotonic()
            r = await envs[i].areset(seed=seed + k, options=cfg["options"])
            recs[k]["reset"] = time.monotonic() - t0
            return r

        res = await asyncio.gather(*(reset(i, k) for i, k in enumerate(ks)))
        state = {k: (obs, info) for k, (obs, info) in zip(ks, res)}
        live = list(range(len(ks)))
        for _turn in range(cfg["max_turns"]):
            if not live:
                break

            async def gen(i: int):
                k = ks[i]
                t0 = time.monotonic()
                a = await pols[k].act(*state[k], envs[i])
                recs[k]["gen"].append(time.monotonic() - t0)
                return a

            actions = await asyncio.gather(*(gen(i) for i in live))

            async def step(i: int, a: str):
                k = ks[i]
                t0 = time.monotonic()
                out = await envs[i].astep(a)
                recs[k]["env"].append(time.monotonic() - t0)
                return out

            outs = await asyncio.gather(*(step(i, a) for i, a in zip(live, actions)))
            nxt = []
            for i, (obs, _r, te, tr, info) in zip(live, outs):
                state[ks[i]] = (obs, info)
                recs[ks[i]]["won"] = bool(info.get("won"))
                if not (te or tr):
                    nxt.append(i)
            live = nxt
        await asyncio.gather(*(e.aend_episode() for e in envs))
        work.extend(recs[k] for k in ks)
    return _summ("lockstep", time.monotonic() - t_start, work, b)


async def run_ours(env_id: str, env_kwargs: dict[str, Any], manager: Any, n: int, b: int, cfg: dict[str, Any],
                   policy_for, chat: Any, seed: int) -> dict[str, Any]:
    """Each trajectory its own task (run_chain_episode), at most b in flight, one shared manager."""
    import gymnasium

    from agentfly_gym.rollout import run_chain_episode

    sem = asyncio.Semaphore(b)

    async def one(k: int) -> dict[str, Any]:
        async with sem:
            env = gymnasium.make(env_id, manager=manager, **env_kwargs).unwrapped
            try:
                traj = await run_chain_episode(env, policy_for(k), chat, seed=seed + k, options=cfg["options"],
                                               max_turns=cfg["max_turns"], trajectory_id=f"t{k}")
            finally:
                await env.aclose()
        return {"reset": traj.timings.get("reset", 0.0), "gen": [t.generate_s for t in traj.turns],
                "env": [t.env_s for t in traj.turns], "won": traj.success, "error": traj.error}

    t0 = time.monotonic()
    work = await asyncio.gather(*(one(k) for k in range(n)))
    return _summ("ours", time.monotonic() - t0, list(work), b)


IDLE = "\x00idle"  # the action that parks a Gymnasium worker with no trajectory left


class _GymWorker:
    """Wraps one env in a Gymnasium AsyncVectorEnv worker: times its own steps, exposes the expert's
    next action in ``info["expert_action"]``, and answers steps after the episode's end at once."""

    def __init__(self, env_id: str, kwargs: dict[str, Any]) -> None:
        import gymnasium

        import agentfly_gym  # noqa: F401

        self.env = gymnasium.make(env_id, **kwargs)
        self.observation_space, self.action_space = self.env.observation_space, self.env.action_space
        self.metadata, self.render_mode, self.spec = self.env.metadata, None, None
        self.over = True

    def _expert(self, info: dict[str, Any]) -> dict[str, Any]:
        from agentfly_gym.utils.aio import run_sync

        try:
            info["expert_action"] = run_sync(self.env.unwrapped.expert_action())
        except Exception:  # noqa: BLE001
            info["expert_action"] = None
        return info

    def reset(self, *, seed=None, options=None):
        t0 = time.monotonic()
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info, env_s=time.monotonic() - t0)
        self.over = False
        return obs, self._expert(info)

    def step(self, action):
        if action == IDLE:
            self.over = True
        if self.over:
            return "", 0.0, True, False, {"idle": True}
        t0 = time.monotonic()
        obs, r, te, tr, info = self.env.step(action)
        info = dict(info, env_s=time.monotonic() - t0)
        if te or tr:
            self.over = True
            return obs, r, te, tr, info
        return obs, r, te, tr, self._expert(info)

    def close(self):
        self.env.close()

    @property
    def unwrapped(self):
        return self

    @property
    def np_random(self):
        return self.env.unwrapped.np_random


def _make_gym_worker(env_id: str, kwargs: dict[str, Any]):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    return _GymWorker(env_id, kwargs)


def _unbatch(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Sub-env ``i``'s info from Gymnasium's vector info (arrays + ``_key`` masks; nested dicts recursed)."""
    out = {}
    for k, v in infos.items():
        if k.startswith("_"):
            continue
        mask = infos.get(f"_{k}")
        if mask is not None and not mask[i]:
            continue
        out[k] = _unbatch(v, i) if isinstance(v, dict) else v[i]
    return out


def run_gym_async(venv: Any, n: int, cfg: dict[str, Any], policy_for, seed: int) -> dict[str, Any]:
    """Gymnasium AsyncVectorEnv: one step_async/step_wait over all workers per turn; a finished worker
    is reset (reset_mask) with the next trajectory's seed."""
    import numpy as np

    b = venv.num_envs
    work: dict[int, dict[str, Any]] = {}
    running: list[int | None] = [None] * b
    pols: dict[int, BenchPolicy] = {}
    infos_i: list[dict[str, Any]] = [{} for _ in range(b)]
    next_k = 0
    t_start = time.monotonic()

    def assign(mask_ids: list[int]) -> None:
        nonlocal next_k
        mask = np.zeros(b, dtype=np.bool_)
        seeds: list[int | None] = [None] * b
        for i in mask_ids:
            if next_k < n:
                running[i] = next_k
                pols[next_k] = policy_for(next_k)
                work[next_k] = {"reset": 0.0, "gen": [], "env": [], "won": False}
                seeds[i] = seed + next_k
                mask[i] = True
                next_k += 1
            else:
                running[i] = None
        if mask.any():
            opts = dict(cfg["options"] or {})
            opts["reset_mask"] = mask
            _obs, infos = venv.reset(seed=seeds, options=opts)
            for i in np.flatnonzero(mask):
                infos_i[i] = _unbatch(infos, int(i))
                work[running[i]]["reset"] = float(infos_i[i].get("env_s", 0.0))

    assign(list(range(b)))
    turns = [0] * b
    while any(r is not None for r in running):
        # "generate" for every live worker: the batch lasts as long as its slowest request
        lats, actions = [], [IDLE] * b
        for i, k in enumerate(running):
            if k is None:
                continue
            p = pols[k]
            lat = p.model.latency(k, p.turn)
            actions[i] = p.choose(infos_i[i], infos_i[i].get("expert_action"))
            p.turn += 1
            work[k]["gen"].append(lat)
            lats.append(lat)
        time.sleep(max(lats))
        venv.step_async(actions)
        _obs, _r, te, tr, infos = venv.step_wait()
        ended = []
        for i, k in enumerate(running):
            if k is None:
                continue
            infos_i[i] = _unbatch(infos, i)
            work[k]["env"].append(float(infos_i[i].get("env_s", 0.0)))
            work[k]["won"] = bool(infos_i[i].get("won", False))
            turns[i] += 1
            if te[i] or tr[i] or len(work[k]["env"]) >= cfg["max_turns"]:
                ended.append(i)
        if ended:  # a worker stopped at max_turns is reset (or idled) like a finished one
            for i in ended:
                turns[i] = 0
            assign(ended)
    return _summ("gym_async", time.monotonic() - t_start, list(work.values()), b)


# ----------------------------------------------------------------------------- real model (small)
class _TurnSeeded:
    """One trajectory's view of a policy: its turn t samples with seed ``base + 1000 t`` in every schedule, so
    the schedules generate the same tokens and differ only in when the requests reach the policy."""

    def __init__(self, policy: Any, base: int) -> None:
        self.policy, self.base, self.turn = policy, base, 0

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        import dataclasses

        s = dataclasses.replace(sampling, seed=self.base + 1000 * self.turn)
        self.turn += 1
        return await self.policy.generate(prompt_ids, s)


async def real_model_runs(n: int, b: int, max_tokens: int, seed: int, repeats: int = 1,
                          max_turns: int = 3) -> dict[str, list[dict[str, Any]]]:
    """Lockstep vs ours with the real SmolLM2 policy on Chess puzzles, ours both with the policy's continuous
    batching (``ours``) and with static waves (``ours_static``); same seeds and sampling seeds everywhere,
    schedule order rotated per repeat."""
    import gymnasium

    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.rollout import SamplingParams, run_chain_episode
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir(), seed=seed, max_batch_size=b, torch_threads=1)
    chat = ChatTokenizer(policy.tokenizer)
    runs: dict[str, list[dict[str, Any]]] = {"lockstep": [], "ours_static": [], "ours": []}

    async def ours(m: Any) -> list[dict[str, Any]]:
        sem = asyncio.Semaphore(b)

        async def one(k: int):
            async with sem:
                env = gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped
                try:
                    tr = await run_chain_episode(env, _TurnSeeded(policy, seed + k), chat, seed=seed + k,
                                                 max_turns=max_turns, sampling=SamplingParams(max_tokens=max_tokens))
                finally:
                    await env.aclose()
            return {"reset": tr.timings.get("reset", 0.0), "gen": [t.generate_s for t in tr.turns],
                    "env": [t.env_s for t in tr.turns], "won": tr.success}

        return list(await asyncio.gather(*(one(k) for k in range(n))))

    async def lockstep(envs: list[Any]) -> list[dict[str, Any]]:
        """Generate for the whole batch (its requests arrive together), then step all, until the batch is done."""
        work = []
        for start in range(0, n, b):
            ks = list(range(start, min(n, start + b)))
            recs = {k: {"reset": 0.0, "gen": [], "env": [], "won": False} for k in ks}
            res = await asyncio.gather(*(envs[i].areset(seed=seed + k) for i, k in enumerate(ks)))
            seqs = {k: chat.prompt_ids([{"role": "system", "content": envs[0].agent_prompt.system},
                                        {"role": "user", "content": envs[0].agent_prompt.first_message(o)}])
                    for k, (o, _) in zip(ks, res)}
            live = list(range(len(ks)))
            for turn in range(max_turns):
                if not live:
                    break
                tg = time.monotonic()
                gens = await asyncio.gather(*(policy.generate(seqs[ks[i]], SamplingParams(
                    max_tokens=max_tokens, seed=seed + ks[i] + 1000 * turn)) for i in live))
                dt = time.monotonic() - tg
                acts = []
                for i, g in zip(live, gens):
                    recs[ks[i]]["gen"].append(dt)
                    seqs[ks[i]] = seqs[ks[i]] + list(g.token_ids) + chat.close_assistant_ids(g.token_ids)
                    acts.append(envs[0].agent_prompt.parse_action(g.text))

                async def step(i: int, a: str):
                    t1 = time.monotonic()
                    o = await envs[i].astep(a)
                    recs[ks[i]]["env"].append(time.monotonic() - t1)
                    return o

                outs = await asyncio.gather(*(step(i, a) for i, a in zip(live, acts)))
                nxt = []
                for i, (obs, _r, te, tr, info) in zip(live, outs):
                    recs[ks[i]]["won"] = bool(info.get("won"))
                    if not (te or tr) and turn < max_turns - 1:
                        seqs[ks[i]] += chat.append_ids([{"role": "user",
                                                         "content": envs[0].agent_prompt.turn_message(obs)}])
                        nxt.append(i)
                live = nxt
            await asyncio.gather(*(e.aend_episode() for e in envs))
            work.extend(recs[k] for k in ks)
        return work

    try:
        async with ResourceManager() as m:
            envs = [gymnasium.make("agentfly/Chess-v0", manager=m).unwrapped for _ in range(b)]
            try:
                for r in range(repeats):
                    order = ["lockstep", "ours_static", "ours"]
                    order = order[r % 3:] + order[: r % 3]
                    for sched in order:
                        policy.continuous_batching = sched != "ours_static"
                        t0 = time.monotonic()
                        work = await (lockstep(envs) if sched == "lockstep" else ours(m))
                        _record(runs, _summ(sched, time.monotonic() - t0, work, b), r, "real model")
            finally:
                for e in envs:
                    await e.aclose()
    finally:
        await policy.aclose()
    return runs


async def policy_batching_runs(n: int, gap_s: float, max_tokens: int, max_batch: int, seed: int,
                               repeats: int = 2) -> dict[str, Any]:
    """The policy alone, requests arriving one every ``gap_s`` seconds (as trajectories that drifted apart send
    them): continuous batching vs static waves of the same TransformersPolicy (same prompts, same sampling
    seeds, so the same tokens).  Reports the makespan (first arrival to last reply) and the mean latency."""
    from agentfly_gym.rollout import SamplingParams
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir(), seed=seed, max_batch_size=max_batch, torch_threads=1)
    tok = policy.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe step {i} of making tea, briefly."}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False) for i in range(n)]
    out: dict[str, Any] = {"n": n, "gap_s": gap_s, "max_tokens": max_tokens, "max_batch_size": max_batch,
                           "runs": {"continuous": [], "static": []}}
    try:
        for r in range(repeats):
            for mode in (["continuous", "static"] if r % 2 == 0 else ["static", "continuous"]):
                policy.continuous_batching = mode == "continuous"
                f0 = policy.num_forward_passes

                async def one(i: int):
                    await asyncio.sleep(i * gap_s)
                    g = await policy.generate(prompts[i], SamplingParams(max_tokens=max_tokens, seed=seed + i))
                    return g.latency, len(g.token_ids)

                t0 = time.monotonic()
                res = await asyncio.gather(*(one(i) for i in range(n)))
                wall = time.monotonic() - t0
                rec = {"repeat": r, "makespan_s": wall, "mean_latency_s": sum(x for x, _ in res) / n,
                       "tokens": sum(t for _, t in res), "forward_passes": policy.num_forward_passes - f0}
                out["runs"][mode].append(rec)
                print(f"  policy batching {mode:10s} rep {r}: makespan {wall:6.1f} s, mean latency "
                      f"{rec['mean_latency_s']:5.1f} s, {rec['forward_passes']} forward passes", flush=True)
    finally:
        await policy.aclose()
    pairs = [s["makespan_s"] / c["makespan_s"] for c, s in zip(out["runs"]["continuous"], out["runs"]["static"])]
    lat = [s["mean_latency_s"] / c["mean_latency_s"] for c, s in zip(out["runs"]["continuous"], out["runs"]["static"])]
    out["static_over_continuous_makespan"] = C.median(pairs)
    out["static_over_continuous_mean_latency"] = C.median(lat)
    return out


# ----------------------------------------------------------------------------- driver
def env_available(name: str, env_id: str) -> str | None:
    """None when the env can run here, else the reason."""
    import gymnasium

    import agentfly_gym  # noqa: F401

    if env_id not in gymnasium.registry:
        return f"{env_id} is not registered"
    try:
        if name == "R2EGym":
            from agentfly_gym.resources.containers.choice import resolve_backend  # noqa: F401
            from agentfly_gym.envs.r2egym.local_tasks import default_tasks_dir

            if not (default_tasks_dir() / "tasks.jsonl").is_file():
                return "the local R2E-Gym task set is not built (agentfly-gym r2e build-tasks)"
        env = gymnasium.make(env_id, **ENV_DEFAULTS[name]["kwargs"])
        env.close()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


async def bench_env(name: str, n: int, b: int, repeats: int, model: LatencyModel, explore: float, seed: int,
                    gym_async: bool) -> dict[str, Any]:
    import gymnasium
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir
    from transformers import AutoTokenizer

    d = ENV_DEFAULTS[name]
    cfg = {"options": d["options"], "max_turns": d["max_turns"]}
    kwargs = dict(d["kwargs"])
    if d["cap_key"]:
        kwargs[d["cap_key"]] = b
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(str(smollm2_dir())))

    def policy_for(k: int) -> BenchPolicy:
        return BenchPolicy(k, model, explore, d["explore"], seed)

    runs: dict[str, list[dict[str, Any]]] = {"lockstep": [], "gym_async": [], "ours": []}
    venv = None
    async with ResourceManager() as m:
        envs = [gymnasium.make(d["id"], manager=m, **kwargs).unwrapped for _ in range(b)]
        # warm-up (untimed): start the pool's instances and load caches
        await asyncio.gather(*(e.areset(seed=10_000 + i, options=cfg["options"]) for i, e in enumerate(envs)))
        await asyncio.gather(*(e.aend_episode() for e in envs))
        if gym_async:
            fn = functools.partial(_make_gym_worker, d["id"], kwargs)
            venv = await asyncio.to_thread(AsyncVectorEnv, [fn] * b, shared_memory=False, context="spawn",
                                           autoreset_mode=AutoresetMode.DISABLED)
            await asyncio.to_thread(venv.reset, seed=[10_000 + i for i in range(b)], options=cfg["options"])
        try:
            for r in range(repeats):
                order = ["lockstep", "gym_async", "ours"]
                order = order[r % 3:] + order[: r % 3]  # rotate, so no schedule always runs first
                for sched in order:
                    if sched == "lockstep":
                        res = await run_lockstep(envs, n, cfg, policy_for, seed)
                    elif sched == "ours":
                        res = await run_ours(d["id"], kwargs, m, n, b, cfg, policy_for, chat, seed)
                    elif venv is not None:
                        res = await asyncio.to_thread(run_gym_async, venv, n, cfg, policy_for, seed)
                    else:
                        continue
                    _record(runs, res, r, name)
        finally:
            for e in envs:
                await e.aclose()
            if venv is not None:
                await asyncio.to_thread(venv.close)
    out: dict[str, Any] = {"n": n, "slots": b, "kwargs": kwargs, "max_turns": d["max_turns"], "runs": runs}
    med = {s: {"trajectories_per_s": C.median(x["trajectories_per_s"] for x in v),
               "schedule_efficiency": C.median(x["schedule_efficiency"] for x in v),
               "wall_s": C.median(x["wall_s"] for x in v)} for s, v in runs.items() if v}
    out["median"] = med
    # ratios measured side by side: per repeat, ours / baseline, then the median
    ratios = {}
    for base in ("lockstep", "gym_async"):
        pairs = [o["trajectories_per_s"] / bb["trajectories_per_s"]
                 for o, bb in zip(runs["ours"], runs[base]) if bb["trajectories_per_s"] > 0]
        if pairs:
            ratios[f"ours_over_{base}"] = C.median(pairs)
            ratios[f"ours_over_{base}_per_repeat"] = pairs
    out["ratios"] = ratios
    return out


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="Chess,WebShop,R2EGym,ScienceWorld",
                   help="comma-separated env names (unavailable ones are skipped with the reason)")
    p.add_argument("--slots", type=int, default=4, help="parallel slots B (batch size / concurrency / pool capacity)")
    p.add_argument("--latency-scale", type=float, default=0.05,
                   help="multiply the measured SmolLM2 CPU latencies by this (0.05: ~0.7 s per 48-token reply, a GPU server)")
    p.add_argument("--explore", type=float, default=0.2, help="probability of a random/exploration action")
    p.add_argument("--remeasure", action="store_true", help="measure the SmolLM2 latencies again")
    p.add_argument("--no-gym-async", action="store_true", help="skip Gymnasium's AsyncVectorEnv baseline")
    p.add_argument("--no-real-model", action="store_true", help="skip the small real-model comparison")
    p.add_argument("--real-n", type=int, default=8, help="real-model comparison: trajectories")
    p.add_argument("--real-slots", type=int, default=4, help="real-model comparison: slots (policy batch size)")
    p.add_argument("--real-repeats", type=int, default=1, help="real-model comparison: repeats (order rotated)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other envs' (and the real model's) numbers of an existing result file")
    args = p.parse_args()
    C.setup_env_vars()
    res = C.Result("bench_async_rollout", args)
    tiny = args.scale == 0
    repeats = args.repeats or (1 if tiny else 2)
    b = args.slots if not tiny else 2
    n = C.scaled(2 * b, args.scale, minimum=2 * b) if not tiny else 3

    lat_path = Path(args.out) / "smollm2_latency.json"
    import json

    if tiny:
        lat = {"model": "fixed latencies (smoke run: no model)", "latencies_s": [0.5, 1.0, 2.0]}
    elif lat_path.is_file() and not args.remeasure:
        lat = json.loads(lat_path.read_text())
        print(f"using SmolLM2 latencies measured {lat.get('measured')} from {lat_path}")
    else:
        print("measuring SmolLM2 per-call latency (once; cached)...", flush=True)
        lat = measure_smollm2_latency(n_calls=10, max_tokens=48)
        lat_path.parent.mkdir(parents=True, exist_ok=True)
        lat_path.write_text(json.dumps(lat, indent=2))
    res.data["latency_model"] = {"source": lat.get("model"), "measured": lat.get("measured"),
                                 "latencies_s": lat["latencies_s"], "scale": args.latency_scale,
                                 "note": "generation latencies are REPLAYED from a one-off SmolLM2 CPU measurement "
                                         "times --latency-scale; the server is assumed to run concurrent requests "
                                         "in parallel"}
    model = LatencyModel(lat["latencies_s"], args.latency_scale, args.seed)
    res.data["config"] = {"slots": b, "trajectories": n, "repeats": repeats, "explore": args.explore}
    res.data["envs"] = {}
    for name in [e.strip() for e in args.envs.split(",") if e.strip()]:
        if name not in ENV_DEFAULTS:
            res.skip(name, f"unknown env name; known: {sorted(ENV_DEFAULTS)}")
            continue
        why = env_available(name, ENV_DEFAULTS[name]["id"])
        if why:
            res.skip(name, why)
            continue
        print(f"[{name}] N={n} B={b} repeats={repeats}", flush=True)
        with C.skip_on_error(res, name):
            res.data["envs"][name] = asyncio.run(bench_env(name, n, b, repeats, model, args.explore, args.seed,
                                                           gym_async=not args.no_gym_async))
    if not (tiny or args.no_real_model):
        rn, rb, rt = args.real_n, args.real_slots, 12
        print(f"[real model] SmolLM2 on Chess, N={rn} B={rb}: lockstep vs ours (continuous / static batching)",
              flush=True)
        with C.skip_on_error(res, "real_model", trace=False, prefix=""):
            rm = asyncio.run(real_model_runs(n=rn, b=rb, max_tokens=rt, seed=args.seed, repeats=args.real_repeats))
            res.data["real_model"] = {"env": "Chess (puzzle)", "n": rn, "slots": rb, "max_tokens": rt,
                                      "max_turns": 3, "repeats": args.real_repeats, "runs": rm}
            for a, base in (("ours", "lockstep"), ("ours_static", "lockstep"), ("ours", "ours_static")):
                pairs = [x["trajectories_per_s"] / y["trajectories_per_s"] for x, y in zip(rm[a], rm[base])
                         if y["trajectories_per_s"] > 0]
                res.data["real_model"][f"{a}_over_{base}"] = C.median(pairs) if pairs else None
        print("[policy batching] SmolLM2 alone, staggered arrivals: continuous batching vs static waves", flush=True)
        with C.skip_on_error(res, "policy_batching", trace=False, prefix=""):
            res.data["policy_batching"] = asyncio.run(policy_batching_runs(
                n=12, gap_s=0.5, max_tokens=32, max_batch=8, seed=args.seed, repeats=args.real_repeats))
    old = Path(args.out) / "bench_async_rollout.json"
    if args.merge and old.is_file():
        prev = json.loads(old.read_text())
        for k, v in prev.get("envs", {}).items():
            if k not in res.data["envs"]:
                v["from_earlier_run"] = prev.get("command")
                res.data["envs"][k] = v
        for key in ("real_model", "policy_batching"):
            if key not in res.data and key in prev:
                res.data[key] = dict(prev[key], from_earlier_run=prev.get("command"))
        for k, v in prev.get("skipped", {}).items():
            if k not in res.data["envs"] and k not in res.data["skipped"]:
                res.data["skipped"][k] = v
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    envs = res.data["envs"]
    if not envs:
        return
    fig, axes = C.subplots(1, 2, figsize=(11, 4.2))
    scheds = ["lockstep", "gym_async", "ours"]
    colors = {"lockstep": "#d95f02", "gym_async": "#7570b3", "ours": "#1b9e77"}
    names = list(envs)
    w = 0.26
    for j, s in enumerate(scheds):
        tp = [envs[e]["median"].get(s, {}).get("trajectories_per_s", 0) or 0 for e in names]
        ef = [envs[e]["median"].get(s, {}).get("schedule_efficiency", 0) or 0 for e in names]
        xs = [i + (j - 1) * w for i in range(len(names))]
        axes[0].bar(xs, tp, w, label=s, color=colors[s])
        axes[1].bar(xs, ef, w, label=s, color=colors[s])
    for i, e in enumerate(names):
        r = envs[e]["ratios"].get("ours_over_lockstep")
        if r:
            top = max(envs[e]["median"].get(s, {}).get("trajectories_per_s", 0) or 0 for s in scheds)
            axes[0].text(i, top * 1.03, f"{r:.2f}x lockstep", ha="center", fontsize=8)
    axes[0].set_ylabel("trajectories / s (median)")
    axes[0].set_title("Throughput")
    axes[1].axhline(0.9, ls="--", color="grey", lw=1)
    axes[1].text(len(names) - 0.5, 0.91, "goal 0.9", ha="right", fontsize=8, color="grey")
    axes[1].set_ylabel("ideal makespan / actual")
    axes[1].set_ylim(0, 1.1)
    axes[1].set_title("Schedule efficiency")
    C.label_bars(axes, names)
    cfg = res.data["config"]
    fig.suptitle(f"Async vs lockstep rollout: N={cfg['trajectories']} trajectories, B={cfg['slots']} slots, "
                 f"replayed SmolLM2 latencies x{res.data['latency_model']['scale']}", fontsize=10)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
