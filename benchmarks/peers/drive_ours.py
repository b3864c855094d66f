"""agentfly-gym's driver: a tool environment (``ToolEnv``: the tool declares its container, the resource manager
pools it), chain rollouts with the token-faithful policy over the replay server's ``/v1/completions``, every
trajectory its own asyncio task (``run_chain_episode``), at most ``n`` in flight, one ``ResourceManager``.

Settings (the library's defaults, recorded in the JSON): container pool ``max_instances = n`` (one per rollout in
flight), Docker backend, a container kept per rollout across its turns and reset (replaced) on reuse by the next
rollout; ``ModelAPISpec(max_instances=n)`` requests in flight.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import workload as W


def _turn_ids(traj: Any) -> list[list[int]]:
    """The sampled ids of each turn (the mask-1 runs of the response), as a trainer gets them."""
    out: list[list[int]] = []
    prev = 0
    for tok, m in zip(traj.response_ids, traj.response_mask):
        if m == 1:
            if prev == 0:
                out.append([])
            out[-1].append(int(tok))
        prev = m
    return out


async def main(a: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.resources.spec import ContainerSpec, ModelAPISpec
    from agentfly_gym.rollout import run_chain_episode
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.policies.base import SamplingParams
    from agentfly_gym.rollout.policies.openai_policy import OpenAITokenPolicy
    from agentfly_gym.tools import ToolEnv, tool

    n, total, wl = a["n"], a["total"], a["workload"]
    steps: list[list[float]] = []
    # the library's defaults (disk limit on a volume of its own, 1 CPU, 1 GiB, 256 pids); the "ours-nolimits"
    # variant drops the disk volume, which the peers' containers do not have either
    limits = {"disk": None} if a.get("variant") == "nolimits" else {}
    # the "ours-sandbox" variant runs the same image's file system (the project's base image, which the benchmark's
    # image only labels) on the library's daemon-less sandbox backend instead of Docker
    backend = {"backend": "sandbox", "sandbox_image": "agentfly/base"} if a.get("variant") == "sandbox" else \
        {"backend": "docker"}
    box_spec = ContainerSpec(image=W.IMAGE, max_instances=n, name="bench-peers", **backend, **limits)

    if wl == "container":
        @tool(resources={"box": box_spec}, timeout=600)
        async def run(cmd: str, box: Any) -> str:
            """Run a shell command in the task's container and return its output.

            Args:
                cmd: the command
            """
            r = await box.exec(cmd, timeout=600)
            return r.output if hasattr(r, "output") else str(r)
        tools = [run]
    else:
        @tool
        def lookup(key: str) -> str:
            """Look a key up in the task's table.

            Args:
                key: the key
            """
            return W.lookup(key)
        tools = [lookup]

    tasks = [{"id": f"t{k}", "prompt": W.prompt(k)} for k in range(total)]
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    chat = ChatTokenizer(tok)
    sampling = SamplingParams(max_tokens=256, temperature=1.0)
    sem = asyncio.Semaphore(n)
    ids: dict[str, list[list[int]]] = {}
    errors: list[str] = []
    async with ResourceManager() as m:
        api = await m.acquire_global(ModelAPISpec(base_url=a["url"], model="replay", max_instances=n,
                                                  request_timeout=600))
        policy = OpenAITokenPolicy(api, tok)
        t0 = time.monotonic()

        async def one(k: int) -> bool:
            async with sem:
                env = ToolEnv(tasks=tasks, tools=tools, reward=lambda completion, **row: 1.0, system_prompt=W.SYSTEM,
                              max_turns=200, manager=m, step_timeout=None)
                try:
                    traj = await run_chain_episode(env, policy, chat, sampling=sampling, max_turns=200,
                                                   options={"index": k}, trajectory_id=f"t{k}")
                finally:
                    await env.aclose()
            for t, turn in enumerate(traj.turns):
                if not turn.terminated and not turn.truncated:
                    steps.append([k, t, turn.env_s])
            ids[str(k)] = _turn_ids(traj)
            if traj.error:
                errors.append(f"t{k}: {traj.error}")
            return bool(traj.turns and traj.turns[-1].terminated)

        done = await asyncio.gather(*(one(k) for k in range(total)))
        wall = time.monotonic() - t0
        pool = m.metrics().get(box_spec.key) if wl == "container" else None
    return {"wall_s": wall, "trajectories": sum(done), "steps": steps, "ids": ids, "errors": errors[:5],
            "pool": pool, "notes": "ids: the trajectory's sampled token ids (mask 1), per turn"}


if __name__ == "__main__":
    W.emit(asyncio.run(main(W.parse_args())))
