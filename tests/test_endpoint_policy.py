"""Endpoints as policies: :class:`EndpointPolicy` through the official ``openai`` client.

The fast tests talk to a *stub* OpenAI-compatible server (Python's ``http.server`` on 127.0.0.1), used only where
a real server cannot show the case: injected faults (429, 500, a response cut short, a slow answer) and vLLM's
token-id answer shape (vLLM needs a GPU; the shape is the one vLLM documents for ``return_token_ids``:
``prompt_token_ids`` on the response, ``token_ids`` on the choice).  The end-to-end test against a real server
(``transformers serve`` on the bundled SmolLM2) is in ``tests/test_eval.py``.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading

import pytest

from agentfly_gym.errors import ConfigError, PolicyError
from agentfly_gym.rollout.policies.base import SamplingParams, is_chat_policy
from agentfly_gym.rollout.policies.endpoint_policy import (
    EndpointError,
    EndpointPolicy,
    RateLimiter,
)
from agentfly_gym.rollout.trajectory import TextOnlyTrajectory

SECRET = "sk-test-do-not-leak-4f1b2c"


class Stub:
    """A stub chat endpoint: ``plan`` is a list of behaviours consumed one per request ("429", "500", "cut",
    "slow", "ok"; "ok" when empty); an "ok" answer is ``answer(body)``.  Records each request's body and
    Authorization header."""

    def __init__(self, answer=None) -> None:
        self.plan: list[str] = []
        self.bodies: list[dict] = []
        self.auth: list[str] = []
        self.release = threading.Event()
        self.answer = answer or (lambda body: {"content": "hello"})
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                stub.bodies.append(body)
                stub.auth.append(self.headers.get("authorization", ""))
                what = stub.plan.pop(0) if stub.plan else "ok"
                if what == "slow":
                    stub.release.wait(30)  # longer than the client's timeout; released at teardown
                    what = "ok"
                if what in ("429", "500"):
                    data = json.dumps({"error": {"message": f"injected {what}"}}).encode()
                    self.send_response(int(what))
                    self.send_header("retry-after-ms", "5")
                else:
                    msg = stub.answer(body)
                    extra = msg.pop("_extra", {}) if isinstance(msg, dict) else {}
                    choice = {"index": 0, "message": {"role": "assistant", **msg},
                              "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop",
                              **extra.get("choice", {})}
                    data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                       "choices": [choice], **extra.get("response", {})}).encode()
                    self.send_response(200)
                self.send_header("content-type", "application/json")
                if what == "cut":  # announce a long body, send a piece, hang up
                    self.send_header("content-length", str(len(data) + 500))
                    self.end_headers()
                    self.wfile.write(data[:20])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("EVAL_TEST_KEY", SECRET)
    return "EVAL_TEST_KEY"


def _policy(stub, key, **kw) -> EndpointPolicy:
    return EndpointPolicy("m", base_url=stub.base_url, api_key_env=key, **kw)


async def test_retries_429_500_and_a_cut_response_then_answers_and_the_key_stays_out_of_logs(stub, key, caplog):
    caplog.set_level(logging.DEBUG)  # the openai client and httpx log requests at DEBUG
    stub.plan = ["429", "500", "cut"]
    policy = _policy(stub, key, max_retries=3)
    assert is_chat_policy(policy)
    assert policy.text_only
    reply = await policy.complete([{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=5, seed=3))
    await policy.aclose()
    assert reply.text == "hello"
    assert reply.token_ids is None
    assert reply.finish_reason == "stop"
    assert len(stub.bodies) == 4  # three faults retried, the fourth answered
    assert stub.bodies[-1]["max_tokens"] == 5
    assert stub.bodies[-1]["seed"] == 3
    assert "tools" not in stub.bodies[-1]
    assert stub.auth == [f"Bearer {SECRET}"] * 4  # the key goes to the server ...
    assert caplog.records
    assert SECRET not in caplog.text
    assert SECRET not in repr(policy)
    assert SECRET not in json.dumps(policy.describe())


async def test_5xx_after_the_retries_is_an_endpoint_error(stub, key):
    stub.plan = ["500"] * 3
    policy = _policy(stub, key, max_retries=2)
    with pytest.raises(EndpointError, match="HTTP 500") as e:
        await policy.complete([{"role": "user", "content": "hi"}])
    await policy.aclose()
    assert e.value.status == 500
    assert isinstance(e.value, PolicyError)
    assert SECRET not in str(e.value)
    assert len(stub.bodies) == 3


async def test_a_slow_answer_times_out(stub, key):
    stub.plan = ["slow", "slow"]
    policy = _policy(stub, key, timeout=0.5, max_retries=1)
    with pytest.raises(EndpointError, match="did not answer within 0.5 s"):
        await policy.complete([{"role": "user", "content": "hi"}])
    await policy.aclose()


def test_bad_settings_are_refused(monkeypatch):
    monkeypatch.delenv("EVAL_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="EVAL_NO_SUCH_KEY"):
        EndpointPolicy("m", base_url="http://127.0.0.1:9/v1", api_key_env="EVAL_NO_SUCH_KEY")
    with pytest.raises(ConfigError, match="requests_per_second"):
        RateLimiter(0)
    with pytest.raises(ConfigError, match="max_retries"):
        EndpointPolicy("m", base_url="http://127.0.0.1:9/v1", max_retries=-1)
    from agentfly_gym.rollout.policies.factory import make_policy

    with pytest.raises(ConfigError, match="names no model"):
        make_policy("openai:")
    with pytest.raises(ConfigError, match="not an endpoint"):
        make_policy("random", base_url="http://127.0.0.1:9/v1")


async def test_rate_limiter_spaces_request_starts():
    """Four requests at once at 10 per second wait 0, 0.1, 0.2 and 0.3 s; one after a pause waits nothing.  The
    clock and the sleep are the limiter's injected ones (a frozen clock, a recording sleep): no wall-clock timing."""
    now = [100.0]
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(round(seconds, 9))

    limiter = RateLimiter(10, clock=lambda: now[0], sleep=sleep)
    for _ in range(4):
        await limiter.wait()
    assert waited == [0.1, 0.2, 0.3]
    now[0] += 5.0
    await limiter.wait()
    assert waited == [0.1, 0.2, 0.3]


def _tool_answer(body: dict) -> dict:
    """Call ``add(2, 3)`` natively first; once the tool answered, reply with its result."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return {"content": last["content"]}
    return {"content": None, "tool_calls": [{"id": "call_abc", "type": "function",
                                             "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]}


async def test_native_tool_calls_drive_a_tool_env_and_the_trajectory_is_text_only(key):
    import evaltools
    import gymnasium

    from agentfly_gym.rollout.episode import play_episode

    stub = Stub(_tool_answer)
    try:
        env_id = evaltools.make_env()
        policy = _policy(stub, key)
        traj = await play_episode(env_id, policy, None, options={"task_id": "right"}, max_turns=3)
        await policy.aclose()
    finally:
        stub.close()
    assert traj.status == "complete"
    assert traj.success
    assert traj.reward == 1.0
    assert traj.text_only
    assert traj.scope_id.startswith("Arith-v0")  # the env's episode (rollout scope) id
    assert traj.prompt_ids == []
    assert traj.response_ids == []
    assert len(traj.turns) == 2
    assert "<tool_call>" in traj.turns[0].reply
    assert traj.turns[0].observation == "5"
    first, second = stub.bodies
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    assert second["messages"][-2]["tool_calls"][0]["id"] == "call_abc"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_abc", "content": "5"}
    with pytest.raises(TextOnlyTrajectory, match="text-only"):
        traj.trainer_response()
    from agentfly_gym.bridges.trl import AgentFlyRollout

    with pytest.raises(TextOnlyTrajectory):
        AgentFlyRollout.to_trl([traj], None)
    with pytest.raises(ConfigError, match="chain mode only"):
        await play_episode(gymnasium.spec(env_id).id, policy, None, mode="step")


def _ids_answer(consistent: bool):
    """vLLM's ``return_token_ids`` shape: turn t's prompt is the previous prompt + sampled ids + new ids."""
    state = {"prompt": [1, 2, 3]}

    def answer(body: dict) -> dict:
        assert body["return_token_ids"] is True
        assert body["logprobs"] is True
        calls = sum(1 for m in body["messages"] if m["role"] == "assistant")
        prompt = list(state["prompt"])
        sampled = [10 + calls, 20 + calls]
        state["prompt"] = prompt + sampled + [7, 8] if consistent else [99] + prompt + sampled + [7, 8]
        msg = _tool_answer(body)
        lps = [{"token": "t", "logprob": -0.5, "bytes": None, "top_logprobs": []}] * 2
        msg["_extra"] = {"response": {"prompt_token_ids": prompt},
                         "choice": {"token_ids": sampled, "logprobs": {"content": lps, "refusal": None}}}
        return msg

    return answer


@pytest.mark.parametrize("consistent", [True, False])
async def test_token_ids_from_the_server_make_a_trainable_chain_only_when_faithful(key, consistent):
    import evaltools

    from agentfly_gym.rollout.episode import play_episode

    stub = Stub(_ids_answer(consistent))
    try:
        policy = _policy(stub, key, token_ids=True)
        traj = await play_episode(evaltools.make_env(), policy, None, options={"task_id": "right"}, max_turns=3)
        await policy.aclose()
    finally:
        stub.close()
    assert traj.success
    if consistent:
        assert not traj.text_only
        assert traj.prompt_ids == [1, 2, 3]
        assert traj.response_ids == [10, 20, 7, 8, 11, 21]
        assert traj.response_mask == [1, 1, 0, 0, 1, 1]
        assert traj.response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
        assert traj.trainer_response()[0] == traj.response_ids
    else:  # the server re-rendered the past differently: the ids would not be what was sampled
        assert traj.text_only
        assert traj.response_ids == []


async def test_a_call_written_in_the_text_runs_and_its_result_comes_back_as_a_user_message(key):
    """A server without native tool calling: the model writes the call into its content; the env runs it, and
    the result goes back as a user message (an API refuses a tool message answering no native call)."""
    import evaltools
    from agentfly_gym.rollout.episode import play_episode

    def answer(body: dict) -> dict:
        if body["messages"][-1]["role"] == "user" and len(body["messages"]) > 2:
            return {"content": body["messages"][-1]["content"]}
        return {"content": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'}

    stub = Stub(answer)
    try:
        policy = _policy(stub, key)
        traj = await play_episode(evaltools.make_env(), policy, None, options={"task_id": "right"}, max_turns=3)
        await policy.aclose()
    finally:
        stub.close()
    assert traj.success
    assert traj.turns[0].observation == "5"
    assert stub.bodies[1]["messages"][-1] == {"role": "user", "content": "5"}
    assert "tool_calls" not in stub.bodies[1]["messages"][-2]


class RawStub:
    """A stub endpoint answering HTTP 200 with ``body`` (bytes) verbatim: what a broken or hostile server sends."""

    def __init__(self, body: bytes) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("body,match", [
    (b"{not json", "not a chat completion: JSONDecodeError"),
    (b'{"choices": [{"message": {"content": "\xff\xfe"}}]}', "not a chat completion: UnicodeDecodeError"),
    (b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m", '
     b'"choices": [{"index": 0, "message": null, "finish_reason": "stop"}]}', "choice holds no message"),
])
async def test_a_garbage_answer_is_an_endpoint_error_that_says_so(key, body, match):
    raw = RawStub(body)
    policy = EndpointPolicy("m", base_url=raw.base_url, api_key_env=key, max_retries=0)
    try:
        with pytest.raises(EndpointError, match=match):
            await policy.complete([{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=4))
    finally:
        await policy.aclose()
        raw.close()


def _completion(content: str, **choice: object) -> bytes:
    import json

    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}, **choice}]}).encode()


@pytest.mark.parametrize("body,match", [
    (_completion("A" * 200_000), "holds 200000 characters, more than max_tokens=4"),
    (_completion("ok", token_ids=list(range(50))), "returned 50 token ids for max_tokens=4"),
], ids=["text", "ids"])
async def test_a_reply_past_max_tokens_is_refused_not_stored(key, body, match):
    """An endpoint that ignores max_tokens (a hostile or broken one) would fill the trajectory files: refused."""
    raw = RawStub(body)
    policy = EndpointPolicy("m", base_url=raw.base_url, api_key_env=key, max_retries=0)
    try:
        with pytest.raises(EndpointError, match=match):
            await policy.complete([{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=4))
    finally:
        await policy.aclose()
        raw.close()


async def test_a_reply_within_max_tokens_passes_the_size_check(key):
    raw = RawStub(_completion("A" * 200, token_ids=[1, 2, 3, 4]))
    policy = EndpointPolicy("m", base_url=raw.base_url, api_key_env=key, max_retries=0)
    try:
        reply = await policy.complete([{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=4))
        assert reply.text == "A" * 200
        assert reply.token_ids == [1, 2, 3, 4]
    finally:
        await policy.aclose()
        raw.close()
