"""ScienceWorld fidelity: agentfly/ScienceWorld-v0 side by side with the raw ``scienceworld`` package.

The same task, variation, simplification and actions go to the package's own ``ScienceWorldEnv``
(``load`` + ``reset`` + ``step``, PyPI scienceworld 1.2.3) and to ours; every observation string, score,
move count, completion flag and (on some steps) the valid-action list must be equal.  The documented
differences are checked as such: our reset observation is the task description, a blank line and the
package's reset observation (``look around``); our first reward also carries the points a task starts
with (the package's ``reset`` swallows them), so that an episode's return is its final score / 100.
The cases cover the three splits, both simplification settings and invalid commands.  Two real JVMs run.

Upstream quirk: the simulator lists the objects of a room or container in an order that changes from one
load to the next (the package's own ``load`` + ``reset`` of chemistry-mix-paint-secondary-color:27 listed
its three paint cups in three different orders in four loads), so an observation must equal the package's
exactly or up to the order of its listed items (same lines and comma-separated items, as multisets).
The names it gives objects in valid actions vary with that order too ("blue paint on wood cup" in one load,
"blue paint in cup" in the next), so valid-action lists must be equal, or of equal length with the same
actions per verb.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter

import pytest

from agentfly_gym.envs.scienceworld import ScienceWorldEnv
from agentfly_gym.resources.manager import ResourceManager

pytestmark = pytest.mark.timeout(600)

# (task, variation, split, simplification): short gold paths (8-25 steps), one per split, both settings
CASES = [
    ("find-non-living-thing", 0, "train", "easy"),
    ("chemistry-mix-paint-secondary-color", 27, "test", ""),
    ("find-animal", 224, "dev", "easy"),
]
# inserted before the gold path: unknown, empty, free, help and waiting commands (none changes the score);
# a plain ``wait`` (10 ticks) only where the gold path still wins after it (animals move)
EXTRA = ["fly to the moon", "", "inventory", "look at the ceiling", "task", "help", "wait1"]


def _extra(task: str) -> list[str]:
    return EXTRA + ([] if "animal" in task else ["wait"])


def _same_text(ours: str, theirs: str) -> bool:
    """Equal, or equal up to the order of listed items (the simulator's own listing order varies)."""
    if ours == theirs:
        return True

    def items(text: str) -> Counter:
        return Counter(part.strip() for part in re.split(r"\n|, | and ", text) if part.strip())

    return items(ours) == items(theirs)


def _same_actions(ours: list[str], theirs: list[str]) -> bool:
    """Equal as sets, or of equal length with equal counts per verb (the referents' names vary upstream)."""
    if sorted(ours) == sorted(theirs):
        return True
    return len(ours) == len(theirs) and Counter(a.split()[0] for a in ours) == Counter(a.split()[0] for a in theirs)


@pytest.fixture(scope="module")
def raw_env():
    """The package's own env (one JVM with the same heap limit as ours), shut down for sure at the end."""
    import scienceworld

    old = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = "-Xmx400m"
    try:
        env = scienceworld.ScienceWorldEnv(envStepLimit=10_000)
    finally:
        if old is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = old
    proc: subprocess.Popen = env._gateway.java_process
    yield env
    env.close()
    env.close = lambda: None  # its __del__ would call close() again on a dead gateway
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("task, variation, split, simplification", CASES)
async def test_same_observations_scores_and_flags_as_the_package(raw_env, task, variation, split, simplification):
    raw = raw_env
    raw.load(task, variation, simplification, generateGoldPath=True)
    gold = raw.get_gold_action_sequence()
    assert variation in getattr(raw, f"get_variations_{split}")()
    raw_obs, raw_info = raw.reset()
    raw_start = raw_info["score"]

    async with ResourceManager() as manager:
        env = ScienceWorldEnv(manager=manager, max_instances=1, split=split, simplification=simplification,
                              with_admissible_actions=True)
        obs, info = await env.areset(options={"task_name": task, "variation": variation})
        assert env._sim.resource.obj.java_fold, "steps go through the Java fold (java_fold.py)"
        assert _same_text(obs, f"{raw_info['taskDesc'].strip()}\n\n{raw_obs.strip()}")  # taskDesc: freeActionTaskDesc
        assert (info["score"], info["moves"]) == (raw_start, raw_info["moves"])
        assert _same_actions(info["admissible_actions"], raw_info["valid"])

        ret, raw_done = 0.0, False
        actions = _extra(task) + gold
        for t, action in enumerate(actions):
            raw_obs, raw_reward, raw_done, raw_info = raw.step(action)
            obs, reward, terminated, truncated, info = await env.astep(action)
            where = f"{task}:{variation} step {t} {action!r}"
            assert _same_text(obs, raw_obs), where
            assert (info["score"], info["moves"]) == (raw_info["score"], raw_info["moves"]), where
            assert terminated == raw_done and not truncated, where
            expected = raw_reward + (raw_start if t == 0 else 0)
            assert round(reward * 100) == expected, where
            if t < len(_extra(task)) + 2 or terminated:
                assert _same_actions(info["admissible_actions"], raw_info["valid"]), where
            ret += reward
            if terminated:
                break
        assert raw_done and terminated, "the gold path ends the episode in both, at the same step"
        assert info["won"]
        assert raw_info["score"] == 100
        assert ret == pytest.approx(raw_info["score"] / 100)
        await env.aclose()
