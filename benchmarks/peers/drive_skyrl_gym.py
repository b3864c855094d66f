"""skyrl-gym's driver: a ``skyrl_gym.envs.base_text_env.BaseTextEnv`` per trajectory (``init`` / ``step`` /
``close``, the env API skyrl-gym ships), driven as skyrl-train's generator drives it: every trajectory its own
asyncio task, model calls through the OpenAI client, ``env.step`` in a thread pool (the generator's
``run_in_executor``), at most ``n`` trajectories in flight.  skyrl-gym has no container support: the tool's user
code starts a container per rollout with docker-py.

The generator itself (skyrl-train) is not run: it needs torch, Ray and an inference engine client of its own
(vLLM/SGLang), which this CPU-only harness cannot install and start within its budget (see the docs page).
"""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as W
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class BenchEnv(BaseTextEnv):
    def __init__(self, workload: str, run_id: str, max_turns: int = 200) -> None:
        super().__init__()
        self.max_turns = max_turns
        self.task = W.TextTask(workload, run_id)
        self.env_s: list[float] = []

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        obs, done, secs = self.task.step(action)
        if not done:
            self.env_s.append(secs)
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "tool", "content": obs}],
                                     reward=1.0 if done else 0.0, done=done or self.turns >= self.max_turns,
                                     metadata={})

    def close(self) -> None:
        self.task.close()


async def main(a: dict[str, Any]) -> dict[str, Any]:
    from openai import AsyncOpenAI

    n, total, wl = a["n"], a["total"], a["workload"]
    client = AsyncOpenAI(base_url=a["url"], api_key="none", max_retries=0, timeout=600)
    pool = ThreadPoolExecutor(max_workers=n)
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(n)
    steps: list[list[float]] = []
    texts: dict[str, list[str]] = {}
    tools = W.tools_for(wl)

    async def one(k: int) -> bool:
        async with sem:
            env = BenchEnv(wl, a["run_id"])
            chat, _ = env.init([{"role": "system", "content": W.SYSTEM}, {"role": "user", "content": W.prompt(k)}])
            out: list[str] = []
            done = False
            try:
                while not done:
                    r = await client.chat.completions.create(model="replay", messages=chat, tools=tools,
                                                             max_tokens=256)
                    action = W.action_text(r.choices[0].message)
                    out.append(action)
                    so = await loop.run_in_executor(pool, env.step, action)
                    chat = chat + [{"role": "assistant", "content": action}] + so["observations"]
                    done = so["done"]
            finally:
                await loop.run_in_executor(pool, env.close)
            steps.extend([k, t, s] for t, s in enumerate(env.env_s))
            texts[str(k)] = out
            return W.parse_call(out[-1]) is None

    t0 = time.monotonic()
    done = await asyncio.gather(*(one(k) for k in range(total)), return_exceptions=True)
    wall = time.monotonic() - t0
    errors = [repr(d) for d in done if isinstance(d, BaseException)]
    return {"wall_s": wall, "trajectories": sum(1 for d in done if d is True), "steps": steps, "texts": texts,
            "errors": errors[:5], "notes": "text only: a trainer re-tokenizes the replies (texts)"}


if __name__ == "__main__":
    W.emit(asyncio.run(main(W.parse_args())))
