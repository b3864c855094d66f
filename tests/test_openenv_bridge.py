"""OpenEnv in both directions (agentfly_gym/bridges/openenv.py), on 127.0.0.1 with openenv-core's own code.

* serving: ``agentfly-gym serve``'s server (OpenEnv's FastAPI app over our environment) in a thread,
  driven by OpenEnv's ``GenericEnvClient``; Chess games against a real Stockfish, the engines pooled by
  the server's one resource manager across client sessions;
* wrapping: OpenEnv's example environment (the echo env that ``openenv init`` generates from the
  package's template) served by the resource manager and played through :class:`OpenEnvEnv`.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest
from waiting import until

pytest.importorskip("openenv.core", reason="pip install 'agentfly-gym[openenv]'")

from openenv.core.generic_client import GenericEnvClient

from agentfly_gym.bridges.openenv import OpenEnvEnv
from agentfly_gym.bridges.openenv_serving import create_openenv_app, serve
from agentfly_gym.cli.serve import serve_main
from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.resources.backends.model_service import free_port
from agentfly_gym.resources.defaults import _default_managers

PUZZLE = "tewjc"  # from the Lichess puzzles in tests/data


class _Server:
    """``serve()`` on its own thread and loop (as ``agentfly-gym serve`` runs it)."""

    def __init__(self, env_id, **kwargs):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready = threading.Event()
        self.loop = None
        self.error = None
        self.stopping = threading.Event()

        def run():
            async def main():
                self.loop = asyncio.get_running_loop()
                await serve(env_id, port=self.port, ready=self.ready, stop=self.stopping, **kwargs)

            try:
                asyncio.run(main())
            except (asyncio.CancelledError, KeyboardInterrupt):
                pass
            except BaseException as e:  # noqa: BLE001
                self.error = e
                self.ready.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.ready.wait(60) and self.error is None, self.error

    def manager(self):
        return _default_managers[self.loop]

    def stop(self):
        self.stopping.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


async def test_openenv_client_plays_our_env_and_sessions_share_the_manager():
    srv = _Server("Chess-v0", env_kwargs={"mode": "play", "max_instances": 1, "engine_depth": 1})
    try:
        a, b = GenericEnvClient(base_url=srv.url), GenericEnvClient(base_url=srv.url)
        r = await a.reset(seed=3)
        assert r.done is False
        assert r.reward is None
        assert "White" in r.observation["text"]
        info = r.observation["info"]
        assert info["step"] == 0
        assert info["won"] is False
        assert "admissible_actions" in info
        move = info["admissible_actions"][0]
        s = await a.step({"text": move})
        assert s.done is False
        assert s.reward == 0.0
        assert s.observation["info"]["step"] == 1
        bad = await a.step({"text": "not-a-move"})                     # a handled observation, not an error
        assert bad.reward == 0.0
        assert not bad.done
        assert bad.observation["text"]
        # a second client waits for the one engine (max_instances=1) until the first session ends
        second = asyncio.create_task(b.reset(seed=4))

        def queued() -> bool:
            return any(p["waiting"] == 1 for k, p in srv.manager().metrics().items() if k.startswith("inprocess"))

        await until(queued, 60, "the second session to wait for the engine")
        assert not second.done()
        await a.close()
        r2 = await asyncio.wait_for(second, 120)
        assert "White" in r2.observation["text"]
        pools = srv.manager().metrics()
        engine = [p for k, p in pools.items() if k.startswith("inprocess")]
        assert len(engine) == 1
        assert engine[0]["started"] == 1
        assert engine[0]["reused"] >= 1
        await b.close()
    finally:
        srv.stop()
    assert srv.manager().closed                                        # serve() released everything


async def test_puzzle_reward_and_task_option_over_openenv():
    srv = _Server("Chess", env_kwargs={"mode": "puzzle"})
    try:
        async with GenericEnvClient(base_url=srv.url) as c:
            r = await c.reset(options={"task_id": PUZZLE})
            assert r.observation["info"]["task_id"] == PUZZLE
            for move in ("e5e3", "f6a1"):   # the moves that solve it in test_verl_plugin's scripted episode
                s = await c.step({"text": move})
                assert s.done is False
                assert s.reward == 0.0
            s = await c.step({"text": "a8a1"})
            assert s.done is True
            assert s.reward == 1.0
            assert s.observation["info"]["won"] is True
            assert (await c.state())["step_count"] == 3
            bad = GenericEnvClient(base_url=srv.url)
            with pytest.raises(Exception, match="no_such_option|unknown"):
                await bad.reset(options={"no_such_option": 1})
            await bad.close()
    finally:
        srv.stop()


def test_serve_command_rejects_bad_input():
    with pytest.raises(SystemExit):
        serve_main(["--env", "Chess-v0"])                               # the protocol must be named
    with pytest.raises(ConfigError, match="unknown environment"):
        create_openenv_app("NoSuchEnv")
    with pytest.raises(ConfigError, match="bad keyword argument 'colour'"):
        create_openenv_app("Chess", env_kwargs={"colour": "red"})
    with pytest.raises(ConfigError) as info:
        create_openenv_app("Chess", max_sessions=0)
    assert info.value.field == "max_sessions"


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
    """OpenEnv's example env, generated by OpenEnv's own ``openenv init`` from its bundled template."""
    import subprocess

    root = tmp_path_factory.mktemp("openenv")
    out = subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "--output-dir", str(root)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (root / "echo_env" / "server" / "app.py").exists()
    sys.path.insert(0, str(root))
    yield "echo_env.server.app:app"
    sys.path.remove(str(root))


@pytest.mark.slow
async def test_openenv_example_env_behind_our_wrapper(echo_env):
    """Two episodes at once through a pool of one server: the second waits, then reuses the same server."""
    async with ResourceManager() as m:
        env = OpenEnvEnv(app=echo_env, action_field="message", observation_field="echoed_message", manager=m,
                         max_instances=1)
        env2 = OpenEnvEnv(app=echo_env, action_field="message", observation_field="echoed_message", manager=m,
                          max_instances=1)
        obs, info = await env.areset(seed=0)
        assert obs == "Echo Env environment ready!"
        assert info["openenv"]["message_length"] == 0
        obs, reward, term, trunc, info = await env.astep("hello")
        assert (obs, reward, term, trunc) == ("hello", pytest.approx(0.5), False, False)   # reward 0.1 per char
        assert info["step"] == 1
        assert info["openenv"]["message_length"] == 5
        waiting = asyncio.create_task(env2.areset(seed=1))
        await until(lambda: any(p["waiting"] == 1 for k, p in m.metrics().items() if k.startswith("inprocess")),
                    60, "env2 to wait for the server")
        assert not waiting.done()                                      # the one server is held by env
        await env.aclose()
        obs2, _ = await asyncio.wait_for(waiting, 60)
        assert obs2 == "Echo Env environment ready!"
        (pool,) = [p for k, p in m.metrics().items() if k.startswith("inprocess")]
        assert pool["started"] == 1
        assert pool["reused"] == 1
        obs, reward, *_ = await env2.astep("abc")
        assert obs == "abc"
        assert reward == pytest.approx(0.3)
        await env2.aclose()
        with pytest.raises(ConfigError, match="exactly one of"):
            OpenEnvEnv(action_field="message")


async def test_a_client_that_disconnects_leaves_no_traceback():
    """OpenEnv's endpoint let the WebSocketDisconnect of its own close() escape after every normal client
    disconnect, and uvicorn logged "Exception in ASGI application" with a 61-line traceback."""
    import logging

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    srv = _Server("Chess-v0")
    handler = Collect(level=logging.ERROR)
    logging.getLogger("uvicorn.error").addHandler(handler)  # after serve() configured uvicorn's logging
    try:
        client = GenericEnvClient(base_url=srv.url)
        r = await client.reset(seed=3)
        assert "Puzzle" in r.observation["text"]
        await client.close()
    finally:
        srv.stop()  # uvicorn's shutdown waits for the connection's app to end: what it logs is in by now
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert not [r.getMessage() for r in records], [r.getMessage() for r in records]
