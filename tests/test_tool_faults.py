"""Faults of the tools layer that model output or a user's tool cause, each a handled observation (never an exception
to the trainer): an async tool that blocks the event loop past its timeout, a reply over ``max_action_length``, a
float for an ``int`` argument, a reward function that raises, and an env id registered twice.  Real components:
the Gymnasium registry, the environment on a real event loop, jsonschema, the rollout with the Qwen3 tokenizer and
the env's expert (no model is needed)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import re
import sys
import textwrap
import threading
import time

import gymnasium
import pytest

from agentfly_gym.errors import ConfigError
from agentfly_gym.tools import make_tool_env, tool


def _call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _env(env_id: str, tools, reward=lambda completion, **row: 1.0, **kw):
    return gymnasium.make(make_tool_env(env_id, tasks=[{"prompt": "p", "answer": "5"}], tools=tools, reward=reward,
                                        replace=True, **kw)).unwrapped


# ----------------------------------------------------------------------------- (1) what a timeout can stop
@tool(timeout=0.3)
async def hog(seconds: float) -> str:
    """Block the event loop (a blocking call inside async def: the fault under test).

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "late result"


@tool(timeout=5)
async def slow_step(seconds: float) -> str:
    """Block the loop briefly, within the timeout.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "in time"


#: Lets :func:`sleepy`'s blocked calls go (a test sets it; a timer sets it at the latest 60 s later).
RELEASE = threading.Event()


@tool(timeout=0.3)
def sleepy(seconds: float) -> str:
    """A sync tool: runs on a thread of its own; ``seconds`` < 0 blocks until :data:`RELEASE` is set.

    Args:
        seconds: how long
    """
    if seconds < 0:
        RELEASE.wait()
    else:
        time.sleep(seconds)
    return "slept"


async def test_an_async_tool_that_blocks_the_loop_past_its_timeout_is_reported_and_its_result_dropped(caplog):
    """Its timeout cannot interrupt ``time.sleep`` on the loop: while it holds the loop past its deadline, the watchdog
    thread logs a WARNING naming the line; when it returns, the model gets a timeout error, not the late result, and
    the episode goes on.  A step that stalls the loop within the timeout is logged once per tool."""
    env = _env("test/Hog-v0", [hog, slow_step])
    await env.areset(seed=0)
    with caplog.at_level(logging.WARNING, logger="agentfly_gym.tools.stalls"):
        obs, reward, terminated, truncated, info = await env.astep(_call("hog", seconds=1.2))
    assert "late result" not in obs, obs
    held_s = re.fullmatch(r"Error: the tool 'hog' blocked the event loop for (\d+\.\d) s, past its timeout of 0\.3 s.*",
                          obs, re.DOTALL)
    assert held_s and float(held_s[1]) >= 1.2, obs  # at least its 1.2 s sleep (more on a loaded machine)
    assert (reward, terminated, truncated, info["error"], info["tool_errors"]) == (0.0, False, False, None, 1)
    held = [r.getMessage() for r in caplog.records if "has held the event loop" in r.getMessage()]
    assert len(held) == 1 and "every rollout on this loop is stalled" in held[0], caplog.text
    lines, first = inspect.getsourcelines(hog.fn)
    sleep_line = first + next(i for i, line in enumerate(lines) if "time.sleep" in line)
    assert f"at {__file__}:{sleep_line}:" in held[0], held[0]          # the line the tool is blocked at
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentfly_gym.tools.stalls"):
        obs, *_ = await env.astep(_call("slow_step", seconds=1.1))
        assert obs == "in time"
        obs, *_ = await env.astep(_call("slow_step", seconds=1.1))
        assert obs == "in time"
    stalls = [r for r in caplog.records if "held the event loop for" in r.getMessage()]
    assert len(stalls) == 1 and "'slow_step'" in stalls[0].getMessage(), caplog.text
    await env.aclose()


async def test_a_sync_tool_keeps_its_thread_and_its_timeout():
    """A sync tool blocked past its timeout is abandoned at the timeout, while it is still blocked, and the loop keeps
    running meanwhile (a heartbeat on the same loop ticks); a quick call of it answers."""
    env = _env("test/Sleepy-v0", [sleepy])
    await env.areset(seed=0)
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    RELEASE.clear()
    safety = threading.Timer(60, RELEASE.set)  # a step that waited for the tool would end here, and fail below
    safety.start()
    beat = asyncio.create_task(heartbeat())
    try:
        obs, *_ = await env.astep(_call("sleepy", seconds=-1))
        returned_while_blocked = not RELEASE.is_set()
    finally:
        beat.cancel()
        RELEASE.set()
        safety.cancel()
    assert "did not finish within its timeout of 0.3 s" in obs and returned_while_blocked, obs
    assert ticks >= 1, "the loop never ticked while the sync tool ran: it blocked the loop"
    obs, *_ = await env.astep(_call("sleepy", seconds=0.01))
    assert obs == "slept"
    await env.aclose()


# ----------------------------------------------------------------------------- (2) a reply over max_action_length
@tool
def echo(text: str) -> int:
    """Count characters.

    Args:
        text: anything
    """
    return len(text)


async def test_a_reply_over_max_action_length_is_said_to_be_cut():
    env = _env("test/Cut-v0", [echo])
    limit = env.max_action_length
    assert limit == 65536
    await env.areset(seed=0)
    reply = _call("echo", text="x" * 70_000)                    # the cut falls inside the call
    obs, reward, terminated, truncated, info = await env.astep(reply)
    assert obs.startswith(f"Error: your reply was cut at 65,536 characters (it had {len(reply):,}; the rest was "
                          "dropped), so its tool call could not be read whole"), obs
    assert info["reply_cut"] == len(reply) - limit
    assert (terminated, truncated, info["error"]) == (False, False, None)
    reply = _call("echo", text="abc") + " " * 70_000              # the call is whole; the tail is lost
    obs, *_, info = await env.astep(reply)
    assert obs == f"Note: your reply was cut at 65,536 characters (it had {len(reply):,}; the rest was dropped).\n3"
    assert info["reply_cut"] == len(reply) - limit
    obs, *_, info = await env.astep(_call("echo", text="abc"))
    assert (obs, info["reply_cut"]) == ("3", 0)
    obs, reward, terminated, truncated, info = await env.astep("5" * 70_000)   # an answer: scored, cut recorded
    assert (reward, terminated, info["reply_cut"]) == (1.0, True, 70_000 - limit)
    await env.aclose()


# ----------------------------------------------------------------------------- (3) a float for an int
@tool
def kinds(a: int, xs: list[int], pair: tuple[int, str], opt: int | None = None, num: float = 0.0,
          either: int | float = 0) -> str:
    """Name the types the function received.

    Args:
        a: an integer
        xs: integers
        pair: an integer and a string
        opt: an optional integer
        num: a number
        either: an integer or a number
    """
    return " ".join(type(v).__name__ for v in (a, *xs, pair[0], opt, num, either))


async def test_an_integral_float_for_an_int_is_the_int_and_a_fraction_is_refused():
    """JSON Schema counts 2.0 as an integer: the function gets 2 (pydantic's lax mode does the same in MCP's and
    OpenAI's Python tool servers); 2.5 or true for an int is an error message to the model."""
    env = _env("test/Ints-v0", [kinds])
    await env.areset(seed=0)
    obs, *_, info = await env.astep(_call("kinds", a=2.0, xs=[1.0, 3], pair=[4.0, "s"], opt=5.0, num=6.0, either=7.0))
    assert obs == "int int int int int float float"
    assert info["tool_errors"] == 0
    for bad, why in [({"a": 2.5}, "bad argument 'a' for 'kinds': 2.5 is not of type 'integer'"),
                     ({"a": True}, "bad argument 'a' for 'kinds': True is not of type 'integer'"),
                     ({"xs": [1, 2.5]}, "bad argument 'xs.1' for 'kinds': 2.5 is not of type 'integer'")]:
        args = {"a": 1, "xs": [], "pair": [1, "s"], **bad}
        obs, reward, terminated, truncated, info = await env.astep(_call("kinds", **args))
        assert obs == f"Error: {why}" and not (terminated or truncated) and info["tool_errors"] == 1, (bad, obs)
    assert kinds.coerce_arguments({"a": 2.0, "xs": [3.0]}) == {"a": 2, "xs": [3]}
    assert type(kinds.coerce_arguments({"num": 2.0})["num"]) is float
    await env.aclose()


# ----------------------------------------------------------------------------- (4) a reward that raises
async def test_a_reward_that_raises_has_no_score_and_is_counted(test_data):
    from agentfly_gym.rollout.episode import play_episode
    from agentfly_gym.rollout.policies.factory import make_policy
    from agentfly_gym.rollout.summary import summarize

    def bad(completion: str) -> float:
        raise ValueError("no reference")

    env = _env("test/NoScore-v0", [echo], reward=bad)
    await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep("5")
    assert info["score"] is None
    assert info["won"] is False
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["error"] == info["reward_error"] == "the reward function failed: ValueError: no reference"
    await env.aclose()

    env_id = make_tool_env("test/NoScoreRollout-v0", tasks=[{"prompt": "2+3?"}], tools=[echo], reward=bad,
                           expert=lambda row, messages: "5", replace=True)
    policy, chat = make_policy("expert", tokenizer=str(test_data / "tokenizers" / "qwen3"))
    traj = await play_episode(env_id, policy, chat, max_turns=2, seed=0)
    assert traj.status == "error"
    assert traj.reward_error == traj.error == "the reward function failed: ValueError: no reference"
    assert traj.turns[-1].info["score"] is None
    summary = summarize([traj], 1.0)
    assert (summary["errors"], summary["reward_errors"]) == (1, 1)
    assert json.loads(json.dumps(traj.to_record()))["reward_error"] == traj.reward_error


# ----------------------------------------------------------------------------- (5) an id registered twice
def _exact(completion: str, answer: str, **row) -> float:
    return float(answer in completion)


def test_an_id_registered_to_another_env_is_refused_unless_replace():
    tasks = [{"prompt": "2+3?", "answer": "5"}]
    env_id = make_tool_env("test/Twice-v0", tasks=tasks, tools=[echo], reward=_exact, replace=True)
    assert make_tool_env("test/Twice-v0", tasks=tasks, tools=[echo], reward=_exact) == env_id   # the same definition
    with pytest.raises(ConfigError, match=r"env_id='test/Twice-v0' is already registered, to another tool environment"
                                          r".*pass replace=True"):
        make_tool_env("test/Twice-v0", tasks=tasks, tools=[echo], reward=lambda completion: 0.0)
    with pytest.raises(ConfigError, match="already registered"):
        make_tool_env("test/Twice-v0", tasks=tasks + [{"prompt": "1+1?", "answer": "2"}], tools=[echo], reward=_exact)
    with pytest.raises(ConfigError, match="already registered"):
        make_tool_env("test/Twice-v0", tasks=tasks, tools=[echo], reward=_exact, max_turns=3)
    env = gymnasium.make(env_id)
    env.reset(seed=0)
    assert env.step("5")[1] == 1.0                                    # the first registration still holds
    env.close()
    make_tool_env("test/Twice-v0", tasks=tasks, tools=[echo], reward=lambda completion: 0.5, replace=True)
    env = gymnasium.make(env_id)
    env.reset(seed=0)
    assert env.step("5")[1] == 0.5
    env.close()
    with pytest.raises(ConfigError, match="'CartPole-v1' is already registered, to"):
        make_tool_env("CartPole-v1", tasks=tasks, tools=[echo], reward=_exact)
    assert gymnasium.spec("CartPole-v1").entry_point == "gymnasium.envs.classic_control.cartpole:CartPoleEnv"


def _reward_for(target: str):
    def reward(completion: str, **row) -> float:
        return float(target in completion)
    return reward


def _reward_with_default(target: str):
    return lambda completion, target=target, **row: float(target in completion)   # no closure: a default


def test_closures_of_one_factory_over_different_values_are_different_envs():
    """Two rewards made by one factory (one code location) capturing different values are two definitions: the
    second registration is refused (it used to be taken for the first and silently kept the first's reward)."""
    tasks = [{"prompt": "2+3?", "answer": "5"}]
    env_id = make_tool_env("test/Closure-v0", tasks=tasks, tools=[echo], reward=_reward_for("5"), replace=True)
    assert make_tool_env(env_id, tasks=tasks, tools=[echo], reward=_reward_for("5")) == env_id  # equal captures
    with pytest.raises(ConfigError, match="already registered, to another tool environment"):
        make_tool_env(env_id, tasks=tasks, tools=[echo], reward=_reward_for("6"))
    make_tool_env("test/Closure3-v0", tasks=tasks, tools=[echo], reward=_reward_with_default("5"), replace=True)
    make_tool_env("test/Closure3-v0", tasks=tasks, tools=[echo], reward=_reward_with_default("5"))
    with pytest.raises(ConfigError, match="already registered"):                 # a default argument differs
        make_tool_env("test/Closure3-v0", tasks=tasks, tools=[echo], reward=_reward_with_default("6"))
    with pytest.raises(ConfigError, match="already registered"):                 # a tool's closure differs
        make_tool_env(env_id, tasks=tasks, tools=[tool(_adder(1))], reward=_reward_for("5"))
    make_tool_env("test/Closure2-v0", tasks=tasks, tools=[tool(_adder(1))], reward=_reward_for("5"), replace=True)
    with pytest.raises(ConfigError, match="already registered"):
        make_tool_env("test/Closure2-v0", tasks=tasks, tools=[tool(_adder(2))], reward=_reward_for("5"))
    make_tool_env("test/Closure2-v0", tasks=tasks, tools=[tool(_adder(1))], reward=_reward_for("5"))
    env = gymnasium.make(env_id)
    env.reset(seed=0)
    assert env.step("5")[1] == 1.0
    assert env.unwrapped.reward_fn.__closure__[0].cell_contents == "5"
    env.close()
    # captured sets, bytes and arrays count by value; a captured list that holds itself is no RecursionError
    import numpy as np

    for one, other in (({3}, {4}), (b"a", b"b"), (np.array([1, 2]), np.array([1, 3]))):
        make_tool_env("test/Captured-v0", tasks=tasks, tools=[echo], reward=_reward_for_value(one), replace=True)
        make_tool_env("test/Captured-v0", tasks=tasks, tools=[echo], reward=_reward_for_value(one))
        with pytest.raises(ConfigError, match="already registered"):
            make_tool_env("test/Captured-v0", tasks=tasks, tools=[echo], reward=_reward_for_value(other))
    loop: list = [1]
    loop.append(loop)
    make_tool_env("test/Captured-v0", tasks=tasks, tools=[echo], reward=_reward_for_value(loop), replace=True)
    make_tool_env("test/Captured-v0", tasks=tasks, tools=[echo], reward=_reward_for_value(loop))
    # a make_env that builds a fresh client object for its reward each call stays one definition
    make_tool_env("test/Client-v0", tasks=tasks, tools=[echo], reward=_reward_with_client(_Client()), replace=True)
    make_tool_env("test/Client-v0", tasks=tasks, tools=[echo], reward=_reward_with_client(_Client()))


def _reward_for_value(value):
    def reward(completion: str, **row) -> float:
        return float(value is not None and row["answer"] in completion)
    return reward


class _Client:
    """Stands for an API client a reward calls (not plain data)."""


def _reward_with_client(client: _Client):
    def reward(completion: str, **row) -> float:
        return float(client is not None and row["answer"] in completion)
    return reward


def _adder(k: int):
    def add_k(a: int) -> int:
        """Add a constant.

        Args:
            a: the number
        """
        return a + k
    return add_k


def test_a_module_imported_twice_registers_its_env_once_and_the_cli_reference_still_works(tmp_path, monkeypatch):
    """A user's module that registers its env at import, imported under two names (as a script is: ``__main__`` and
    by name), defines the same env twice: no error; ``--env twicetasks:make_env`` then calls ``make_env`` once more."""
    from agentfly_gym.registration import normalize_env_id

    source = textwrap.dedent('''
        from agentfly_gym.tools import make_tool_env, tool

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first number
                b: the second number
            """
            return a + b

        def make_env():
            return make_tool_env("user/Twice-v0", tasks=[{"prompt": "2+3?", "answer": "5"}], tools=[add],
                                 reward=lambda completion, answer, **row: float(answer in completion))

        ENV_ID = make_env()
    ''')
    (tmp_path / "twicetasks.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    if "user/Twice-v0" in gymnasium.registry:   # a rerun of this test in one process
        del gymnasium.registry["user/Twice-v0"]
    first = importlib.import_module("twicetasks")
    spec = importlib.util.spec_from_file_location("twicetasks_again", tmp_path / "twicetasks.py")
    second = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(second)                                   # a second import of the same file
    assert first.ENV_ID == second.ENV_ID == "user/Twice-v0"
    assert first.add is not second.add
    assert normalize_env_id("twicetasks:make_env") == "user/Twice-v0"
    env = gymnasium.make("user/Twice-v0")
    env.reset(seed=0)
    assert env.step(_call("add", a=2, b=3))[0] == "5"
    env.close()
    sys.modules.pop("twicetasks", None)


# ----------------------------------------------------------------------------- (6) sys.exit and unshowable results
@tool
def cli(argv: str) -> str:
    """Run a small command line (argparse: bad arguments call sys.exit(2)).

    Args:
        argv: the arguments, separated by spaces
    """
    import argparse

    p = argparse.ArgumentParser(prog="cli", exit_on_error=False)
    p.add_argument("--n", type=int, required=True)
    return str(p.parse_args(argv.split()).n * 2)


@tool
async def quit_async(code: int) -> str:
    """Exit the interpreter from a coroutine.

    Args:
        code: the exit status
    """
    sys.exit(code)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


@tool
def odd_result(kind: str) -> object:
    """Return something that cannot be shown as text.

    Args:
        kind: "deep" or "unprintable"
    """
    if kind == "deep":
        out: list = []
        for _ in range(100_000):
            out = [out]
        return out
    return _Unprintable()


def test_sys_exit_in_a_tool_or_a_reward_is_an_observation_not_a_hang():
    """A sync tool whose argparse calls ``sys.exit(2)``, an async tool calling ``sys.exit`` and a reward raising
    ``SystemExit`` each give a handled observation through the Gym API (which runs on a background loop: a
    ``SystemExit`` reaching that loop stopped it, and ``step`` waited forever); the episode goes on after a tool's."""
    env = gymnasium.make(make_tool_env("test/Exit-v0", tasks=[{"prompt": "p", "answer": "5"}],
                                       tools=[cli, quit_async], reward=lambda completion, **row: sys.exit(3),
                                       replace=True))
    try:
        env.reset(seed=0)
        obs, reward, term, trunc, info = env.step(_call("cli", argv="--m 1"))
        assert "Error: the tool 'cli' raised" in obs and "SystemExit(2)" in obs and not (term or trunc), obs
        obs, *_ = env.step(_call("quit_async", code=4))
        assert "Error: the tool 'quit_async' raised SystemExit: 4" in obs, obs
        obs, *_ = env.step(_call("cli", argv="--n 21"))
        assert obs == "42", obs
        obs, reward, term, trunc, info = env.step("The answer is 5.")
        assert trunc and info["score"] is None and "SystemExit" in info["reward_error"], info
    finally:
        env.close()


async def test_a_result_that_cannot_be_shown_is_an_error_to_the_model():
    env = _env("test/Odd-v0", [odd_result])
    await env.areset(seed=0)
    for kind, says in (("deep", "RecursionError"), ("unprintable", "no text")):
        obs, reward, term, trunc, info = await env.astep(_call("odd_result", kind=kind))
        assert obs.startswith("Error: the result of the tool 'odd_result' could not be shown") and says in obs, obs
        assert not (term or trunc) and info["error"] is None, info
    await env.aclose()


# ----------------------------------------------------------------------------- (7) a mistyped argument
def test_a_mistyped_argument_is_a_config_error_naming_it_and_the_close_match():
    """``max_turn=`` (for ``max_turns``) used to reach the base constructor as a bare TypeError."""
    with pytest.raises(ConfigError, match=r"unknown tool environment argument 'max_turn' \(did you mean "
                                          r"'max_turns'\?\); the arguments are \[.*'step_timeout'"):
        make_tool_env("test/Typo-v0", tasks=[{"prompt": "p", "answer": "a"}], tools=[echo], reward=_exact, max_turn=3)
    assert "test/Typo-v0" not in gymnasium.registry
    env_id = make_tool_env("test/Typo-v0", tasks=[{"prompt": "p", "answer": "a"}], tools=[echo], reward=_exact, replace=True)
    with pytest.raises(ConfigError, match=r"'step_timout' \(did you mean 'step_timeout'\?\), 'zzz';"):
        gymnasium.make(env_id, step_timout=5, zzz=1)                 # gymnasium.make's overrides too
