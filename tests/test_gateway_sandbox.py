"""A command-line agent inside the rollout's sandbox, on an R2E-Gym task, through the gateway
(agentfly_gym/gateway/command.py): the bubblewrap sandbox (image "host") cannot reach the host's loopback, so the
gateway's Unix socket is mounted in and a relay inside serves it on 127.0.0.1; the agent is a small script using
the official ``openai`` client (configured only by ``OPENAI_BASE_URL``/``OPENAI_API_KEY``), the env grades the
container's diff with the hidden tests, as today.  The model is scripted (it answers the task's gold patch: a
CPU-sized model writes no working patch); everything else is real."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from gatewaytools import ScriptedPolicy

from agentfly_gym.envs.r2egym import R2EGymEnv
from agentfly_gym.gateway import Gateway, run_agent, serve_gateway
from agentfly_gym.gateway.command import command_agent, gateway_mount
from agentfly_gym.resources import ResourceManager
from agentfly_gym.resources.spec import Mount
from agentfly_gym.rollout.chat import ChatTokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "r2e"
#: The folder holding the ``openai`` package and its dependencies, shown read-only in the sandbox (its own python3
#: has none of them).
SITE = Path(openai.__file__).resolve().parents[1]

#: The command-line agent: asks the model for a patch and applies it with git.
AGENT = """
import json, os, subprocess
from openai import OpenAI

task = json.load(open(os.environ["AGENTFLY_TASK_FILE"]))
client = OpenAI()   # OPENAI_BASE_URL and OPENAI_API_KEY: its gateway session
reply = client.chat.completions.create(model="agentfly-policy", messages=[
    {"role": "system", "content": "Answer with a unified diff that fixes the issue in /testbed."},
    {"role": "user", "content": task["issue"]}])
patch = reply.choices[0].message.content
subprocess.run(["git", "apply", "-"], input=patch + "\\n", text=True, cwd="/testbed", check=True)
print("applied", len(patch), "characters")
"""


@pytest.fixture(scope="module")
def qwen_chat(test_data):
    from transformers import AutoTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


@pytest.mark.slow  # a sandbox start, the agent's Python start-up inside, isolated grading: ~20-40 s
async def test_a_command_line_agent_fixes_an_r2e_task_in_the_sandbox(qwen_chat, tmp_path):
    gold = json.loads((FIXTURES / "tasks.jsonl").read_text().splitlines()[0])["patch"]
    policy = ScriptedPolicy(qwen_chat, lambda prompt: gold.rstrip("\n"))
    gw = Gateway(policy, qwen_chat, max_tokens=512)
    (tmp_path / "gw").mkdir()
    uds = tmp_path / "gw" / "gateway.sock"
    manager = ResourceManager()
    env = R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", backend="sandbox", image="host", manager=manager,
                    mounts=(gateway_mount(uds), Mount(str(SITE), "/opt/agent-site")))
    agent = command_agent("PYTHONPATH=/opt/agent-site python3 /tmp/agent.py", uds=uds, timeout_s=300)
    try:
        async with serve_gateway(gw, uds=uds) as url:
            obs, info = await env.areset(options={"task_id": "minicalc-bug1"})
            await env.container.put_files({"/tmp/agent.py": AGENT})
            rollout = await run_agent(gw, agent, {"task_id": "minicalc-bug1", "issue": obs}, base_url=url,
                                      resources={"container": env.container}, timeout_s=300)
            assert (rollout.status, rollout.error) == ("complete", None), rollout.error
            assert "applied" in rollout.answer
            assert rollout.num_calls == 1
            _, reward, terminated, _, info = await env.astep("<function=finish>\n</function>")
            assert terminated
            assert reward == 1.0
            assert info["test_results"]["test_add"] == "PASSED"
            # the recorded ids are the policy's
            (seg,) = rollout.segments
            assert (seg.prompt_ids, seg.response_ids) == (policy.calls[0][0], policy.calls[0][1])
            # a failing command is an error rollout; the env grades the untouched repository 0
            await env.areset(options={"task_id": "minicalc-bug1"})
            failing = command_agent("echo broken >&2; exit 3", uds=uds, timeout_s=60)
            bad = await run_agent(gw, failing, {}, base_url=url, resources={"container": env.container})
            assert bad.status == "error"
            assert "status 3" in bad.error
            assert "broken" in bad.error
            _, reward, terminated, _, _ = await env.astep("<function=finish>\n</function>")
            assert terminated
            assert reward == 0.0
    finally:
        await env.aclose()
        await manager.aclose()
    assert not uds.exists()
