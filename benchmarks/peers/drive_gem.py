"""GEM's driver: ``gem.Env`` subclasses stepped through GEM's own vector env (``gem.vector.AsyncVectorEnv``, a
thread pool stepping every env of the batch, autoreset ``SAME_STEP``), the loop of GEM's examples: generate for
every env of the batch (the requests of one step in flight together), then ``vec_env.step(actions)``; a finished
env resets into the next task.  ``num_envs = n``; GEM has no container support: the tool's user code starts a
container per rollout with docker-py.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as W
from gem.core import Env
from gem.vector.async_vector_env import AsyncVectorEnv


class BenchEnv(Env):
    """Env i plays tasks i, i + n, i + 2n, ... (one per reset)."""

    def __init__(self, i: int, n: int, total: int, workload: str, run_id: str) -> None:
        super().__init__()
        self.i, self.n, self.total, self.workload, self.run_id = i, n, total, workload, run_id
        self.episode = -1
        self.k = -1
        self.task: W.TextTask | None = None
        self.steps: list[list[float]] = []
        self.turn = 0

    def reset(self, seed=None):
        if self.task is not None:
            self.task.close()
        self.episode += 1
        self.k = self.i + self.episode * self.n
        self.task = W.TextTask(self.workload, self.run_id)
        self.turn = 0
        return W.prompt(self.k), {"k": self.k}

    def step(self, action):
        if self.k >= self.total:  # no task left: idle
            return "", 0.0, True, False, {"k": self.k}
        obs, done, secs = self.task.step(action)
        if not done:
            self.steps.append([self.k, self.turn, secs])
        self.turn += 1
        return obs, float(done), done, False, {"k": self.k}


async def main(a: dict[str, Any]) -> dict[str, Any]:
    from openai import AsyncOpenAI

    n, total, wl = a["n"], a["total"], a["workload"]
    client = AsyncOpenAI(base_url=a["url"], api_key="none", max_retries=0, timeout=600)
    envs = [BenchEnv(i, n, total, wl, a["run_id"]) for i in range(n)]
    vec = AsyncVectorEnv(env_ids=["bench"] * n, env_fns=[lambda e=e: e for e in envs])
    tools = W.tools_for(wl)
    t0 = time.monotonic()
    obs, _ = await asyncio.to_thread(vec.reset)
    chats = [[{"role": "system", "content": W.SYSTEM}, {"role": "user", "content": o}] for o in obs]
    texts: dict[str, list[str]] = {}
    finished = 0
    while any(e.k < total for e in envs):
        live = [i for i, e in enumerate(envs) if e.k < total]

        async def gen(i: int) -> str:
            r = await client.chat.completions.create(model="replay", messages=chats[i], tools=tools, max_tokens=256)
            return W.action_text(r.choices[0].message)

        acts = dict(zip(live, await asyncio.gather(*(gen(i) for i in live))))
        ks = {i: envs[i].k for i in live}
        obs, _, term, trunc, _ = await asyncio.to_thread(vec.step, acts)
        for j, i in enumerate(live):
            texts.setdefault(str(ks[i]), []).append(acts[i])
            if term[j] or trunc[j]:
                finished += 1
                chats[i] = [{"role": "system", "content": W.SYSTEM}, {"role": "user", "content": obs[j]}]
            else:
                chats[i] = chats[i] + [{"role": "assistant", "content": acts[i]}, {"role": "tool", "content": obs[j]}]
    wall = time.monotonic() - t0
    for e in envs:
        if e.task is not None:
            e.task.close()
    steps = [s for e in envs for s in e.steps]
    return {"wall_s": wall, "trajectories": finished, "steps": steps, "texts": texts, "errors": [],
            "notes": "text only: a trainer re-tokenizes the replies (texts)"}


if __name__ == "__main__":
    W.emit(asyncio.run(main(W.parse_args())))
