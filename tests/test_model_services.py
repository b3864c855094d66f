"""Model services and model APIs as resources, on real processes.

The model service is a real ``transformers serve`` process running the bundled SmolLM2 on
CPU.  The retry tests run a real local HTTP server (Python's http.server on 127.0.0.1) that
answers 429/500 on purpose.  vLLM cannot run here (no GPU): its completion answer shape is
covered by parsing answers in the shape vLLM documents (``return_token_ids``,
``return_tokens_as_token_ids``), said where used.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import threading
import time

import pytest

from agentfly_gym.errors import ConfigError, PolicyError, ResourceDied, ResourceStartError
from agentfly_gym.resources import ModelAPISpec, ModelServiceSpec, ResourceManager, ResourceStatus
from agentfly_gym.resources.backends.model_api import APIError
from agentfly_gym.rewards import LLMJudge, parse_score, resourced
from agentfly_gym.rollout.policies.openai_policy import OpenAITokenPolicy, parse_completion_choice
from agentfly_gym.rollout.policies.base import SamplingParams
from proctools import alive, live_processes


def _group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    out = []
    for p in live_processes([""]):
        try:
            if os.getpgid(p) == pgid:
                out.append(p)
        except ProcessLookupError:
            pass
    return out


@pytest.fixture(scope="module")
def smollm2():
    from agentfly_gym.rollout.models import smollm2_dir

    return str(smollm2_dir())


@pytest.mark.slow
async def test_transformers_server_lifecycle_judge_and_token_policy_refusal(smollm2):
    svc_spec = ModelServiceSpec(engine="transformers", model=smollm2, start_timeout=600)
    async with ResourceManager() as m:
        svc = await m.acquire_global(svc_spec)
        assert svc.base_url.startswith("http://127.0.0.1:")
        assert await svc.status() == ResourceStatus.READY
        pid = svc.proc.pid
        assert alive(pid)
        api_spec = ModelAPISpec(base_url=svc.base_url, model=smollm2, max_instances=2, request_timeout=300)
        judge = LLMJudge(api_spec, max_tokens=8)
        score = await judge("Add 2 and 2.", "4", "4", manager=m)
        assert 0.0 <= score <= 1.0
        api = await m.acquire_global(api_spec)
        assert api.requests >= 1
        assert judge.last_reply
        assert await m.acquire_global(api_spec) is api  # global scope: one shared client

        # transformers serve returns no token ids: the token-faithful policy must refuse, not re-tokenize
        from transformers import AutoTokenizer

        policy = OpenAITokenPolicy(api, AutoTokenizer.from_pretrained(smollm2))
        with pytest.raises(PolicyError, match="token"):
            await policy.generate([1, 2, 3], SamplingParams(max_tokens=4))
        log_path = svc.log_path
    assert not alive(pid)
    assert not _group_members(pid)
    assert log_path.exists()


@pytest.mark.slow
async def test_bad_model_fails_start_with_log_and_leaves_no_process(tmp_path):
    async with ResourceManager() as m:
        with pytest.raises(ResourceStartError, match="exited|not healthy"):
            await m.acquire_global(ModelServiceSpec(engine="transformers", model=str(tmp_path / "no-model"),
                                                    start_timeout=120, extra_args=("--force-model-fail",)))
        assert m.pool(ModelServiceSpec(engine="transformers", model=str(tmp_path / "no-model"), start_timeout=120,
                                       extra_args=("--force-model-fail",))).size == 0


class _Flaky(http.server.BaseHTTPRequestHandler):
    plan: list[int] = []
    seen_auth: list[str] = []

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        _Flaky.seen_auth.append(self.headers.get("authorization", ""))
        what = _Flaky.plan.pop(0) if _Flaky.plan else 200
        code = {"html": 200, "no-content": 204, "dict-content": 200, "wait-a-day": 429}.get(what, what)
        content = {"text": "a dict"} if what == "dict-content" else "ok [[7]]"
        body = json.dumps({"choices": [{"message": {"content": content}}]} if code == 200 else {"error": "x"})
        if what == "html":
            body = "<html>a proxy's error page</html>"
        self.send_response(code)
        self.send_header("content-type", "application/json")
        if code == 429:
            self.send_header("retry-after", "86400" if what == "wait-a-day" else "0.01")
        self.end_headers()
        if code != 204:
            self.wfile.write(body.encode())

    def log_message(self, *a):
        pass


@pytest.fixture()
def flaky_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


async def test_model_api_retries_429_and_5xx_then_succeeds(flaky_server, monkeypatch):
    monkeypatch.setenv("AFG_TEST_KEY", "sk-very-secret")
    _Flaky.plan, _Flaky.seen_auth = [429, 500, 200], []
    spec = ModelAPISpec(base_url=flaky_server, model="m", api_key_env="AFG_TEST_KEY", backoff=0.01)
    async with ResourceManager() as m:
        api = await m.acquire_global(spec)
        assert await api.chat([{"role": "user", "content": "hi"}]) == "ok [[7]]"
        assert api.retries == 2
        assert api.requests == 3
        assert _Flaky.seen_auth == ["Bearer sk-very-secret"] * 3
        assert "sk-very-secret" not in repr(api)
        assert "sk-very-secret" not in repr(spec)
        _Flaky.plan = [400]
        with pytest.raises(APIError, match="400") as ei:
            await api.chat([{"role": "user", "content": "hi"}])
        assert "sk-very-secret" not in str(ei.value)
        assert api.retries == 2
        _Flaky.plan = [503, 503, 503, 503]
        with pytest.raises(APIError, match="4 attempts"):
            await api.chat([{"role": "user", "content": "hi"}])


async def test_model_api_answers_that_are_no_chat_completion_are_api_errors(flaky_server, monkeypatch):
    """An endpoint's answer is untrusted: a 200 that is not JSON (a proxy's HTML page), a 204 without a body and a
    message content that is not text are each an APIError naming the answer; a 429 asking to wait a day is
    retried after MAX_RETRY_AFTER seconds instead (made small here)."""
    from agentfly_gym.resources.backends import model_api

    monkeypatch.setattr(model_api, "MAX_RETRY_AFTER", 0.05)
    spec = ModelAPISpec(base_url=flaky_server, model="m", backoff=0.01)
    hi = [{"role": "user", "content": "hi"}]
    async with ResourceManager() as m:
        api = await m.acquire_global(spec)
        for what, match in (("html", "200 without a JSON object: .<html>"), ("no-content", "answered 204"),
                            ("dict-content", "content is not text")):
            _Flaky.plan = [what]
            with pytest.raises(APIError, match=match):
                await api.chat(hi)
        _Flaky.plan = ["wait-a-day", 200]
        assert await asyncio.wait_for(api.chat(hi), 30) == "ok [[7]]"
    for bad in (0, -1, float("nan"), float("inf"), "10", True):
        with pytest.raises(ConfigError, match="request_timeout"):
            ModelAPISpec(base_url=flaky_server, model="m", request_timeout=bad)
    with pytest.raises(ConfigError, match="backoff"):
        ModelAPISpec(base_url=flaky_server, model="m", backoff=-0.5)


async def test_model_api_missing_key_is_a_clear_start_error(flaky_server, monkeypatch):
    monkeypatch.delenv("AFG_NO_SUCH_KEY", raising=False)
    async with ResourceManager() as m:
        with pytest.raises(ResourceStartError, match="AFG_NO_SUCH_KEY"):
            await m.acquire_global(ModelAPISpec(base_url=flaky_server, model="m", api_key_env="AFG_NO_SUCH_KEY"))


async def test_resourced_reward_gets_its_resource_without_allocation_code(flaky_server):
    _Flaky.plan = []
    spec = ModelAPISpec(base_url=flaky_server, model="m")

    @resourced(scope="global", judge=spec)
    async def reward(answer: str, *, judge) -> float:
        return parse_score(await judge.chat([{"role": "user", "content": answer}])) or 0.0

    async with ResourceManager() as m:
        assert await reward("x", manager=m) == pytest.approx(0.7)
        assert await reward("y", manager=m) == pytest.approx(0.7)
        assert m.pool(spec).metrics.started == 1


@pytest.mark.parametrize("text, want", [("Fine. [[8]]", 0.8), ("[[ 10 ]]", 1.0), ("rating: 3/10", 0.3),
                                        ("no idea", None), ("[[42]] then 5", None)])
def test_parse_score(text, want):
    got = parse_score(text)
    assert got == (pytest.approx(want) if want is not None else None)


def test_parse_completion_choice_vllm_shapes():
    """Answers in the shapes vLLM documents (no vLLM here: no GPU)."""
    ids, lps = parse_completion_choice({"text": "hi", "token_ids": [5, 6, 2], "finish_reason": "stop",
                                        "logprobs": {"token_logprobs": [-0.1, -0.2, -0.3], "tokens": ["a", "b", "c"]}})
    assert ids == [5, 6, 2]
    assert lps == [-0.1, -0.2, -0.3]
    ids, lps = parse_completion_choice({"logprobs": {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-1.0, -2.0]}})
    assert ids == [7, 8]
    assert lps == [-1.0, -2.0]
    with pytest.raises(PolicyError, match="no token ids"):
        parse_completion_choice({"text": "hi", "logprobs": {"tokens": ["h", "i"]}})
    with pytest.raises(PolicyError, match="logprobs"):
        parse_completion_choice({"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}})


def _answer(handler: http.server.BaseHTTPRequestHandler, code: int, data: bytes) -> None:
    """Send ``data`` as a JSON answer with its length (the connection can stay open)."""
    handler.send_response(code)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]):
    """A threading HTTP server of ``handler`` on a free loopback port (a deep accept queue, daemon threads);
    yields its ``/v1`` base URL."""

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 512
        daemon_threads = True

    srv = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


class _Gathering(http.server.BaseHTTPRequestHandler):
    """Answers once ``barrier.parties`` requests are in the server at the same time."""

    barrier: threading.Barrier
    protocol_version = "HTTP/1.1"  # keep-alive, as the client pools its connections

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            _Gathering.barrier.wait()
            code, body = 200, {"choices": [{"message": {"content": "together"}}]}
        except threading.BrokenBarrierError:
            code, body = 400, {"error": "the requests did not all arrive together"}
        _answer(self, code, json.dumps(body).encode())

    def log_message(self, *a):
        pass


async def test_model_api_has_max_instances_requests_in_flight_past_httpx_default_pool():
    """150 requests allowed in flight reach the server together (one httpx client's default pool holds 100
    connections and queued the rest; the resource spreads them over several clients)."""
    n = 150
    _Gathering.barrier = threading.Barrier(n, timeout=30)
    with _serving(_Gathering) as url:
        spec = ModelAPISpec(base_url=url, model="m", max_instances=n, max_retries=0, request_timeout=60)
        try:
            async with ResourceManager() as m:
                api = await m.acquire_global(spec)
                replies = await asyncio.gather(*(api.chat([{"role": "user", "content": str(i)}]) for i in range(n)))
                assert replies == ["together"] * n
        finally:
            _Gathering.barrier.abort()  # handler threads still waiting (a failed run) answer at once


class _Slow(http.server.BaseHTTPRequestHandler):
    """Answers after 5 s."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(5)
        _answer(self, 200, b'{"choices": [{"message": {"content": "late"}}]}')

    def log_message(self, *a):
        pass


async def test_model_api_released_mid_request_ends_its_requests_as_resource_died():
    """Requests in flight when the resource is released end as ResourceDied at once (they were an APIError with an
    empty 'ReadError' detail, or a retry after the backoff)."""
    with _serving(_Slow) as url:
        spec = ModelAPISpec(base_url=url, model="m", max_instances=4, max_retries=0)
        async with ResourceManager() as m:
            api = await m.acquire_global(spec)
            calls = [asyncio.ensure_future(api.chat([{"role": "user", "content": "hi"}])) for _ in range(4)]
            await asyncio.sleep(0.5)
            await api.adestroy()
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 3)
            assert all(isinstance(r, ResourceDied) for r in results), results
