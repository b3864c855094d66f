"""The OpenAI-compatible gateway (agentfly_gym/gateway): the official ``openai`` client against a real server on
127.0.0.1 over the real tiny Qwen model (random weights, Qwen3 tokenizer): the ids recorded are the ids the policy
was given and sampled (0 drift), a rewritten history starts a segment, concurrent sessions never mix, and hostile
requests get OpenAI-shaped errors.  Tool-call parsing uses a scripted policy on the same tokenizer (a CPU-sized
model does not write well-formed calls; see tests/gatewaytools.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from gatewaytools import ScriptedPolicy, Spy, add_then_answer

from agentfly_gym.errors import ConfigError
from agentfly_gym.gateway import Gateway, serve_gateway
from agentfly_gym.rollout.chat import ChatTokenizer

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                        "b": {"type": "integer"}},
                                                       "required": ["a", "b"]}}}


@pytest.fixture(scope="module")
def tiny(tiny_qwen):
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=8)
    yield policy, ChatTokenizer(policy.tokenizer)
    policy.close()


@pytest.fixture(scope="module")
def qwen_chat(test_data):
    from transformers import AutoTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


def client(url, session):
    return openai.AsyncOpenAI(base_url=f"{url}/sessions/{session.id}/v1", api_key=session.api_key, max_retries=0)


def sampled_runs(seg):
    """The mask-1 runs of a segment's response, as lists of ids."""
    runs, cur = [], []
    for t, m in zip(seg["response_ids"], seg["response_mask"]):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


def check_exact(traj, spy_calls):
    """Every call's prompt is a prefix of its segment's ids, every sampled id and logprob is recorded verbatim."""
    seg_ids = [s["prompt_ids"] + s["response_ids"] for s in traj["segments"]]
    runs = [sampled_runs(s) for s in traj["segments"]]
    seen = [0] * len(runs)
    for call, (prompt, sampled, _) in zip(traj["calls"], spy_calls):
        k = call["segment"]
        ids = seg_ids[k]
        assert ids[:len(prompt)] == prompt
        assert ids[len(prompt):len(prompt) + len(sampled)] == sampled
        assert runs[k][seen[k]] == sampled
        seen[k] += 1
    for s in traj["segments"]:
        assert len(s["response_ids"]) == len(s["response_mask"]) == len(s["logprobs"])
        assert all(lp == 0.0 for lp, m in zip(s["logprobs"], s["response_mask"]) if not m)


async def test_openai_client_turns_are_recorded_as_sampled(tiny):
    policy, chat = tiny
    spy = Spy(policy)
    gw = Gateway(spy, chat, max_tokens=24)
    async with serve_gateway(gw) as url:
        s = gw.open_session()
        c = client(url, s)
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
        r = await c.chat.completions.create(model="m", messages=msgs, max_tokens=12, logprobs=True, seed=3,
                                            extra_body={"return_token_ids": True})
        assert r.model == gw.model_name
        assert r.choices[0].finish_reason in ("stop", "length")
        prompt, sampled, lps = spy.calls[0]
        assert r.usage.prompt_tokens == len(prompt)
        assert r.usage.completion_tokens == len(sampled)
        assert r.model_extra["prompt_token_ids"] == prompt
        assert r.choices[0].model_extra["token_ids"] == sampled
        assert [x.logprob for x in r.choices[0].logprobs.content] == lps
        assert prompt == chat.prompt_ids(msgs)  # the first prompt is the template's own render
        for text in ("And another?", "One more."):
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": text}]
            r = await c.chat.completions.create(model="m", messages=msgs, max_tokens=12)
        models = await c.models.list()
        assert [m.id for m in models.data] == [gw.model_name]
        async with httpx.AsyncClient() as h:
            traj = (await h.get(f"{url}/sessions/{s.id}/trajectory",
                                headers={"Authorization": f"Bearer {s.api_key}"})).json()
    assert traj["num_calls"] == 3
    assert traj["num_segments"] == 1
    assert traj["num_appended"] == 2
    assert traj["num_rewritten"] == 0
    assert traj["num_incremental"] == 2
    check_exact(traj, spy.calls)
    seg = traj["segments"][0]
    assert seg["logprobs"] == [lp if m else 0.0 for lp, m in zip(seg["logprobs"], seg["response_mask"])]
    assert [x for x, m in zip(seg["logprobs"], seg["response_mask"]) if m] == [x for c in spy.calls for x in c[2]]


async def test_streaming_gives_the_same_reply_and_usage(tiny):
    policy, chat = tiny
    spy = Spy(policy)
    gw = Gateway(spy, chat, max_tokens=24)
    async with serve_gateway(gw) as url:
        s = gw.open_session()
        stream = await client(url, s).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Count."}], max_tokens=10, stream=True,
            stream_options={"include_usage": True}, logprobs=True)
        parts, usage, finish = [], None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                parts.append(ch.delta.content or "")
                finish = ch.finish_reason or finish
    _, sampled, _ = spy.calls[0]
    assert "".join(parts) == chat.tokenizer.decode(sampled, skip_special_tokens=True)
    assert usage.completion_tokens == len(sampled)
    assert finish in ("stop", "length")
    check_exact(gw.sessions[s.id].trajectory(), spy.calls)


async def test_rewritten_history_starts_a_segment_and_each_branch_keeps_its_chain(tiny):
    """An agent that drops its earlier turn (a summary in its place) starts segment 1; continuing that branch
    appends to it; going back to the original conversation appends to segment 0 again."""
    policy, chat = tiny
    spy = Spy(policy)
    gw = Gateway(spy, chat, max_tokens=16)
    async with serve_gateway(gw) as url:
        s = gw.open_session()
        c = client(url, s)
        base = [{"role": "user", "content": "Plan a trip."}]
        r1 = await c.chat.completions.create(model="m", messages=base, max_tokens=8)
        a1 = r1.choices[0].message.model_dump(exclude_none=True)
        summary = [{"role": "user", "content": "Summary so far: a trip was planned. Continue."}]
        r2 = await c.chat.completions.create(model="m", messages=summary, max_tokens=8)
        a2 = r2.choices[0].message.model_dump(exclude_none=True)
        await c.chat.completions.create(model="m", messages=summary + [a2, {"role": "user", "content": "Go on."}],
                                        max_tokens=8)
        await c.chat.completions.create(model="m", messages=base + [a1, {"role": "user", "content": "Next?"}],
                                        max_tokens=8)
        # the agent drops its reasoning: its earlier reply comes back edited, the rest unchanged
        edited = dict(a1, content=(a1.get("content") or "") + " (edited)")
        await c.chat.completions.create(model="m", messages=base + [edited, {"role": "user", "content": "Next?"}],
                                        max_tokens=8)
    traj = gw.sessions[s.id].trajectory()
    assert [(c["segment"], c["appended"]) for c in traj["calls"]] == [(0, False), (1, False), (1, True), (0, True),
                                                                      (2, False)]
    assert traj["num_segments"] == 3
    assert traj["num_rewritten"] == 2
    assert traj["num_appended"] == 2
    check_exact(traj, spy.calls)


async def test_concurrent_sessions_never_mix(tiny):
    policy, chat = tiny
    spy = Spy(policy)
    gw = Gateway(spy, chat, max_tokens=16)
    async with serve_gateway(gw) as url:
        sessions = [gw.open_session() for _ in range(4)]

        async def converse(k, s):
            c = client(url, s)
            msgs = [{"role": "user", "content": f"You are agent number {k}."}]
            for turn in range(3):
                r = await c.chat.completions.create(model="m", messages=msgs, max_tokens=6)
                msgs += [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"agent {k} turn {turn}"}]

        await asyncio.gather(*(converse(k, s) for k, s in enumerate(sessions)))
    for k, s in enumerate(sessions):
        traj = s.trajectory()
        assert traj["num_calls"] == 3
        assert traj["num_segments"] == 1
        seg = traj["segments"][0]
        mine = [c for c in spy.calls if c[0][:len(seg["prompt_ids"])] == seg["prompt_ids"]]
        assert len(mine) == 3  # the first prompt names agent k: only its own calls extend it
        check_exact(traj, mine)
        text = chat.tokenizer.decode(seg["prompt_ids"] + seg["response_ids"])
        assert all(f"agent {j}" not in text and f"agent number {j}." not in text for j in range(4) if j != k)


async def test_tool_calls_are_parsed_and_the_tool_turn_appends_to_the_chain(qwen_chat):
    policy = ScriptedPolicy(qwen_chat, add_then_answer(lambda r: f"It is {r}."))
    gw = Gateway(policy, qwen_chat)
    assert gw.tool_format == "hermes"
    async with serve_gateway(gw) as url:
        s = gw.open_session()
        c = client(url, s)
        msgs = [{"role": "user", "content": "What is 2+3?"}]
        r = await c.chat.completions.create(model="m", messages=msgs, tools=[ADD])
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert msg.content == "Let me add."
        (call,) = msg.tool_calls
        assert call.function.name == "add"
        assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
        msgs += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        stream = await c.chat.completions.create(model="m", messages=msgs, tools=[ADD], stream=True)
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
        assert text == "It is 5."
        # streamed tool calls: the client assembles them from the chunks
        stream = await c.chat.completions.create(model="m", messages=msgs[:1], tools=[ADD], stream=True)
        deltas = [ch.choices[0].delta async for ch in stream if ch.choices]
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert [tc.function.name for tc in calls] == ["add"]
        # tool_choice "none": the same reply is plain text
        r = await c.chat.completions.create(model="m", messages=msgs[:1], tools=[ADD], tool_choice="none")
        assert r.choices[0].message.tool_calls is None
        assert "<tool_call>" in r.choices[0].message.content
    traj = s.trajectory()
    assert [(c["segment"], c["appended"], c["incremental"]) for c in traj["calls"]][:2] == [(0, False, False),
                                                                                            (0, True, True)]
    check_exact(traj, policy.calls)
    # the tool result between the calls is in the chain, masked 0, as the template renders it
    seg = traj["segments"][0]
    ctx = [t for t, m in zip(seg["response_ids"], seg["response_mask"]) if not m]
    assert "<tool_response>\n5\n</tool_response>" in qwen_chat.tokenizer.decode(ctx)


async def test_stop_strings_keep_a_prefix_of_the_sampled_ids(qwen_chat):
    policy = ScriptedPolicy(qwen_chat, lambda prompt: "alpha beta gamma delta")
    gw = Gateway(policy, qwen_chat)
    async with serve_gateway(gw) as url:
        s = gw.open_session()
        r = await client(url, s).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                         stop=[" gamma"], logprobs=True)
    assert r.choices[0].message.content == "alpha beta gamma"
    assert r.choices[0].finish_reason == "stop"
    seg = s.trajectory()["segments"][0]
    full = policy.calls[0][1]
    assert seg["response_ids"] == full[:len(seg["response_ids"])]
    assert len(seg["response_ids"]) < len(full)
    assert len(r.choices[0].logprobs.content) == len(seg["response_ids"])


async def test_hostile_requests_get_openai_shaped_errors(qwen_chat):
    policy = ScriptedPolicy(qwen_chat, lambda prompt: "ok")
    gw = Gateway(policy, qwen_chat, max_body_bytes=64 << 10, max_tokens=64)
    async with serve_gateway(gw) as url:
        a, b = gw.open_session(max_turns=2), gw.open_session()
        msgs = [{"role": "user", "content": "hi"}]

        async def raw(path, body, key, method="POST"):
            async with httpx.AsyncClient() as h:
                r = await h.request(method, f"{url}{path}", content=body, headers={"Authorization": f"Bearer {key}"})
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert err["message"]
            return r.status_code, err

        chat_a = f"/sessions/{a.id}/v1/chat/completions"
        assert (await raw(chat_a, b"{not json", a.api_key))[0] == 400
        assert (await raw(chat_a, b"[" * 100_000 + b"]" * 100_000, a.api_key))[0] == 413
        assert (await raw(chat_a, b"[" * 20_000 + b"]" * 20_000, a.api_key))[0] == 400  # nested past the decoder
        assert (await raw(chat_a, b"\xff\xfe", a.api_key))[0] == 400
        status, err = await raw(chat_a, json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
                                a.api_key)
        assert status == 400
        assert err["param"] == "messages[0].role"
        assert (await raw(chat_a, json.dumps({"messages": msgs, "n": 3}).encode(), a.api_key))[0] == 400
        assert (await raw(chat_a, json.dumps({"messages": msgs, "max_tokens": 10**9}).encode(), a.api_key))[0] == 400
        assert (await raw(chat_a, json.dumps({"messages": msgs, "tools": "rm -rf /"}).encode(), a.api_key))[0] == 400
        # hostile tool arguments echoed back are text, not a crash
        bad_echo = msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": "{{{" * 1000}}]},
                           {"role": "tool", "tool_call_id": "x", "content": "?"}]
        r = await client(url, a).chat.completions.create(model="m", messages=bad_echo, tools=[ADD])
        assert r.choices[0].message.content == "ok"
        # keys: a wrong key, another session's key, an unknown session: one 401
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=f"{url}/sessions/{a.id}/v1", api_key="afg-guess",
                                     max_retries=0).chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=f"{url}/sessions/{a.id}/v1", api_key=b.api_key,
                                     max_retries=0).chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=f"{url}/sessions/nosuchsession/v1", api_key=b.api_key,
                                     max_retries=0).models.list()
        assert (await raw(f"/sessions/{a.id}/trajectory", None, b.api_key, "GET"))[0] == 401
        assert (await raw("/sessions", b"{}", a.api_key))[0] == 401  # a session key opens no session
        assert (await raw("/v1/chat/completions", json.dumps({"messages": msgs}).encode(), a.api_key))[0] == 401
        assert (await raw("/nowhere", b"", a.api_key))[0] == 404
        # the turn limit (2 calls: one above), then a closed session
        await client(url, a).chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.PermissionDeniedError, match="turn limit"):
            await client(url, a).chat.completions.create(model="m", messages=msgs)
        b.close()
        with pytest.raises(openai.PermissionDeniedError, match="closed"):
            await client(url, b).chat.completions.create(model="m", messages=msgs)
    assert a.trajectory()["num_calls"] == 2
    assert b.trajectory()["num_calls"] == 0


async def test_sessions_over_http_need_the_admin_key(qwen_chat):
    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "ok"), qwen_chat, admin_key="afg-admin-test-key")
    async with serve_gateway(gw) as url, httpx.AsyncClient(base_url=url) as h:
        admin = {"Authorization": "Bearer afg-admin-test-key"}
        created = (await h.post("/sessions", json={"max_turns": 3, "metadata": {"task_id": "t1"}},
                                headers=admin)).json()
        assert created["base_url"] == f"/sessions/{created['id']}/v1"
        c = openai.AsyncOpenAI(base_url=url + created["base_url"], api_key=created["api_key"], max_retries=0)
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        admin_view = (await h.get(f"/sessions/{created['id']}/trajectory", headers=admin)).json()
        assert admin_view["num_calls"] == 1
        assert admin_view["metadata"] == {"task_id": "t1"}
        closed = (await h.delete(f"/sessions/{created['id']}", headers=admin)).json()
        assert closed["closed"]
        assert closed["segments"] == admin_view["segments"]
        assert (await h.get(f"/sessions/{created['id']}/trajectory", headers=admin)).status_code == 401  # forgotten
        assert (await h.delete(f"/sessions/{created['id']}", headers=admin)).status_code == 404
        assert (await h.post("/sessions", json={"max_turns": 0}, headers=admin)).status_code == 400
        assert (await h.post("/sessions", json={}, headers={"Authorization": "Bearer nope"})).status_code == 401


async def test_the_gateway_binds_loopback_only(qwen_chat, tmp_path):
    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "ok"), qwen_chat)
    with pytest.raises(ConfigError, match="loopback"):
        async with serve_gateway(gw, host="0.0.0.0"):
            pass
    async with serve_gateway(gw, host="127.0.0.1") as url:
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(ConfigError, match="cannot bind"):  # the port is taken
            async with serve_gateway(gw, port=port):
                pass
    not_a_socket = tmp_path / "file"
    not_a_socket.write_text("x")
    with pytest.raises(ConfigError, match="not a socket"):
        async with serve_gateway(gw, uds=not_a_socket):
            pass
    assert not_a_socket.read_text() == "x"
    with pytest.raises(ConfigError):
        Gateway(gw.policy, qwen_chat, max_body_bytes=0)


def test_the_command_refuses_a_public_host_and_a_text_endpoint(capsys):
    from agentfly_gym.cli import main

    assert main(["gateway", "--policy", "tiny-qwen", "--host", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err
    # an endpoint policy answers text: there are no sampled ids to record (nothing is sent to it)
    assert main(["gateway", "--policy", "openai:some-model"]) == 2
    assert "no sampled token ids" in capsys.readouterr().err


@pytest.mark.slow  # starts a process that imports torch and loads the tiny model (~30 s on a loaded machine)
def test_the_command_serves_sessions_to_the_openai_client(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, AGENTFLY_GATEWAY_ADMIN_KEY="afg-admin-cli-test")
    proc = subprocess.Popen([sys.executable, "-m", "agentfly_gym", "gateway", "--policy", "tiny-qwen", "--port", "0",
                             "--max-tokens", "8"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        line = proc.stdout.readline()
        assert "serving tiny-qwen on http://127.0.0.1:" in line
        assert "afg-admin-cli-test" not in line
        url = line.split(" on ")[1].split(" ")[0]
        admin = {"Authorization": "Bearer afg-admin-cli-test"}
        created = httpx.post(f"{url}/sessions", json={"max_turns": 2}, headers=admin).json()
        c = openai.OpenAI(base_url=url + created["base_url"], api_key=created["api_key"], max_retries=0)
        r = c.chat.completions.create(model="agentfly-policy", messages=[{"role": "user", "content": "hi"}])
        traj = httpx.get(f"{url}/sessions/{created['id']}/trajectory", headers=admin).json()
        assert traj["num_calls"] == 1
        assert len(traj["segments"][0]["response_ids"]) == r.usage.completion_tokens
    finally:
        proc.terminate()
        proc.wait(timeout=60)
