"""Record a few trajectories (token ids, masks, logprobs, turns, step rows) as canonical JSON.

Used by ``tests/test_episode_golden.py`` to check that refactoring the episode loop leaves every
token-faithful output byte-identical; the reference file ``tests/data/golden_episodes.json`` was
written by the code before the refactoring with::

    AGENTFLY_GYM_DATA=tests/data python3 tests/golden_episodes.py --write

(the data root the tests use).  The two SmolLM2 cases were recorded again when sampling moved onto the model's
device (one uniform draw per row from its own generator, then an inverse-CDF search): the same seed draws other
tokens than the host-side ``torch.multinomial`` did; every other case was unchanged by that re-recording.

Cases: the runner (``run_rollouts``) on Chess in chain and step mode with the seeded random policy,
the expert and the bundled SmolLM2 (seeded sampling), one trajectory at a time so that neither the
order of the random policy's draws nor a model batch depends on scheduling; and the episode
functions on one short ALFWorld game in both modes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden_episodes.json"

# a quick game of ALFWorld's valid_seen (a 3-4 step plan)
ALFWORLD_TASK = "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704"

_VOLATILE_TURN_KEYS = ("generate_s", "env_s")


#: Fields recorded since the golden file was written (schema version 3: tests/test_truncation.py and
#: tests/test_reward_errors.py pin them; version 4's scope_id, the rollout scope's id, fresh per episode; version
#: 5's text_only, tests/test_endpoint_policy.py); left out so that everything recorded before is compared as it was.
_ADDED_FIELDS = ("reply_truncated", "context_cut", "reward_error", "scope_id", "text_only")
_ADDED_ROW_FIELDS = ("reply_truncated",)


def canonical(traj) -> dict:
    """The deterministic part of a trajectory as a JSON-able dict (timings dropped)."""
    d = dataclasses.asdict(traj)
    d.pop("timings", None)
    for k in _ADDED_FIELDS:
        d.pop(k, None)
    for t in d["turns"]:
        for k in _VOLATILE_TURN_KEYS:
            t.pop(k, None)
    d["steps"] = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in traj.steps]
    for r in d["steps"]:
        for k in _ADDED_ROW_FIELDS:
            r.pop(k, None)
    return d


def dumps(obj) -> str:
    # NaN (a scripted policy's logprobs) is kept as JSON's NaN extension; floats round-trip exactly
    return json.dumps(obj, sort_keys=True, indent=1, allow_nan=True)


async def record(include_model: bool = True) -> dict[str, list[dict]]:
    import gymnasium

    import agentfly_gym  # noqa: F401
    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.rollout import ExpertPolicy, RandomPolicy, RolloutConfig, SamplingParams, run_rollouts
    from agentfly_gym.rollout import run_chain_episode
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.rollout.step import run_step_episode
    from transformers import AutoTokenizer

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(str(smollm2_dir())))
    out: dict[str, list[dict]] = {}
    async with ResourceManager() as m:
        for mode in ("chain", "step"):
            for name, policy in (("random", RandomPolicy(seed=3)), ("expert", ExpertPolicy())):
                # one at a time: the random policy's one RNG then serves the trajectories in a fixed order
                cfg = RolloutConfig(env_ids=["Chess"], num_trajectories=2, group_size=2, concurrency=1, max_turns=4,
                                    seed=5, mode=mode)
                res = await run_rollouts(cfg, policy, chat, manager=m, progress=False)
                out[f"runner-chess-{mode}-{name}"] = [canonical(t) for t in res.trajectories]
        if include_model:
            from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

            lm = TransformersPolicy(smollm2_dir(), seed=0, max_batch_size=1)
            try:
                lm_chat = ChatTokenizer(lm.tokenizer)
                for mode in ("chain", "step"):
                    cfg = RolloutConfig(env_ids=["Chess"], num_trajectories=1, concurrency=1, max_turns=2, seed=7,
                                        mode=mode, sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=1))
                    res = await run_rollouts(cfg, lm, lm_chat, manager=m, progress=False)
                    out[f"runner-chess-{mode}-smollm2"] = [canonical(t) for t in res.trajectories]
            finally:
                lm.close()
        for mode, fn in (("chain", run_chain_episode), ("step", run_step_episode)):
            for name, policy in (("expert", ExpertPolicy()), ("random", RandomPolicy(seed=1))):
                env = gymnasium.make("agentfly/ALFWorld-v0", manager=m, split="valid_seen").unwrapped
                try:
                    traj = await fn(env, policy, chat, max_turns=4, seed=0, options={"task_id": ALFWORLD_TASK},
                                    trajectory_id=f"alf-{mode}-{name}", group_id="alf")
                finally:
                    await env.aclose()
                out[f"episode-alfworld-{mode}-{name}"] = [canonical(traj)]
    return out


if __name__ == "__main__":
    write = "--write" in sys.argv[1:]  # read first: a simulator library may rewrite sys.argv
    result = asyncio.run(record())
    if write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(dumps(result) + "\n")
        print(f"wrote {GOLDEN} ({len(result)} cases)")
    else:
        print(dumps(result))
