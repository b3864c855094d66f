"""Leases whose holder is gone come back to the pool: an env dropped without aclose(), a cancelled step.

Real Chess envs in play mode on a pool of one real Stockfish engine (``max_instances=1``): the next reset of
another env gets that one engine quickly, or times out (``reset_timeout``) when the lease never came back.
"""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
from proctools import cpu_ticks, live_processes, mark_tree, wait_gone
from waiting import until

from agentfly_gym.envs.chess import ChessEnv
from agentfly_gym.resources import ResourceManager


@pytest.fixture(autouse=True)
def no_leaked_engines(monkeypatch):
    marker = mark_tree(monkeypatch)
    before = live_processes(["stockfish"], marker=marker)
    yield
    assert not wait_gone(live_processes(["stockfish"], marker=marker) - before, 10), "a stockfish process outlived its test"


def _env(m: ResourceManager, **kw) -> ChessEnv:
    return ChessEnv(mode="play", max_instances=1, manager=m, reset_timeout=15.0, **kw)


async def _timed_reset(env: ChessEnv) -> tuple[float, dict]:
    t0 = time.monotonic()
    _, info = await env.areset(seed=1)
    return time.monotonic() - t0, info


@pytest.mark.slow
async def test_an_env_dropped_without_aclose_gives_its_engine_back():
    async with ResourceManager() as m:
        first = _env(m)
        _, info = await first.areset(seed=0)
        await first.astep(info["admissible_actions"][0])  # the engine replied: it is in use by this episode
        pool = next(iter(m.pools.values()))
        assert pool.metrics.in_use == 1
        del first, info
        gc.collect()
        second = _env(m)
        wait, _ = await _timed_reset(second)  # timed out (ResourceTimeout, in_use 1) before the fix
        assert wait < 5 and pool.metrics.started == 1 and pool.metrics.reused == 1, (wait, pool.snapshot())
        await second.aclose()
        assert pool.metrics.in_use == 0


async def test_a_cancelled_deep_search_ends_its_episode_and_stops_the_engine():
    """A step cancelled while Stockfish searches to depth 30 (a minute or more) ends its episode: the engine goes
    back to the pool with its search stopped, so another env's reset on that pool of one gets it at once (it
    never came back before the fix; with the lease back but the search running, the reset waited ~10 s)."""
    async with ResourceManager() as m:
        first = _env(m, engine_depth=30, skill_level=20)
        _, info = await first.areset(seed=0)
        engine = first.scope.resources[first.engine_spec.key].obj.pid
        busy = cpu_ticks(engine)
        step = asyncio.ensure_future(first.astep(info["admissible_actions"][0]))
        await until(lambda: cpu_ticks(engine) >= busy + 20, 60, "Stockfish to search (0.2 s of CPU)")
        assert not step.done()
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        assert not first.scope_is_open
        second = _env(m)
        wait, info = await _timed_reset(second)
        pool = next(iter(m.pools.values()))
        assert wait < 3 and pool.metrics.started == 1, (wait, pool.snapshot())
        *_, info = await second.astep(info["admissible_actions"][0])  # the engine answers the next game
        assert info["error"] is None
        await first.aclose()
        await second.aclose()
