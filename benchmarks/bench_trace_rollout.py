"""Trace-driven rollout: heavy-tailed turn counts, reply lengths and tool-call durations.

Workloads (``--profiles``; the fit of each is in ``PROFILES`` and in benchmarks/README.md):

  r2e       SWE-style trajectories as on R2E-Gym: turn counts with the published mean of OpenHands
            trajectories on SWE-rebench (64.3 turns, cap 100), replies around OpenHands' 220 tokens a
            turn, quick file/search tools mixed with slow test runs.
  alfworld  ALFWorld episodes: turn counts fitted to the expert and failed episodes that our own env
            played in ``fidelity_alfworld`` (results/fidelity_alfworld.json), short ReAct replies,
            ALFWorld's measured step cost.

Trajectory ``k`` (reset seed ``seed + k``) has a turn count, and per turn a reply length (tokens) and a
tool-call duration (seconds), all drawn from the profile with a generator seeded by ``(seed + k)``: every
schedule plays the same trajectories.  A reply of ``L`` tokens takes ``ttft + L / decode_tps`` seconds
(an inference server serving concurrent requests in parallel at a fixed per-request speed); a tool call
is a blocking call that lasts its drawn duration on the worker thread of an in-process resource
(``ToolSandbox``) that every episode acquires from the resource manager, as our in-process envs do.
All durations are multiplied by ``--time-scale`` so that a campaign fits in minutes; the ratio of
generation to tool time, and so the schedule, is unchanged.

Schedules (B slots each; N = 4B and 16B trajectories; order rotated per repeat):
  lockstep   batches of B: generate for all live rollouts, step all, repeat; next batch when all ended.
  gym_async  Gymnasium's AsyncVectorEnv (B spawned workers, one env each), a finished worker reset with
             the next trajectory at the next step (``reset_mask``).
  ours       every trajectory its own asyncio task (``run_chain_episode``, chat-template token ids
             included), at most B in flight, all envs on ONE ResourceManager; started in arrival order.
  ours_predicted    ours, started longest-predicted first (``--orders``): the prediction is a
             ``RolloutLengths`` that observed an EARLIER EPOCH of the same trace set, modelled as each
             trajectory's nominal length times lognormal noise of sigma ``--predict-noise`` (the
             rollout-to-rollout variation of one task); each episode's acquisitions carry its prediction
             as their priority.  Never the lengths themselves.
  ours_clairvoyant  ours, started longest first by the true nominal lengths (LPT; needs them in advance).
  The ``prediction_study`` (simulated, zero overhead) gives the efficiency of longest-predicted-first over
  ``--order-draws`` trace sets for several noise levels: how the figure depends on prediction quality.

Bounds and breakdown: ``ideal`` = max(longest trajectory, total work / B) from the trace's NOMINAL
durations (scaled).  ``simulated`` = the same three schedules run as a discrete-event simulation with
zero overhead, so measured / simulated is what the implementation loses and simulated / ideal what the
schedule itself loses (the last wave).  For ``ours`` every slot-second of ``B x wall`` is attributed:
nominal work, sleep/wake-up lag of generation, tool-call overhead (thread hop, env bookkeeping),
reset (acquire), the rollout loop's own time (tokenisation, trajectory building), and idle slots.

No GPU is used or needed: generation is a latency model, not a model (see the README).
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's agentfly_gym (spawned workers too)

import _common as C

from agentfly_gym.envs.base import AgentFlyEnv
from agentfly_gym.resources.spec import InProcessSpec


# ----------------------------------------------------------------------------- workload profiles
def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int | None = None):
    return rng.lognormal(math.log(median), sigma, size)


@dataclass(frozen=True)
class Profile:
    """A trace workload.  Durations in seconds, lengths in tokens; ``time_scale`` compresses all of them."""

    name: str
    source: str
    max_turns: int
    ttft_s: float
    decode_tps: float
    reply_median: float
    reply_sigma: float
    reply_clip: tuple[int, int]
    tool_mix: tuple[tuple[float, float, float], ...]  # (weight, median s, sigma) of a lognormal mixture
    tool_cap_s: float
    time_scale: float
    turns: dict[str, Any] = field(default_factory=dict)  # the turn-count model (see draw_turns)

    def draw_turns(self, rng: np.random.Generator) -> int:
        t = self.turns
        if t["kind"] == "capped_lognormal":
            mu = _capped_lognormal_mu(t["mean"], t["sigma"], t["min"], self.max_turns)
            return int(min(self.max_turns, max(t["min"], round(rng.lognormal(mu, t["sigma"])))))
        if t["kind"] == "success_or_cap":  # success: lognormal length; failure: the step limit
            if rng.random() < t["p_fail"]:
                return self.max_turns
            return int(min(self.max_turns, max(t["min"], round(rng.lognormal(t["mu"], t["sigma"])))))
        raise ValueError(f"unknown turn model {t['kind']!r}")

    def trace(self, key: int) -> dict[str, Any]:
        """Trajectory ``key``'s nominal trace: turns, reply tokens, generation and tool seconds (unscaled)."""
        rng = np.random.default_rng([key, sum(map(ord, self.name))])
        n = self.draw_turns(rng)
        lo, hi = self.reply_clip
        reply = np.clip(np.round(_lognormal(rng, self.reply_median, self.reply_sigma, n)), lo, hi).astype(int)
        w = np.array([m[0] for m in self.tool_mix])
        comp = rng.choice(len(self.tool_mix), size=n, p=w / w.sum())
        med = np.array([m[1] for m in self.tool_mix])[comp]
        sig = np.array([m[2] for m in self.tool_mix])[comp]
        tool = rng.lognormal(np.log(med), sig)
        tool = np.minimum(tool, self.tool_cap_s)
        gen = self.ttft_s + reply / self.decode_tps
        return {"turns": n, "reply_tokens": reply.tolist(), "gen_s": gen.tolist(), "tool_s": tool.tolist()}


@functools.cache
def _capped_lognormal_mu(mean: float, sigma: float, lo: int, cap: int) -> float:
    """``mu`` such that ``min(cap, max(lo, round(LogNormal(mu, sigma))))`` has mean ``mean`` (bisection on a
    fixed-seed Monte-Carlo sample of 200,000 draws: a method-of-moments fit of the published mean)."""
    z = np.random.default_rng(12345).standard_normal(200_000)
    a, b = 0.0, math.log(cap) + 3 * sigma
    for _ in range(60):
        mid = (a + b) / 2
        m = np.clip(np.round(np.exp(mid + sigma * z)), lo, cap).mean()
        a, b = (mid, b) if m < mean else (a, mid)
    return (a + b) / 2


def _alfworld_turn_fit() -> dict[str, Any]:
    """Fit ALFWorld turn counts to the episodes of results/fidelity_alfworld.json (our env, alfworld's hand-coded
    expert with a probe every 3rd step, 50-step limit): failures (not won) end at the limit; the lengths of the
    won episodes, probes removed (x 2/3), get a lognormal by maximum likelihood (mean and sd of the logs)."""
    import json

    path = Path(__file__).resolve().parent / "results" / "fidelity_alfworld.json"
    games = json.loads(path.read_text())["per_game"]
    won = [g["steps"] * 2 / 3 for g in games if g["won"]]
    logs = np.log(won)
    return {"kind": "success_or_cap", "p_fail": 1 - len(won) / len(games), "mu": float(logs.mean()),
            "sigma": float(logs.std(ddof=0)), "min": 2, "episodes": len(games), "won": len(won),
            "fitted_from": "results/fidelity_alfworld.json (per_game steps and won)"}


def make_profiles() -> dict[str, Profile]:
    return {
        "r2e": Profile(
            name="r2e",
            source=("turns: OpenHands trajectories on SWE-rebench (nebius/SWE-rebench-openhands-trajectories, 67,074 "
                    "trajectories, mean 64.3 turns, max 100 = the step cap; statistics quoted in ai-dynamo/aiperf "
                    "issue 1019); replies: 220 tokens per turn, the OpenHands/swe_smith recipe of sglang's agentic-trace "
                    "benchmark (sgl-project/sglang PR 29215); tools: quick file/search calls as a docker exec here "
                    "(~0.15 s) and test/script runs (seconds to the 90 s bash timeout)"),
            max_turns=100, ttft_s=0.3, decode_tps=40.0, reply_median=220, reply_sigma=0.9, reply_clip=(5, 4096),
            tool_mix=((0.8, 0.15, 0.5), (0.2, 5.0, 1.2)), tool_cap_s=90.0, time_scale=0.003,
            turns={"kind": "capped_lognormal", "mean": 64.3, "sigma": 0.6, "min": 3}),
        "alfworld": Profile(
            name="alfworld",
            source=("turns: expert and failed episodes of our ALFWorld env (results/fidelity_alfworld.json); step: "
                    "ALFWorld's measured 120-170 ms (docs/environments.md); replies: short ReAct thoughts + action"),
            max_turns=50, ttft_s=0.15, decode_tps=40.0, reply_median=40, reply_sigma=0.6, reply_clip=(3, 512),
            tool_mix=((1.0, 0.14, 0.2),), tool_cap_s=10.0, time_scale=0.015,
            turns=_alfworld_turn_fit()),
    }


# ----------------------------------------------------------------------------- env, resource, policy
class ToolSandbox:
    """The in-process resource behind a trace episode: ``run(seconds)`` blocks its worker thread that long
    (a tool call: a docker exec, a simulator step)."""

    def run(self, seconds: float) -> str:
        time.sleep(seconds)
        return "ok"

    def close(self) -> None:
        pass


class TraceEnv(AgentFlyEnv):
    """An episode that replays trajectory ``seed``'s tool calls; terminated after its drawn number of turns."""

    env_name = "Trace"

    def __init__(self, *, profile: str = "r2e", time_scale: float | None = None, max_sandboxes: int = 4,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profile = make_profiles()[profile]
        self.time_scale = self.profile.time_scale if time_scale is None else time_scale
        self.sandbox_spec = InProcessSpec(factory="bench_trace_rollout:ToolSandbox", max_instances=max_sandboxes,
                                          name="trace-sandbox")
        self._key: int | None = None
        self._trace: dict[str, Any] = {}
        self._t = 0
        self._box: Any = None

    def episode_resource_specs(self) -> list:
        return [self.sandbox_spec]

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._key = seed
        return await super().areset(seed=seed, options=options)

    async def _reset_episode(self, scope, options):
        self._box = await scope.acquire(self.sandbox_spec)
        self._trace = self.profile.trace(int(self._key or 0))
        self._t = 0
        self._task_id = f"trace-{self._key}"
        return "Task: fix the issue.", {}

    async def _step_episode(self, action: str):
        d = self._trace["tool_s"][self._t] * self.time_scale
        await self._box.call("run", d)
        self._t += 1
        done = self._t >= self._trace["turns"]
        return f"tool output of turn {self._t}", float(done), done, False, {"won": done, "score": float(done)}

    async def expert_action(self) -> str:
        return f"call {self._t}"


class TraceLatency:
    """``latency(k, t)``: trajectory k's turn-t generation time (scaled), k counted from the run's seed."""

    def __init__(self, profile: Profile, time_scale: float, seed: int) -> None:
        self.profile, self.scale, self.seed = profile, time_scale, seed

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (one instance per run, bounded)
    def trace(self, key: int) -> dict[str, Any]:
        return self.profile.trace(key)

    def latency(self, k: int, t: int) -> float:
        g = self.trace(self.seed + k)["gen_s"]
        return g[min(t, len(g) - 1)] * self.scale


class TracePolicy:
    """An ActionPolicy for trajectory ``k``: each reply lasts its traced generation time."""

    def __init__(self, k: int, model: TraceLatency) -> None:
        self.k, self.model, self.turn = k, model, 0

    def choose(self, info: dict[str, Any], expert: str | None) -> str:
        return f"call {self.turn}"

    async def act(self, observation: str, info: dict[str, Any], env: Any) -> str:
        lat = self.model.latency(self.k, self.turn)
        action = self.choose(info, None)
        self.turn += 1
        await asyncio.sleep(lat)
        return action


# ----------------------------------------------------------------------------- simulation (zero overhead)
def simulate(traces: list[dict[str, Any]], b: int, scale: float) -> dict[str, float]:
    """Makespans (s) of lockstep, gym_async and ours with zero overhead, plus the ideal bound, a clairvoyant
    longest-first schedule (``lpt_s``: trajectories started longest first, which needs their lengths in
    advance) and a lower bound on any schedule's makespan (``best_schedule_lower_bound_s``).  Efficiencies
    are ideal / makespan as everywhere here; the best any schedule can reach lies between ``lpt_efficiency``
    and ``best_schedule_efficiency_at_most``."""
    turns = [[(g * scale, s * scale) for g, s in zip(t["gen_s"], t["tool_s"])] for t in traces]
    totals = [sum(g + s for g, s in tr) for tr in turns]
    ideal = max(max(totals), sum(totals) / b)
    # ours: list scheduling in index order on b slots
    slots = [0.0] * b
    for tot in totals:
        i = min(range(b), key=slots.__getitem__)
        slots[i] += tot
    ours = max(slots)
    # clairvoyant longest-first (LPT, Graham 1969: within 4/3 - 1/(3b) of the optimum), and a lower bound on the
    # optimal makespan of ANY schedule of whole trajectories on b slots: the ideal, and the b-th plus the
    # (b+1)-th longest (two of the b+1 longest share a slot)
    slots = [0.0] * b
    for tot in sorted(totals, reverse=True):
        i = min(range(b), key=slots.__getitem__)
        slots[i] += tot
    lpt = max(slots)
    desc = sorted(totals, reverse=True)
    best_lb = max(ideal, desc[b - 1] + desc[b] if len(desc) > b else 0.0)
    # lockstep: batches; per turn max gen then max step over the live ones
    lock = 0.0
    for s in range(0, len(turns), b):
        batch = turns[s:s + b]
        for t in range(max(len(x) for x in batch)):
            live = [x[t] for x in batch if t < len(x)]
            lock += max(g for g, _ in live) + max(st for _, st in live)
    # gym_async: one barrier per turn over all workers; a finished worker takes the next trajectory
    queue = list(range(len(turns)))
    cur: list[list[Any] | None] = [None] * b
    for i in range(b):
        cur[i] = [queue.pop(0), 0] if queue else None
    gym = 0.0
    while any(c is not None for c in cur):
        live = [turns[c[0]][c[1]] for c in cur if c is not None]
        gym += max(g for g, _ in live) + max(st for _, st in live)
        for i, c in enumerate(cur):
            if c is None:
                continue
            c[1] += 1
            if c[1] >= len(turns[c[0]]):
                cur[i] = [queue.pop(0), 0] if queue else None
    return {"ideal_s": ideal, "ours_s": ours, "lockstep_s": lock, "gym_async_s": gym,
            "ours_over_lockstep": lock / ours, "ours_over_gym_async": gym / ours,
            "ours_efficiency": ideal / ours, "work_s": sum(totals),
            "lpt_s": lpt, "lpt_efficiency": ideal / lpt, "best_schedule_lower_bound_s": best_lb,
            "best_schedule_efficiency_at_most": ideal / best_lb}


def list_schedule(totals: list[float], order: list[int], b: int) -> float:
    """Makespan (s) of whole trajectories of ``totals`` seconds started in ``order`` on b slots (zero overhead)."""
    slots = [0.0] * b
    for k in order:
        i = min(range(b), key=slots.__getitem__)
        slots[i] += totals[k]
    return max(slots)


def earlier_epoch(nominal: list[float], sigma: float, seed: int) -> list[float]:
    """An earlier epoch's lengths of the same trajectories: each nominal length times lognormal noise of
    ``sigma`` (0: the same lengths; large: unrelated)."""
    rng = np.random.default_rng([seed, 29])
    return [x * float(math.exp(sigma * z)) for x, z in zip(nominal, rng.standard_normal(len(nominal)))]


def predicted_order(nominal: list[float], turns: list[int], sigma: float, seed: int) -> tuple[list[int], list[float | None]]:
    """The start order and priorities the library's ``RolloutLengths`` gives after observing an earlier epoch."""
    from agentfly_gym.rollout.ordering import RolloutLengths

    lengths = RolloutLengths()
    for k, (sec, t) in enumerate(zip(earlier_epoch(nominal, sigma, seed), turns)):
        lengths.observe(f"trace/{k}", sec, t)
    return lengths.order([f"trace/{k}" for k in range(len(nominal))])


def prediction_study(profile: Profile, b: int, n: int, seed: int, draws: int,
                     sigmas: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)) -> dict[str, Any]:
    """Mean efficiency (ideal / makespan, zero overhead) over ``draws`` trace sets of arrival order, of
    longest-predicted-first with the prediction from an earlier epoch of noise sigma (each of ``sigmas``),
    and of clairvoyant longest-first."""
    rows: dict[str, list[float]] = {"arrival": [], "clairvoyant": [], **{f"sigma_{s:g}": [] for s in sigmas}}
    for j in range(draws):
        traces = [profile.trace(seed + 100_000 * (j + 1) + k) for k in range(n)]
        totals = [sum(g + t for g, t in zip(tr["gen_s"], tr["tool_s"])) for tr in traces]
        ideal = max(max(totals), sum(totals) / b)
        rows["arrival"].append(ideal / list_schedule(totals, list(range(n)), b))
        rows["clairvoyant"].append(ideal / list_schedule(totals, sorted(range(n), key=lambda k: -totals[k]), b))
        for s in sigmas:
            order, _ = predicted_order(totals, [tr["turns"] for tr in traces], s, seed + j)
            rows[f"sigma_{s:g}"].append(ideal / list_schedule(totals, order, b))
    return {"n": n, "slots": b, "draws": draws, "mean_efficiency": {k: float(np.mean(v)) for k, v in rows.items()},
            "p10_efficiency": {k: C.pct(v, 0.1) for k, v in rows.items()}}


def order_study(profile: Profile, b: int, n: int, seed: int, draws: int) -> dict[str, Any]:
    """Efficiency (ideal / makespan, zero overhead) of arrival order (ours) and of the clairvoyant longest-first
    order over ``draws`` independent trace sets of ``n`` trajectories (set j: keys ``seed + 100_000 * (j + 1) + k``).

    Trajectory lengths are i.i.d., so every order chosen without knowing them (a scheduler that starts a
    trajectory only when a slot frees) has the distribution of arrival order: its row is what any
    non-clairvoyant schedule of whole trajectories on b slots reaches; the longest-first row needs the
    lengths in advance."""
    arrival, lpt = [], []
    for j in range(draws):
        sim = simulate([profile.trace(seed + 100_000 * (j + 1) + k) for k in range(n)], b, 1.0)
        arrival.append(sim["ours_efficiency"])
        lpt.append(sim["lpt_efficiency"])

    def summ(x: list[float]) -> dict[str, float]:
        return {"mean": float(np.mean(x)), "p10": C.pct(x, 0.1), "p50": C.pct(x, 0.5), "p90": C.pct(x, 0.9),
                "share_at_least_0.95": float(np.mean([v >= 0.95 for v in x]))}

    return {"n": n, "slots": b, "draws": draws, "arrival_order": summ(arrival), "longest_first": summ(lpt)}


class LoadSampler:
    """Samples ``os.getloadavg()`` every ``every_s`` seconds in a daemon thread (the machine is shared)."""

    def __init__(self, every_s: float = 30.0) -> None:
        import threading

        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._every = every_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import os

        while True:
            one, five, fifteen = os.getloadavg()
            self.samples.append({"t_s": round(time.monotonic() - self._t0, 1), "1min": one, "5min": five,
                                 "15min": fifteen})
            if self._stop.wait(self._every):
                return

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        ones = [x["1min"] for x in self.samples]
        return {"every_s": self._every, "samples": self.samples,
                "1min": {"min": min(ones), "median": C.median(ones), "max": max(ones)}}


# ----------------------------------------------------------------------------- schedules
def _spec() -> Any:
    from gymnasium.envs.registration import EnvSpec

    return EnvSpec(id="TraceBench-v0", entry_point="bench_trace_rollout:TraceEnv")


async def run_ours(kwargs: dict[str, Any], manager: Any, n: int, b: int, policy_for, chat: Any, seed: int,
                   max_turns: int, nominal: list[float], *, start: list[int] | None = None,
                   priorities: list[float | None] | None = None, name: str = "ours") -> dict[str, Any]:
    """Each trajectory its own task (run_chain_episode), at most b in flight, one shared manager; records
    each trajectory's slot time for the breakdown.  ``start``: the order the tasks are started in (as the
    runners do: created in that order, the semaphore admits them in it); ``priorities``: each episode's
    acquisition priority."""
    import gymnasium

    from agentfly_gym.resources.priority import acquire_priority
    from agentfly_gym.rollout import run_chain_episode

    sem = asyncio.Semaphore(b)
    t_start = time.monotonic()
    start = list(range(n)) if start is None else start
    priorities = priorities or [None] * n

    async def one(k: int) -> dict[str, Any]:
        async with sem, acquire_priority(priorities[k]):
            t0 = time.monotonic()
            env = gymnasium.make(_spec(), manager=manager, **kwargs).unwrapped
            try:
                traj = await run_chain_episode(env, policy_for(k), chat, seed=seed + k, max_turns=max_turns,
                                               trajectory_id=f"t{k}")
            finally:
                await env.aclose()
            t1 = time.monotonic()
        return {"reset": traj.timings.get("reset", 0.0), "gen": [t.generate_s for t in traj.turns],
                "env": [t.env_s for t in traj.turns], "won": traj.success, "error": traj.error,
                "slot_s": t1 - t0, "start": t0 - t_start, "end": t1 - t_start}

    by_start = {k: asyncio.ensure_future(one(k)) for k in start}
    work = list(await asyncio.gather(*(by_start[k] for k in range(n))))
    wall = time.monotonic() - t_start
    from bench_async_rollout import _summ

    out = _summ(name, wall, work, b)
    gen_nom = [sum(policy_for(k).model.trace(seed + k)["gen_s"]) * policy_for(k).model.scale for k in range(n)]
    tool_nom = [nominal[k] - gen_nom[k] for k in range(n)]
    gen = sum(sum(w["gen"]) for w in work)
    env = sum(sum(w["env"]) for w in work)
    reset = sum(w["reset"] for w in work)
    slots = sum(w["slot_s"] for w in work)
    out["breakdown_slot_s"] = {
        "capacity (B x wall)": b * wall,
        "nominal generation": sum(gen_nom), "nominal tool calls": sum(tool_nom),
        "generation lag (sleep/wake-up, event loop)": gen - sum(gen_nom),
        "tool-call overhead (thread hop, env step bookkeeping)": env - sum(tool_nom),
        "reset (acquire sandbox, open scope)": reset,
        "rollout loop (tokenisation, trajectory, env make/close)": slots - gen - env - reset,
        "idle slots (last wave, hand-over)": b * wall - slots}
    out["errors"] = [w["error"] for w in work if w["error"]]
    return out


def _run_gym(venv: Any, n: int, policy_for, seed: int, max_turns: int) -> dict[str, Any]:
    from bench_async_rollout import run_gym_async

    return run_gym_async(venv, n, {"options": None, "max_turns": max_turns}, policy_for, seed)


async def bench_profile(profile: Profile, b: int, ns: list[int], repeats: int, seed: int, time_scale: float,
                        gym_async: bool, orders: tuple[str, ...] = ("arrival",), predict_noise: float = 0.3,
                        lockstep: bool = True) -> dict[str, Any]:
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode
    from transformers import AutoTokenizer

    import gymnasium
    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir
    from bench_async_rollout import _make_gym_worker, _record, run_lockstep

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(str(smollm2_dir())))
    model = TraceLatency(profile, time_scale, seed)
    kwargs = {"profile": profile.name, "time_scale": time_scale, "max_sandboxes": b,
              "step_timeout": None}

    def policy_for(k: int) -> TracePolicy:
        return TracePolicy(k, model)

    out: dict[str, Any] = {"slots": b, "time_scale": time_scale, "by_n": {}}
    venv = None
    async with ResourceManager() as m:
        envs = [gymnasium.make(_spec(), manager=m, **kwargs).unwrapped for _ in range(b)]
        await asyncio.gather(*(e.areset(seed=10_000 + i) for i, e in enumerate(envs)))
        await asyncio.gather(*(e.aend_episode() for e in envs))
        if gym_async:
            fn = functools.partial(_make_gym_worker, _spec(), kwargs)
            venv = await asyncio.to_thread(AsyncVectorEnv, [fn] * b, shared_memory=False, context="spawn",
                                           autoreset_mode=AutoresetMode.DISABLED)
            await asyncio.to_thread(venv.reset, seed=[10_000 + i for i in range(b)])
        try:
            out["zero_latency_probe"] = await zero_latency_probe(envs, kwargs, m, ns[0], b, chat, seed, profile)
            for n in ns:
                traces = [profile.trace(seed + k) for k in range(n)]
                nominal = [sum(g + s for g, s in zip(t["gen_s"], t["tool_s"])) * time_scale for t in traces]
                sim = simulate(traces, b, time_scale)
                pred_start, pred_prio = predicted_order(nominal, [t["turns"] for t in traces], predict_noise, seed + n)
                clair_start = sorted(range(n), key=lambda k: -nominal[k])
                sim["ours_predicted_s"] = list_schedule(nominal, pred_start, b)
                sim["ours_clairvoyant_s"] = list_schedule(nominal, clair_start, b)
                runs: dict[str, list[dict[str, Any]]] = {"lockstep": [], "gym_async": [], "ours": [],
                                                         "ours_predicted": [], "ours_clairvoyant": []}
                scheds = (["lockstep"] if lockstep else []) + ["gym_async"] + \
                    [{"arrival": "ours", "predicted": "ours_predicted", "clairvoyant": "ours_clairvoyant"}[o]
                     for o in orders]
                print(f"[{profile.name}] N={n} B={b}: simulated efficiency of arrival / predicted (sigma "
                      f"{predict_noise:g}) / clairvoyant longest-first: {sim['ideal_s'] / sim['ours_s']:.3f} / "
                      f"{sim['ideal_s'] / sim['ours_predicted_s']:.3f} / {sim['ideal_s'] / sim['ours_clairvoyant_s']:.3f}",
                      flush=True)
                print(f"[{profile.name}] N={n} B={b}: simulated zero-overhead ours/lockstep "
                      f"{sim['ours_over_lockstep']:.2f}x, ours efficiency {sim['ours_efficiency']:.3f}", flush=True)
                for r in range(repeats):
                    order = scheds[r % len(scheds):] + scheds[: r % len(scheds)]
                    for sched in order:
                        if sched == "lockstep":
                            res = await run_lockstep(envs, n, {"options": None, "max_turns": profile.max_turns},
                                                     policy_for, seed)
                        elif sched == "ours":
                            res = await run_ours(kwargs, m, n, b, policy_for, chat, seed, profile.max_turns, nominal)
                        elif sched == "ours_predicted":
                            res = await run_ours(kwargs, m, n, b, policy_for, chat, seed, profile.max_turns, nominal,
                                                 start=pred_start, priorities=pred_prio, name=sched)
                        elif sched == "ours_clairvoyant":
                            res = await run_ours(kwargs, m, n, b, policy_for, chat, seed, profile.max_turns, nominal,
                                                 start=clair_start, priorities=[nominal[k] for k in range(n)],
                                                 name=sched)
                        elif venv is not None:
                            res = await asyncio.to_thread(_run_gym, venv, n, policy_for, seed, profile.max_turns)
                        else:
                            continue
                        res["ideal_nominal_s"] = sim["ideal_s"]
                        res["efficiency_vs_nominal_ideal"] = sim["ideal_s"] / res["wall_s"]
                        res["simulated_s"] = sim[f"{sched}_s"]
                        res["measured_over_simulated"] = res["wall_s"] / sim[f"{sched}_s"]
                        _record(runs, res, r, f"{profile.name} N={n}")
                med = {s: {k: C.median(x[k] for x in v) for k in ("trajectories_per_s", "schedule_efficiency",
                                                                  "efficiency_vs_nominal_ideal", "wall_s",
                                                                  "measured_over_simulated")}
                       for s, v in runs.items() if v}
                ratios = {}
                for base in ("lockstep", "gym_async"):
                    pairs = [o["trajectories_per_s"] / bb["trajectories_per_s"]
                             for o, bb in zip(runs["ours"], runs[base]) if bb["trajectories_per_s"] > 0]
                    if pairs:
                        ratios[f"ours_over_{base}"] = C.median(pairs)
                        ratios[f"ours_over_{base}_per_repeat"] = pairs
                br = [x["breakdown_slot_s"] for x in runs["ours"]]
                out["by_n"][str(n)] = {
                    "n": n, "runs": runs, "median": med, "ratios": ratios, "simulated": sim,
                    "ideal_trajectories_per_s": n / sim["ideal_s"],
                    "trace_stats": _trace_stats(traces, time_scale),
                    "ours_breakdown_share": {k: C.median(x[k] / x["capacity (B x wall)"] for x in br)
                                             for k in br[0]} if br else {}}
        finally:
            for e in envs:
                await e.aclose()
            if venv is not None:
                await asyncio.to_thread(venv.close)
    return out


async def zero_latency_probe(envs: list[Any], kwargs: dict[str, Any], manager: Any, n: int, b: int, chat: Any,
                             seed: int, profile: Profile) -> dict[str, Any]:
    """The same trajectories with every generation and tool duration set to 0: wall and CPU seconds (this
    process, all threads) per turn of lockstep and ours, i.e. each schedule's own cost per turn; ours also with
    ``ChatTokenizer``'s backend shortcut off, between two runs with it on."""
    from bench_async_rollout import run_lockstep

    zero = TraceLatency(profile, 0.0, seed)
    kw = dict(kwargs, time_scale=0.0)
    for e in envs:
        e.time_scale = 0.0
    out = {}
    fast = chat.fast_encode
    try:
        # "ours, tokenizer.encode": the same with ChatTokenizer's backend shortcut switched off (the cost it saves)
        for sched in ("lockstep", "ours", "ours, tokenizer.encode", "ours (again)"):
            chat.fast_encode = fast and sched != "ours, tokenizer.encode"
            c0, t0 = time.process_time(), time.monotonic()
            if sched == "lockstep":
                r = await run_lockstep(envs, n, {"options": None, "max_turns": profile.max_turns},
                                       lambda k: TracePolicy(k, zero), seed)
            else:
                r = await run_ours(kw, manager, n, b, lambda k: TracePolicy(k, zero), chat, seed, profile.max_turns,
                                   [0.0] * n)
            wall, cpu = time.monotonic() - t0, time.process_time() - c0
            turns = sum(r["turns"])
            out[sched] = {"wall_s": wall, "cpu_s": cpu, "turns": turns, "wall_ms_per_turn": 1000 * wall / turns,
                          "cpu_ms_per_turn": 1000 * cpu / turns}
            print(f"  [{profile.name}] zero-latency {sched}: {out[sched]['wall_ms_per_turn']:.2f} ms wall, "
                  f"{out[sched]['cpu_ms_per_turn']:.2f} ms CPU per turn ({turns} turns)", flush=True)
    finally:
        chat.fast_encode = fast
        for e in envs:
            e.time_scale = kwargs["time_scale"]
    return out


def _trace_stats(traces: list[dict[str, Any]], scale: float) -> dict[str, Any]:
    turns = [t["turns"] for t in traces]
    reply = [x for t in traces for x in t["reply_tokens"]]
    tool = [x for t in traces for x in t["tool_s"]]
    gen = sum(sum(t["gen_s"]) for t in traces)
    return {"turns": {"min": min(turns), "p50": C.pct(turns, 0.5), "mean": float(np.mean(turns)), "max": max(turns)},
            "reply_tokens": {"p10": C.pct(reply, 0.1), "p50": C.pct(reply, 0.5), "p99": C.pct(reply, 0.99),
                             "max": max(reply)},
            "tool_s_unscaled": {"p10": C.pct(tool, 0.1), "p50": C.pct(tool, 0.5), "p99": C.pct(tool, 0.99),
                                "max": max(tool)},
            "generation_share_of_work": gen / (gen + sum(tool)),
            "trajectory_s_unscaled": {"p50": C.pct([sum(t["gen_s"]) + sum(t["tool_s"]) for t in traces], 0.5),
                                      "max": max(sum(t["gen_s"]) + sum(t["tool_s"]) for t in traces)}}


def describe(p: Profile) -> dict[str, Any]:
    turns = dict(p.turns)
    if turns["kind"] == "capped_lognormal":
        turns["mu_fitted"] = _capped_lognormal_mu(turns["mean"], turns["sigma"], turns["min"], p.max_turns)
    return {"source": p.source, "max_turns": p.max_turns, "turns": turns,
            "reply_tokens": {"family": "lognormal", "median": p.reply_median, "sigma": p.reply_sigma,
                             "clip": list(p.reply_clip)},
            "generation_s": f"{p.ttft_s} + tokens / {p.decode_tps}",
            "tool_s": {"family": "lognormal mixture", "components (weight, median s, sigma)": [list(x) for x in p.tool_mix],
                       "cap_s": p.tool_cap_s},
            "time_scale_default": p.time_scale}


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default="r2e,alfworld", help="comma-separated profiles: " + ",".join(make_profiles()))
    p.add_argument("--slots", type=int, default=4, help="parallel slots B")
    p.add_argument("--per-slot", default="4,16", help="N / B values (N = 4B and 16B by default)")
    p.add_argument("--time-scale", type=float, default=None, help="multiply every duration (default: the profile's)")
    p.add_argument("--no-gym-async", action="store_true", help="skip Gymnasium's AsyncVectorEnv")
    p.add_argument("--order-draws", type=int, default=None,
                   help="trace sets in the simulated arrival-order vs longest-first study "
                        "(default 200; 5 at --scale 0; 0 skips it)")
    p.add_argument("--orders", default="arrival",
                   help="start orders of ours: comma-separated of arrival, predicted, clairvoyant")
    p.add_argument("--predict-noise", type=float, default=0.3,
                   help="sigma of the lognormal noise between the earlier epoch the prediction learns from and "
                        "this one (0: the same lengths)")
    p.add_argument("--no-lockstep", action="store_true", help="skip the lockstep schedule")
    p.add_argument("--suffix", default="", help="appended to the result files' name (e.g. _r2e_scale0.01 for a "
                   "slower run kept next to the standard one)")
    args = p.parse_args()
    C.setup_env_vars()
    res = C.Result("bench_trace_rollout" + args.suffix, args)
    tiny = args.scale == 0
    repeats = args.repeats or (1 if tiny else 2)
    b = 2 if tiny else args.slots
    per_slot = [2] if tiny else [int(x) for x in args.per_slot.split(",")]
    profiles = make_profiles()
    res.data["gpu"] = ("no GPU on this machine: generation is a latency model (ttft + tokens / decode speed) of an "
                       "inference server, not a model run; the GPU figure is not measured here")
    res.data["config"] = {"slots": b, "trajectories": [k * b for k in per_slot], "repeats": repeats}
    res.data["profiles"] = {}
    load = LoadSampler()
    for name in [x.strip() for x in args.profiles.split(",") if x.strip()]:
        if name not in profiles:
            res.skip(name, f"unknown profile; known: {sorted(profiles)}")
            continue
        prof = profiles[name]
        scale = args.time_scale if args.time_scale is not None else prof.time_scale
        if tiny:
            scale = scale / 4
        with C.skip_on_error(res, name):
            orders = tuple(x.strip() for x in args.orders.split(",") if x.strip())
            r = asyncio.run(bench_profile(prof, b, [k * b for k in per_slot], repeats, args.seed, scale,
                                          gym_async=not args.no_gym_async, orders=orders,
                                          predict_noise=args.predict_noise, lockstep=not args.no_lockstep))
            r["fit"] = describe(prof)
            draws = args.order_draws if args.order_draws is not None else (5 if tiny else 200)
            r["order_study"] = {str(k * b): order_study(prof, b, k * b, args.seed, draws)
                                for k in per_slot} if draws > 0 else {}
            r["prediction_study"] = {str(k * b): prediction_study(prof, b, k * b, args.seed, draws)
                                     for k in per_slot} if draws > 0 else {}
            for k, o in r["prediction_study"].items():
                print(f"[{name}] N={k}: simulated mean efficiency over {draws} trace sets by prediction noise: " +
                      ", ".join(f"{s} {v:.3f}" for s, v in o["mean_efficiency"].items()), flush=True)
            for k, o in r["order_study"].items():
                print(f"[{name}] N={k}: simulated efficiency over {draws} trace sets: arrival order mean "
                      f"{o['arrival_order']['mean']:.3f} (>= 0.95 in {o['arrival_order']['share_at_least_0.95']:.0%}),"
                      f" longest first mean {o['longest_first']['mean']:.3f}", flush=True)
            res.data["profiles"][name] = r
    res.data["load_average_during_run"] = load.stop()
    return C.finish(res, plot)


def plot(res: C.Result) -> None:
    profs = res.data["profiles"]
    if not profs:
        return
    fig, axes = C.subplots(1, 2, figsize=(12, 4.6))
    colors = {"lockstep": "#d95f02", "gym_async": "#7570b3", "ours": "#1b9e77"}
    labels, x = [], 0
    w = 0.26
    for pname, pr in profs.items():
        for n, d in pr["by_n"].items():
            for j, s in enumerate(("lockstep", "gym_async", "ours")):
                v = d["median"].get(s, {}).get("trajectories_per_s")
                if v:
                    axes[0].bar(x + (j - 1) * w, v, w, color=colors[s], label=s if x == 0 else None)
            ideal = d["ideal_trajectories_per_s"]
            axes[0].hlines(ideal, x - 1.5 * w, x + 1.5 * w, colors="black", linestyles="--",
                           label="ideal bound" if x == 0 else None)
            sim = d["simulated"]
            axes[0].plot([x + w], [d["n"] / sim["ours_s"]], marker="_", ms=18, mew=2, color="#1b9e77",
                         label="ours, zero-overhead simulation" if x == 0 else None, ls="none")
            if "lpt_s" in sim:
                axes[0].plot([x + w], [d["n"] / sim["lpt_s"]], marker="x", ms=6, color="black",
                             label="longest first (clairvoyant), simulation" if x == 0 else None, ls="none")
            axes[0].plot([x - w], [d["n"] / sim["lockstep_s"]], marker="_", ms=18, mew=2, color="#d95f02",
                         label="lockstep, zero-overhead simulation" if x == 0 else None, ls="none")
            r = d["ratios"].get("ours_over_lockstep")
            if r:
                axes[0].text(x, ideal * 1.02, f"{r:.2f}x (sim {sim['ours_over_lockstep']:.2f}x)", ha="center",
                             fontsize=7)
            labels.append(f"{pname}\nN={n}")
            x += 1
    axes[0].set_xticks(range(len(labels)))
    axes[0].set_xticklabels(labels, fontsize=8)
    axes[0].set_ylabel("trajectories / s (median; scaled time)")
    axes[0].set_title("Throughput (text: ours / lockstep)")
    axes[0].legend(fontsize=8)
    # breakdown of ours' slot time
    cats = None
    bottoms = []
    xs = []
    i = 0
    for pname, pr in profs.items():
        for n, d in pr["by_n"].items():
            sh = d.get("ours_breakdown_share") or {}
            if not sh:
                continue
            cats = [c for c in sh if c != "capacity (B x wall)"]
            bottoms.append([max(0.0, sh[c]) for c in cats])
            xs.append(i)
            i += 1
    if cats:
        palette = ["#1b9e77", "#66c2a5", "#e6ab02", "#a6761d", "#7570b3", "#e7298a", "#bbbbbb"]
        base = [0.0] * len(xs)
        for ci, c in enumerate(cats):
            vals = [row[ci] for row in bottoms]
            axes[1].bar(xs, vals, 0.6, bottom=base, label=c, color=palette[ci % len(palette)])
            base = [a + v for a, v in zip(base, vals)]
        axes[1].set_xticks(xs)
        axes[1].set_xticklabels(labels[: len(xs)], fontsize=8)
        axes[1].axhline(0.95, ls="--", color="grey", lw=1)
        axes[1].set_ylabel("share of B x wall (ours)")
        axes[1].set_title("Where ours' slot time goes")
        axes[1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"Trace-driven rollout, B={res.data['config']['slots']} slots (no GPU: latency model)", fontsize=10)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
