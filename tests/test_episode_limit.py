"""``gymnasium.make(id, max_episode_steps=N)`` reaches every env's own step limit, and a truncation at that
limit releases the episode's resources at once.

Gymnasium's ``make`` does not pass ``max_episode_steps`` to the env: it wraps it in ``TimeLimit``.  The
env reads the value from the ``make`` call (and from a hand-made ``TimeLimit`` at its sync reset), so it
truncates (and releases its rollout scope) itself, also when driven through ``env.unwrapped``'s async API.  Real envs: the five registered ones are only constructed (nothing starts); the
lifecycle is checked on Chess play mode with a real Stockfish engine pool.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest

import agentfly_gym  # noqa: F401  (registers agentfly/*)
from agentfly_gym.registration import ENVS
from agentfly_gym.resources import ResourceManager
from agentfly_gym.utils.aio import run_sync

pytestmark = pytest.mark.timeout(180)

#: What an env needs to be constructed that is not there by default: R2E-Gym reads the locally built task set
#: (built by ``agentfly-gym r2e build-tasks``, minutes) unless given rows; the repository's fixture rows do, so
#: this test does not depend on another test having built that set first.
MAKE_KWARGS = {"R2EGym-v0": {"tasks": str(Path(__file__).parent / "fixtures" / "r2e" / "tasks.jsonl")}}


@pytest.mark.parametrize("name", list(ENVS))
def test_make_max_episode_steps_reaches_the_env(name):
    env_id = f"agentfly/{name}"
    kwargs = MAKE_KWARGS.get(name, {})
    default = gymnasium.make(env_id, **kwargs)
    try:
        own = default.unwrapped.max_episode_steps
    finally:
        default.unwrapped._closed = True  # nothing was acquired: closing needs no event loop
    for n in (3, 250):
        env = gymnasium.make(env_id, max_episode_steps=n, **kwargs)
        try:
            assert env.unwrapped.max_episode_steps == n != own
            assert env.spec.max_episode_steps == n
            # re-making from the spec (which records the TimeLimit's value) keeps the limit
            again = gymnasium.make(env.spec)
            assert again.unwrapped.max_episode_steps == n
            again.unwrapped._closed = True
        finally:
            env.unwrapped._closed = True
    vec = gymnasium.make_vec(env_id, num_envs=2, max_episode_steps=4, **kwargs)
    try:
        assert [e.max_episode_steps for e in vec.envs] == [4, 4]
    finally:
        for e in vec.envs:
            e._closed = True


def test_time_limit_truncation_returns_the_engine_to_the_pool():
    manager = ResourceManager()
    env = gymnasium.make("agentfly/Chess-v0", mode="play", skill_level=0, engine_depth=1, manager=manager,
                         max_episode_steps=2)
    try:
        env.reset(seed=0)
        (pool,) = manager.pools.values()
        assert pool.metrics.in_use == 1
        assert env.step("e4")[2:4] == (False, False)
        _, _, terminated, truncated, info = env.step("d4")
        assert (terminated, truncated, info["step"]) == (False, True, 2)
        assert not env.unwrapped.scope_is_open
        assert pool.metrics.in_use == 0
        # the async API of env.unwrapped (as the rollout runner uses it) has the same limit
        inner = env.unwrapped
        run_sync(inner.areset(seed=0))
        assert run_sync(inner.astep("e4"))[3] is False
        assert run_sync(inner.astep("d4"))[3] is True
        assert pool.metrics.in_use == 0
        assert pool.metrics.idle == 1  # the same engine, back in the pool each time
    finally:
        env.close()
        run_sync(manager.aclose())


def test_hand_made_time_limit_is_adopted_at_reset():
    from agentfly_gym.envs.chess import ChessEnv

    manager = ResourceManager()
    env = gymnasium.wrappers.TimeLimit(ChessEnv(mode="play", skill_level=0, engine_depth=1, manager=manager), 3)
    try:
        assert env.unwrapped.max_episode_steps is None
        env.reset(seed=0)
        assert env.unwrapped.max_episode_steps == 3
        results = [env.step(a)[2:4] for a in ("e4", "d4", "c4")]
        assert results == [(False, False), (False, False), (False, True)]
        (pool,) = manager.pools.values()
        assert not env.unwrapped.scope_is_open
        assert pool.metrics.in_use == 0
    finally:
        env.close()
        run_sync(manager.aclose())
