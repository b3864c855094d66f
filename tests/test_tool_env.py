"""Bring your own task: ``@tool``, ``make_tool_env`` and the tool environment, with real components:
the Gymnasium registry, the resource manager with in-process resources, the chain and step rollouts on the
Qwen3 tokenizer with a scripted policy (the env's expert; no model is needed to check what is rendered)."""

from __future__ import annotations

import asyncio
import json

import gymnasium
import pytest

from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ResourceManager
from agentfly_gym.resources.spec import InProcessSpec
from agentfly_gym.rewards import resourced
from agentfly_gym.tools import ToolCallError, make_tool_env, parse_tool_calls, tool

CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_the_issue_example_works_exactly_as_written():
    import gymnasium
    from agentfly_gym.tools import tool, make_tool_env

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    def exact(completion: str, answer: str, **row) -> float:   # completion: the final assistant message
        return float(answer in completion)

    env_id = make_tool_env("my/Add-v0", tasks=[{"prompt": "What is 2+3?", "answer": "5"}], tools=[add], reward=exact)
    env = gymnasium.make(env_id)
    obs, info = env.reset(seed=0)
    obs, *_ = env.step('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')   # obs holds 5
    assert "5" in obs
    assert _[1:3] == [False, False]
    obs, reward, terminated, truncated, info = env.step("The answer is 5.")               # reward 1.0, episode over
    assert (reward, terminated, truncated, info["error"]) == (1.0, True, False, None)
    assert info["completion"] == "The answer is 5."
    assert add.schema == {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "description": "the first number"},
                                         "b": {"type": "integer", "description": "the second number"}},
        "required": ["a", "b"]}}}
    env.close()


# ----------------------------------------------------------------------------- @tool
def test_tool_errors_name_the_fix():
    def no_hints(a, b):
        """Add.

        Args:
            a: x
            b: y
        """

    with pytest.raises(ConfigError, match=r"argument\(s\) \['a', 'b'\] have no type hint"):
        tool(no_hints)

    def no_doc(a: int) -> int:
        return a

    with pytest.raises(ConfigError, match="has no docstring"):
        tool(no_doc)

    def undocumented(a: int, b: int) -> int:
        """Add.

        Args:
            a: x
        """

    with pytest.raises(ConfigError, match="no description for the argument 'b'"):
        tool(undocumented)

    @tool
    def add(a: int) -> int:
        """Add.

        Args:
            a: x
        """
        return a

    @tool(name="add")
    def other(a: int) -> int:
        """Other.

        Args:
            a: x
        """
        return a

    with pytest.raises(ConfigError, match="two tools are named 'add'"):
        make_tool_env("test/Dup-v0", tasks=[{"prompt": "p"}], tools=[add, other], reward=lambda completion: 0.0)
    with pytest.raises(ConfigError, match="resources \\['box'\\] are not parameters"):
        tool(resources={"box": InProcessSpec(factory="test_tool_env:Counter")})(no_doc)
    with pytest.raises(ConfigError, match="must take a 'completion'"):
        make_tool_env("test/Bad-v0", tasks=[{"prompt": "p"}], tools=[add], reward=lambda answer: 0.0)
    with pytest.raises(ConfigError, match="needs a non-empty str 'prompt'"):
        make_tool_env("test/Bad-v0", tasks=[{"question": "p"}], tools=[add], reward=lambda completion: 0.0)


def test_async_tool_and_resource_parameters_are_left_out_of_the_schema():
    @tool(resources={"counter": InProcessSpec(factory="test_tool_env:Counter")}, timeout=5)
    async def bump(by: int, counter) -> int:
        """Add to the episode's counter.

        Args:
            by: how much to add
        """
        return await counter.call("bump", by)

    assert bump.is_async
    assert bump.timeout == 5
    assert set(bump.resources) == {"counter"}
    assert bump.parameters == {"type": "object", "properties": {"by": {"type": "integer", "description": "how much to add"}},
                               "required": ["by"]}
    assert bump.check_arguments({"by": "two"}) .startswith("bad argument 'by'")
    assert "takes no argument(s) ['counter']" in bump.check_arguments({"by": 1, "counter": 3})


# ----------------------------------------------------------------------------- parsing
def test_parsing_per_family():
    two = CALL_ADD + "\n" + CALL_ADD.replace('"a": 2', '"a": 4')
    assert [c.arguments["a"] for c in parse_tool_calls(two)] == [2, 4]
    llama = '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 3, "b": 4}}'
    assert [(c.name, c.arguments) for c in parse_tool_calls(llama)] == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
    assert parse_tool_calls('{"name": "add", "parameters": {"a": 1, "b": 2}}', "llama3")[0].arguments == {"a": 1, "b": 2}
    mistral = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcdefghi"}]'
    assert parse_tool_calls(mistral)[0].id == "abcdefghi"
    assert parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}')[0].arguments == {"a": 1, "b": 2}
    # special tokens skipped by the decode: the bare JSON list / object still reads as calls
    assert parse_tool_calls('[{"name": "add", "arguments": "{\\"a\\": 1}"}]')[0].arguments == {"a": 1}
    for answer in ("The answer is 5.", '{"answer": 5}', "[1, 2]", "use <tool_response> next time"):
        assert parse_tool_calls(answer) == []
    for bad, why in (('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>', "not valid JSON"),
                     ('<tool_call>\n{"name": "add", "arguments": {"a"', "never closes"),
                     ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
                     ("</tool_call>", "without an opening"),
                     ("<|python_tag|>add(1, 2)", "must be followed by a JSON object"),
                     ("<tool_call>" + "[" * 100_000 + "</tool_call>", "nested too deeply"),
                     ("<|python_tag|>" + "[" * 100_000, "nested too deeply")):
        with pytest.raises(ToolCallError, match=why):
            parse_tool_calls(bad)


# ----------------------------------------------------------------------------- the environment
class Counter:
    """An in-process resource: one per rollout; ``reset`` runs when the pool hands it out again."""

    created = 0

    def __init__(self) -> None:
        Counter.created += 1
        self.n = 0

    def bump(self, by: int) -> int:
        self.n += by
        return self.n

    def reset(self) -> None:
        self.n = 0


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@tool(timeout=0.3)
async def nap(seconds: float, label: str) -> str:
    """Sleep, then say which call this was.

    Args:
        seconds: how long
        label: a name for the call
    """
    await asyncio.sleep(seconds)
    return label


#: The labels of the :func:`meet` calls under way (a test clears it before use).
MEETING: set[str] = set()


@tool(timeout=60)
async def meet(label: str, others: int, linger: float) -> str:
    """Wait until ``others`` other calls of this tool are under way at once, then return after ``linger`` s.

    Args:
        label: a name for the call
        others: how many other calls must be under way
        linger: seconds to wait once they are
    """
    MEETING.add(label)
    while len(MEETING) < others + 1:  # only calls that run at once all get past this (one after another: none)
        await asyncio.sleep(0.01)
    await asyncio.sleep(linger)
    return label


@tool
def broken(x: int) -> int:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError(f"cannot handle {x}")


@tool(finish=True)
def submit(answer: str) -> str:
    """Submit the final answer.

    Args:
        answer: the answer
    """
    return answer


def exact(completion: str, answer: str, **row) -> float:
    return float(answer in completion)


def _call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def _env(**kw):
    tools = kw.pop("tools", [add, nap, broken, submit])
    env_id = make_tool_env("test/Tools-v0", tasks=kw.pop("tasks", [{"prompt": "What is 2+3?", "answer": "5"}]),
                           tools=tools, reward=kw.pop("reward", exact), replace=True, **kw)
    return gymnasium.make(env_id).unwrapped


async def test_faults_are_observations_and_the_episode_goes_on():
    env = await _env()
    await env.areset(seed=0)
    cases = [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>', "could not be parsed: tool call 1 is not valid JSON"),
        (_call("mul", a=1, b=2), "there is no tool named 'mul'; the tools are ['add', 'broken', 'nap', 'submit']"),
        (_call("add", a="two", b=3), "bad argument 'a' for 'add': 'two' is not of type 'integer'"),
        (_call("add", a=1), "'add' is missing required argument(s) ['b']"),
        (_call("broken", x=7), "the tool 'broken' raised RuntimeError: cannot handle 7"),
        (_call("nap", seconds=5, label="slow"), "did not finish within its timeout of 0.3 s"),
        (_call("add", a=[[[[1]]]], b=2), "bad argument 'a' for 'add'"),
    ]
    for reply, message in cases:
        obs, reward, terminated, truncated, info = await env.astep(reply)
        assert message in obs, (reply, obs)
        assert obs.startswith("Error: ")
        assert (reward, terminated, truncated, info["error"]) == (0.0, False, False, None)
        assert info["tool_errors"] == 1
        assert info["tool_messages"][0]["role"] == "tool"
    obs, reward, terminated, truncated, info = await env.astep("It is 5")
    assert (reward, terminated) == (1.0, True)
    await env.aclose()

    @tool
    def flood(n: int) -> str:
        """Return n characters.

        Args:
            n: how many
        """
        return "x" * n

    env = await _env(tools=[flood], max_result_chars=100)
    await env.areset(seed=0)
    obs, *_ = await env.astep(_call("flood", n=10_000_000))
    assert obs == "x" * 100 + "\n[... cut: 10,000,000 characters in all]"
    await env.aclose()


async def test_calls_of_one_reply_run_concurrently_and_return_in_call_order():
    """Each call waits until the other two are under way: run one after another, the first would wait until its
    timeout (an error observation); they then finish in the reverse of the call order."""
    MEETING.clear()
    env = await _env(tools=[meet])
    await env.areset(seed=0)
    reply = "".join(_call("meet", label=label, others=2, linger=linger)
                    for label, linger in (("first", 0.2), ("second", 0.1), ("third", 0.0)))
    obs, _, _, _, info = await env.astep(reply)
    assert not info.get("error"), info
    assert [m["content"] for m in info["tool_messages"]] == ["first", "second", "third"]
    assert obs == "first\nsecond\nthird"
    assert [m["tool_call_id"] for m in info["tool_messages"]] == ["000010000", "000010001", "000010002"]
    await env.aclose()


async def test_a_reward_that_raises_is_an_error_not_a_score_of_zero():
    def bad_reward(completion: str, answer: str) -> float:
        raise KeyError("judge unavailable")

    env = await _env(reward=bad_reward)
    await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep("5")
    assert info["error"] == "the reward function failed: KeyError: 'judge unavailable'"
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "The episode has ended" in obs
    assert not env.scope_is_open

    env = await _env(reward=lambda completion: float("nan"))
    await env.areset(seed=0)
    *_, info = await env.astep("5")
    assert "must return a finite number" in info["error"]


async def test_finishing_tool_max_turns_and_task_choice():
    tasks = [{"id": "a", "prompt": "2+3?", "answer": "5"}, {"id": "b", "prompt": "4+4?", "answer": "8"}]
    env = await _env(tasks=tasks, max_turns=2)
    obs, info = await env.areset(options={"task_id": "b"})
    assert (obs, info["task_id"], info["tools"]) == ("4+4?", "b", ["add", "nap", "broken", "submit"])
    obs, reward, terminated, truncated, info = await env.astep(_call("add", a=4, b=4) + _call("submit", answer="8"))
    assert (obs, reward, terminated, truncated, info["completion"]) == ("8\n8", 1.0, True, False, "8")
    await env.areset(options={"index": 0})
    await env.astep(_call("add", a=2, b=2))
    obs, reward, terminated, truncated, info = await env.astep(_call("add", a=2, b=3))   # the 2nd reply: max_turns
    assert (reward, terminated, truncated, info["error"]) == (0.0, False, True, None)    # scored: no "5" in the call
    with pytest.raises(ConfigError, match="task_id='zz' is no task's id"):
        await env.areset(options={"task_id": "zz"})
    with pytest.raises(ConfigError, match="unknown reset options"):
        await env.areset(options={"task": "a"})
    await env.aclose()


def test_tasks_from_jsonl_parquet_and_a_dataset(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "2+3?", "answer": "5"}, {"prompt": "1+1?", "answer": "2"}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    for tasks in (tmp_path / "t.jsonl", str(tmp_path / "t.parquet"), datasets.Dataset.from_list(rows)):
        env = gymnasium.make(make_tool_env("test/Files-v0", tasks=tasks, tools=[add], reward=exact))
        obs, info = env.reset(options={"index": 1})
        assert obs == "1+1?"
        *_, info = env.step("2")
        assert info["score"] == 1.0
        env.close()


async def test_tool_resources_are_acquired_per_rollout_and_global_for_a_reward():
    """A rollout-scoped resource is the same instance on every turn of an episode and another in a concurrent
    episode; a reward's global resource is shared; nothing is held after the episodes."""
    counter_spec = InProcessSpec(factory="test_tool_env:Counter", max_instances=4)

    @tool(resources={"counter": counter_spec})
    async def bump(by: int, counter) -> int:
        """Add to the episode's counter.

        Args:
            by: how much to add
        """
        return await counter.call("bump", by)

    judge_spec = InProcessSpec(factory="test_tool_env:Counter", kwargs=(), max_instances=1, close_timeout=5.0)

    @resourced(scope="global", judge=judge_spec)
    async def judged(completion: str, answer: str, *, judge) -> float:
        await judge.call("bump", 1)
        return float(answer in completion)

    async with ResourceManager() as manager:
        env_id = make_tool_env("test/Res-v0", tasks=[{"prompt": "count", "answer": "3"}], tools=[bump], reward=judged)
        envs = [gymnasium.make(env_id, manager=manager).unwrapped for _ in range(2)]
        await asyncio.gather(*(e.areset(seed=0) for e in envs))
        for e in envs:
            await e.astep(_call("bump", by=1))
        obs = [(await e.astep(_call("bump", by=2)))[0] for e in envs]
        assert obs == ["3", "3"]                      # each episode kept its own counter across its turns
        assert manager.pool(counter_spec).metrics.in_use == 2
        results = [await e.astep("3") for e in envs]
        assert [r[1] for r in results] == [1.0, 1.0]
        assert manager.pool(counter_spec).metrics.in_use == 0
        judge = await manager.acquire_global(judge_spec)
        assert await judge.call("bump", 0) == 2       # one shared judge scored both
        for e in envs:
            await e.aclose()


async def test_chain_and_step_rollouts_render_tools_natively(test_data):
    """The chain renders the tools with the Qwen3 template and appends each result as a role "tool" message
    (``<tool_response>`` in a user turn), the expert's replies kept as its ids with mask 1."""
    from transformers import AutoTokenizer

    from agentfly_gym.rollout.chain import run_chain_episode
    from agentfly_gym.rollout.chat import ChatTokenizer
    from agentfly_gym.rollout.policies.baselines import ExpertPolicy
    from agentfly_gym.rollout.step import run_step_episode

    def expert(row, messages):
        return CALL_ADD if messages[-1]["role"] == "user" else f"The answer is {row['answer']}."

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"),
                         chat_template_kwargs={"enable_thinking": False})
    env_id = make_tool_env("test/Chain-v0", tasks=[{"prompt": "What is 2+3?", "answer": "5"}], tools=[add],
                           reward=exact, expert=expert)
    async with ResourceManager() as manager:
        env = gymnasium.make(env_id, manager=manager).unwrapped
        traj = await run_chain_episode(env, ExpertPolicy(), chat, max_turns=4, seed=0)
        assert (traj.reward, traj.status, len(traj.turns)) == (1.0, "complete", 2)
        tok = chat.tokenizer
        prompt = tok.decode(traj.prompt_ids)
        assert "<tools>" in prompt
        assert '"name": "add"' in prompt
        response = tok.decode(traj.response_ids)
        assert response == (CALL_ADD + "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
                            "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is 5.<|im_end|>")
        sampled = [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
        assert tok.decode(sampled) == CALL_ADD + "<|im_end|>" + "The answer is 5.<|im_end|>"
        assert traj.messages[-2] == {"role": "tool", "name": "add", "tool_call_id": "000010000", "content": "5"}

        traj = await run_step_episode(env, ExpertPolicy(), chat, max_turns=4, seed=0)
        assert (traj.reward, traj.status, len(traj.steps)) == (1.0, "complete", 2)
        assert "<tools>" in tok.decode(traj.steps[1].prompt_ids)
        await env.aclose()


async def test_a_reward_error_marks_the_trajectory(test_data):
    from agentfly_gym.rollout.episode import play_episode
    from agentfly_gym.rollout.policies.factory import make_policy

    def bad(completion: str) -> float:
        raise ValueError("no reference")

    env_id = make_tool_env("test/BadReward-v0", tasks=[{"prompt": "2+3?"}], tools=[add], reward=bad,
                           expert=lambda row, messages: "5")
    policy, chat = make_policy("expert", tokenizer=str(test_data / "tokenizers" / "qwen3"))
    traj = await play_episode(env_id, policy, chat, max_turns=2, seed=0)
    assert traj.status == "error"
    assert traj.error == "the reward function failed: ValueError: no reference"


def test_vector_env_and_env_checker():
    from gymnasium.utils.env_checker import check_env

    env_id = make_tool_env("test/Vec-v0", tasks=[{"prompt": "2+3?", "answer": "5"}, {"prompt": "1+1?", "answer": "2"}],
                           tools=[add], reward=exact)
    check_env(gymnasium.make(env_id).unwrapped, skip_render_check=True)
    venv = gymnasium.make_vec(env_id, num_envs=2)
    obs, infos = venv.reset(seed=0)
    obs, rewards, terminated, truncated, infos = venv.step([CALL_ADD, "5"])
    assert obs[0] == "5"
    assert list(terminated) == [False, True]
    venv.close()


def test_an_integer_past_pythons_digit_limit_is_a_malformed_call_not_an_error():
    """Model output: a JSON number of 4301 digits makes ``json.loads`` raise a plain ValueError (Python's int-digit
    limit); it is a malformed call the model is told about, and the episode goes on."""
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    for reply in ('<tool_call>{"name":"add","arguments":{"a":%s,"b":1}}</tool_call>' % ("9" * 4301),
                  '{"name":"add","parameters":{"a":%s,"b":1}}' % ("9" * 4301)):
        with pytest.raises(ToolCallError, match="cannot be read"):
            parse_tool_calls(reply)
    env = gymnasium.make(make_tool_env("test/BigInt-v0", tasks=[{"prompt": "p", "answer": "5"}], tools=[add],
                                       reward=lambda completion, answer, **row: float(answer in completion)))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name":"add","arguments":{"a":%s,"b":1}}</tool_call>' % ("9" * 4301))
    assert "cannot be read" in obs
    assert not terminated
    assert not truncated
    assert not info.get("error")
    obs, *_ = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert obs.strip() == "5"
    env.close()


@pytest.mark.slow  # a Python process of its own with 40 threads: seconds, a minute on a loaded machine
def test_stuck_sync_tools_neither_starve_later_calls_nor_keep_the_process_alive(tmp_path):
    """Forty calls of a sync tool that never returns, in one reply, each time out; the next call of another sync tool
    answers at once (they ran on daemon threads of their own, not the loop's few executor workers), and the process
    exits as soon as the script ends (the interpreter does not wait for the abandoned threads)."""
    script = tmp_path / "stuck.py"
    script.write_text('''
import time, gymnasium
from agentfly_gym.tools import tool, make_tool_env

@tool(timeout=1)
def stuck(x: str) -> str:
    """Never returns.

    Args:
        x: anything
    """
    time.sleep(10**6)

@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b

env = gymnasium.make(make_tool_env("x/Stuck-v0", tasks=[{"prompt": "p"}], tools=[stuck, add],
                                   reward=lambda completion, **row: 1.0, step_timeout=20))
env.reset(seed=0)
obs, *_ = env.step("".join('<tool_call>{"name": "stuck", "arguments": {"x": "a"}}</tool_call>' for _ in range(40)))
assert obs.count("did not finish within its timeout") == 40, obs[:300]
# starved (queued behind the stuck calls on the loop's executor), it would end in the 20 s step timeout: an error
obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
assert obs.strip() == "5" and not info.get("error") and not truncated, (obs, info)
env.close()
print("done")
''')
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]


def test_numpy_scalar_rewards_are_numbers():
    """A reward computed with numpy (np.float32, np.int64, np.bool_, a 0-d array) is its number; an array of several
    values is still refused as an error on the trajectory."""
    import numpy as np

    for i, value in enumerate([np.float32(1.0), np.int64(1), np.bool_(True), np.array(1.0)]):
        env = gymnasium.make(make_tool_env(f"test/NumpyReward{i}-v0", tasks=[{"prompt": "p"}], tools=[],
                                           reward=lambda completion, value=value, **row: value))
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step("my answer")
        assert (reward, terminated, info.get("error")) == (1.0, True, None), (type(value), info)
        env.close()
    env = gymnasium.make(make_tool_env("test/NumpyRewardBad-v0", tasks=[{"prompt": "p"}], tools=[],
                                       reward=lambda completion, **row: np.array([1.0, 2.0])))
    env.reset(seed=0)
    _, reward, _, _, info = env.step("my answer")
    assert "must return a finite number" in info["error"]
    env.close()
