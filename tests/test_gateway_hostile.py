"""The gateway under hostile requests an agent can send (agentfly_gym/gateway): strict JSON, fields sent as null,
a prompt past the model's context, and a huge prompt that must not stall the other sessions.  Real server on
127.0.0.1, the official ``openai`` client and raw httpx; the real tiny Qwen model where the policy's own check is
under test, else the scripted policy of tests/gatewaytools.py over the real Qwen3 tokenizer."""

from __future__ import annotations


import httpx
import openai
import pytest
from gatewaytools import ScriptedPolicy

from agentfly_gym.gateway import Gateway, serve_gateway
from agentfly_gym.rollout.chat import ChatTokenizer

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def qwen_chat(test_data):
    from transformers import AutoTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


def client(url, session):
    return openai.AsyncOpenAI(base_url=f"{url}/sessions/{session.id}/v1", api_key=session.api_key, max_retries=0)


async def test_nan_and_infinity_are_refused_not_a_500(qwen_chat):
    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "ok"), qwen_chat, admin_key="afg-admin-test-key")
    admin = {"Authorization": "Bearer afg-admin-test-key"}
    async with serve_gateway(gw) as url, httpx.AsyncClient(base_url=url) as h:
        s = gw.open_session()
        for raw in (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                    b'{"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}'):
            r = await h.post(f"/sessions/{s.id}/v1/chat/completions", content=raw,
                             headers={"Authorization": f"Bearer {s.api_key}"})
            assert r.status_code == 400
            assert "not a JSON value" in r.json()["error"]["message"]
        # NaN in a session's metadata would make its trajectory unreadable (a 500 at every read)
        r = await h.post("/sessions", content=b'{"metadata": {"score": NaN}}', headers=admin)
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert len(gw.sessions) == 1


async def test_fields_sent_as_null_read_as_unset(qwen_chat):
    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "one two three four five six"), qwen_chat, max_tokens=64)
    async with serve_gateway(gw) as url, httpx.AsyncClient(base_url=url) as h:
        s = gw.open_session()
        headers = {"Authorization": f"Bearer {s.api_key}"}
        r = await h.post(f"/sessions/{s.id}/v1/chat/completions", headers=headers,
                         json={"messages": MSGS, "n": None, "max_completion_tokens": None, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2  # max_tokens holds when max_completion_tokens is null
        r = await h.post(f"/sessions/{s.id}/v1/chat/completions", headers=headers, json={"messages": MSGS, "n": 2})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "n"


async def test_a_prompt_past_the_context_is_context_length_exceeded(tiny_qwen):
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=2)
    try:
        gw = Gateway(policy, ChatTokenizer(policy.tokenizer), max_tokens=8)
        async with serve_gateway(gw) as url:
            s = gw.open_session(max_turns=2)
            with pytest.raises(openai.BadRequestError) as e:  # a 500 would be retried by the client as a fault
                await client(url, s).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hello " * 5000}])
            assert e.value.code == "context_length_exceeded"
            assert s.trajectory()["num_calls"] == 0
            r = await client(url, s).chat.completions.create(model="m", messages=MSGS, max_tokens=2)
            assert r.usage.completion_tokens <= 2  # the refused call took no turn
    finally:
        policy.close()


class HeldChat:
    """The real ChatTokenizer, whose full renders wait for ``hold`` (a fault injected: a render that takes as
    long as the test says, the way a prompt of megabytes takes seconds) and report their start to ``started``."""

    def __init__(self, chat, loop, started):
        import threading

        self._chat, self._loop, self._started, self.hold = chat, loop, started, threading.Event()

    def __getattr__(self, name):
        return getattr(self._chat, name)

    def prompt_ids(self, *args, **kwargs):
        self._loop.call_soon_threadsafe(self._started.set)
        self.hold.wait(timeout=20)  # bounded: on the event loop (the bug) this blocks every request meanwhile
        return self._chat.prompt_ids(*args, **kwargs)


async def test_a_slow_render_does_not_stall_other_sessions(qwen_chat):
    import asyncio

    started = asyncio.Event()
    chat = HeldChat(qwen_chat, asyncio.get_running_loop(), started)
    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "ok"), chat)
    async with serve_gateway(gw) as url:
        slow, other = gw.open_session(), gw.open_session()
        big = asyncio.create_task(client(url, slow).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello " * 100_000}]))
        await started.wait()
        models = await client(url, other).models.list()  # served while the slow render is still running
        assert [m.id for m in models.data] == [gw.model_name]
        assert not big.done()
        chat.hold.set()
        assert (await big).choices[0].message.content == "ok"


def test_an_unknown_session_compares_the_key_as_a_known_one_does(qwen_chat, monkeypatch):
    """No timing assertion (the machine is noisy): the same constant-time comparison runs on both paths."""
    import hmac

    from agentfly_gym.gateway.messages import BadRequest

    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "ok"), qwen_chat)
    s = gw.open_session()
    seen = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: seen.append(len(b)) or real(a, b))
    for sid in (s.id, "no-such-session"):
        with pytest.raises(BadRequest) as e:
            gw.session_for(sid, "afg-" + "x" * 43)
        assert e.value.status == 401
    assert len(seen) == 2
    assert seen[0] == seen[1] == len(s.api_key)
    assert gw.session_for(s.id, s.api_key) is s


async def test_a_call_cancelled_while_waiting_for_its_session_keeps_no_turn(qwen_chat):
    """A call counts a turn, then waits for the session's lock (another call of the session runs): cancelled
    there, it must give the turn back (it kept it for good, so the session hit its turn limit early)."""
    import asyncio

    gw = Gateway(ScriptedPolicy(qwen_chat, lambda prompt: "ok"), qwen_chat)
    s = gw.open_session(max_turns=1)
    await s.lock.acquire()  # as a running call of the session holds it
    waiting = asyncio.ensure_future(gw.complete({"messages": MSGS}, s))
    for _ in range(50):  # until the call has counted its turn and waits on the lock
        await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    s.lock.release()
    reply = await gw.complete({"messages": MSGS}, s)  # the one turn is still there
    assert reply["choices"][0]["message"]["content"] == "ok"
