"""The tool tasks on real components: CodeInterpreter-v0 (a python tool in pooled bubblewrap sandboxes from the
resource manager), Retrieval-v0 (BM25 over the shipped corpus, a global index), a user's own module through the
command line (``--env mypkg.tasks:make_env``, a real subprocess), and the bundled CPU model (SmolLM2, whose chat
template ignores ``tools``, so the tools are described in its system message) playing both tasks."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap

import gymnasium
import pytest

import agentfly_gym  # noqa: F401  (registers agentfly/*)
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout.episode import play_episode
from agentfly_gym.rollout.policies.factory import make_policy

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap ('bwrap' on PATH)")


@pytest.fixture(scope="module")
def expert(test_data):
    return make_policy("expert", tokenizer=str(test_data / "tokenizers" / "qwen3"))


def _call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@needs_bwrap
async def test_code_interpreter_runs_python_in_a_pooled_container_kept_for_the_rollout(expert):
    policy, chat = expert
    async with ResourceManager() as manager:
        env = gymnasium.make("agentfly/CodeInterpreter-v0", manager=manager, max_instances=2, backend="sandbox").unwrapped
        obs, info = await env.areset(options={"task_id": "ci-0003"})
        assert obs == env.tasks[3]["prompt"]
        assert info["tools"] == ["python"]
        obs, *_ = await env.astep(_call("python", code="open('/tmp/state', 'w').write('kept'); print(6 * 7)"))
        assert obs == "42\n"
        obs, *_ = await env.astep(_call("python", code="print(open('/tmp/state').read())"))
        assert obs == "kept\n"                        # the same container on every turn of the rollout
        obs, *_ = await env.astep(_call("python", code="raise SystemExit(3)"))
        assert obs.endswith("(exit code 3)")
        await env.aclose()
        # the expert solves problems through the tool; 3 episodes at once share a pool capped at 2
        trajs = await asyncio.gather(*(play_episode("agentfly/CodeInterpreter-v0", policy, chat, manager=manager,
                                                    env_kwargs={"max_instances": 2, "backend": "sandbox"},
                                                    seed=s, max_turns=3) for s in range(3)))
        assert [(t.reward, t.status) for t in trajs] == [(1.0, "complete")] * 3, [t.error for t in trajs]
        (pool,) = [p for p in manager.pools.values() if p.spec.kind == "container"]
        assert pool.metrics.max_in_use <= 2
        assert pool.metrics.in_use == 0
        # a new episode gets a reset container: the last episode's file is gone
        env = gymnasium.make("agentfly/CodeInterpreter-v0", manager=manager, max_instances=2, backend="sandbox").unwrapped
        await env.areset(seed=0)
        obs, *_ = await env.astep(_call("python", code="import os; print(os.path.exists('/tmp/state'))"))
        assert obs == "False\n"
        await env.aclose()


async def test_retrieval_expert_finds_every_answer_through_search(expert):
    policy, chat = expert
    async with ResourceManager() as manager:
        trajs = await asyncio.gather(*(play_episode("agentfly/Retrieval-v0", policy, chat, manager=manager,
                                                    options={"index": i}, max_turns=3) for i in range(0, 80, 8)))
        assert [t.reward for t in trajs] == [1.0] * 10, [t.error for t in trajs]
        (pool,) = manager.pools.values()             # one global index served all ten episodes
        assert pool.metrics.started == 1
        env = gymnasium.make("agentfly/Retrieval-v0", manager=manager).unwrapped
        await env.areset(options={"index": 1})
        obs, *_ = await env.astep(_call("search", query="zzzz qqqq"))
        assert obs == "No document matches."
        *_, info = await env.astep("Dario Tamm")
        assert info["score"] == 1.0
        await env.aclose()


@pytest.mark.slow
def test_cli_rolls_out_a_users_module(tmp_path):
    """``agentfly-gym rollout --env mypkg.tasks:make_env`` as a user runs it: a package of their own, outside the
    repository, whose function registers the env with make_tool_env."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(textwrap.dedent('''
        from agentfly_gym.tools import make_tool_env, tool

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first number
                b: the second number
            """
            return a + b

        def exact(completion: str, answer: str, **row) -> float:
            return float(answer in completion)

        def expert(row, messages):
            if messages[-1]["role"] == "user":
                return '<tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>' % tuple(row["ab"])
            return "The answer is " + messages[-1]["content"]

        def make_env():
            return make_tool_env("my/Add-v0", tasks=[{"prompt": "2+3?", "answer": "5", "ab": [2, 3]},
                                                     {"prompt": "4+4?", "answer": "8", "ab": [4, 4]}],
                                 tools=[add], reward=exact, expert=expert)
    '''))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for mode in ("chain", "step"):
        out = tmp_path / f"run-{mode}"
        r = subprocess.run([sys.executable, "-m", "agentfly_gym", "rollout", "--env", "mypkg.tasks:make_env",
                            "--policy", "expert", "--tokenizer", "qwen3", "-n", "4", "--max-turns", "3", "--mode", mode,
                            "--no-progress", "--output-dir", str(out)],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["trajectories"], summary["mean_reward"], summary["errors"]) == (4, 1.0, 0), summary
        rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
        assert {row["env_id"] for row in rows if "trajectory_id" in row} == {"my/Add-v0"}


def test_a_users_module_names_its_env(tmp_path, monkeypatch):
    """The in-process half of ``--env mypkg.tasks:make_env``: the function runs once and its id is the env."""
    from agentfly_gym.errors import ConfigError
    from agentfly_gym.registration import normalize_env_id
    from agentfly_gym.rollout import RolloutConfig

    (tmp_path / "usertasks.py").write_text(textwrap.dedent('''
        from agentfly_gym.tools import make_tool_env
        CALLS = []

        def make_env():
            CALLS.append(1)
            return make_tool_env("user/Echo-v0", tasks=[{"prompt": "say hi"}], tools=[],
                                 reward=lambda completion: float("hi" in completion))

        NOT_AN_ID = 3
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert normalize_env_id("usertasks:make_env") == normalize_env_id("usertasks:make_env") == "user/Echo-v0"
    import usertasks

    assert usertasks.CALLS == [1]
    assert RolloutConfig(env_ids=["usertasks:make_env"], num_trajectories=1).env_ids == ["user/Echo-v0"]
    with pytest.raises(ConfigError, match="must be \\(or return\\) a registered env id"):
        normalize_env_id("usertasks:NOT_AN_ID")
    with pytest.raises(ConfigError, match="cannot import module 'nosuchpkg.tasks'"):
        normalize_env_id("nosuchpkg.tasks:make_env")


@pytest.mark.slow
async def test_the_bundled_cpu_model_plays_both_tasks():
    """SmolLM2-135M (the bundled CPU model) on both tasks: whatever it writes (a tool call, a malformed one, an
    answer) is handled; the trajectories are complete or truncated, never errors, and their sampled ids keep mask 1."""
    from agentfly_gym.rollout import RolloutConfig, SamplingParams, run_rollouts

    policy, chat = make_policy("smollm2", max_batch_size=8)
    assert not chat.renders_tools                     # SmolLM2's template ignores tools=
    envs = ["agentfly/Retrieval-v0"] + (["agentfly/CodeInterpreter-v0"] if shutil.which("bwrap") else [])
    config = RolloutConfig(env_ids=envs, num_trajectories=2 * len(envs), concurrency=4, max_turns=2,
                           sampling=SamplingParams(max_tokens=40, temperature=1.0), output_dir=None)
    async with ResourceManager() as manager:
        result = await run_rollouts(config, policy, chat, manager=manager)
    try:
        await policy.aclose()
    except AttributeError:
        pass
    assert len(result.trajectories) == 2 * len(envs)
    for t in result.trajectories:
        assert t.status in ("complete", "truncated"), (t.env_id, t.status, t.error)
        prompt = chat.tokenizer.decode(t.prompt_ids)
        assert "<tools>" in prompt
        assert "<tool_call>" in prompt
        assert sum(t.response_mask) == sum(turn.sampled_tokens for turn in t.turns) > 0


@pytest.mark.slow
def test_verl_rows_name_the_users_module_so_workers_register_it(tmp_path, monkeypatch):
    """``agentfly-gym dataset mypkg.tasks:make_env`` keeps the reference in the rows: a worker process that never
    imported the module (a fresh interpreter here) registers the env from it when it parses a row."""
    pytest.importorskip("verl")
    import pyarrow.parquet as pq
    from agentfly_gym_verl.dataset import build_dataset

    (tmp_path / "verltasks.py").write_text(textwrap.dedent('''
        from agentfly_gym.tools import make_tool_env

        def make_env():
            return make_tool_env("user/VerlEcho-v0", tasks=[{"id": "t1", "prompt": "say hi"}], tools=[],
                                 reward=lambda completion: float("hi" in completion))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = build_dataset("verltasks:make_env", ["t1"], 2, tmp_path / "train.parquet")
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["env_id"] for r in rows] == ["verltasks:make_env"] * 2
    code = ("import json, sys; from agentfly_gym_verl.agent_loop import parse_row; "
            "print(json.dumps(parse_row(json.loads(sys.argv[1]))['env_id']))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(rows[0]["extra_info"])], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == "user/VerlEcho-v0"
