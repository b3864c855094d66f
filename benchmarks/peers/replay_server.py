"""One model for every system: an OpenAI-compatible server that replays recorded turn counts, reply lengths and
generation times, and returns the token ids it "sampled".

Endpoints (starlette, served by uvicorn on 127.0.0.1):

- ``GET /v1/models``
- ``POST /v1/chat/completions`` (OpenAI chat; tool calls as ``message.tool_calls``; the sampled ids in
  ``choices[0].token_ids`` and ``prompt_token_ids`` as vLLM's ``return_token_ids`` gives them)
- ``POST /v1/completions`` (a token-id prompt, vLLM's field names: ``choices[0].token_ids``,
  ``logprobs.token_logprobs``; the reply carries its tool call as a Hermes ``<tool_call>`` block)

Which trajectory and which turn a request belongs to is read from the request itself, so that any client works:
the task prompt holds ``TASK-<k>`` and the turn is the number of assistant replies already in the conversation.
Trajectory ``k`` plays trace ``seed + k`` of a :class:`~bench_trace_rollout.Profile` (turn count divided by
``turn_div``, at least 2; reply length and generation time of each turn); the answer is held for the traced
generation time times ``time_scale`` (an inference server serving concurrent requests in parallel at a fixed
per-request speed, as the trace benchmark models it).  Every turn but the last asks for one tool call: for the
``container`` workload ``run`` with ``sleep <traced tool time x time_scale>; echo <k>-<t>``, for the ``light`` one
``lookup`` of a key; the last turn answers in plain text.

The reply's ids: ``filler`` ids drawn from a fixed pool of word tokens by a generator seeded with ``(seed, k, t)``
(a sampled sequence need not be the canonical tokenization of its text, as with a real model), then the
canonical ids of the tool call (or answer).  With a ``model`` (the bundled SmolLM2 in a ``TransformersPolicy``,
continuous batching on this machine's CPU), the filler is instead sampled by the model from the request's prompt
(as many tokens as the replayed length allows, seeded with ``(seed, k, t)``), the answer takes as long as that
generation does (no replayed delay), and the script (turn count, tool calls) stays the same for every system.  Every reply's ids are logged by ``(k, t)`` (``GET /log``), so a
harness can check whether the ids a trainer would get equal the ids sampled.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from typing import Any

import numpy as np

TASK_RE = re.compile(r"TASK-(\d+)")
FILLER_CAP = 48  # filler tokens at most per reply (the traced length sets the time, not the text size)


class Replay:
    """The deterministic model: ``reply(k, t)`` is trajectory k's turn t (ids, text, tool call, delay)."""

    def __init__(self, *, profile: Any, workload: str, seed: int, time_scale: float, turn_div: float,
                 tokenizer: Any, model: Any = None) -> None:
        self.profile, self.workload, self.seed, self.model = profile, workload, seed, model
        self.time_scale, self.turn_div, self.tok = time_scale, turn_div, tokenizer
        vocab = tokenizer.get_vocab()
        self.pool = sorted(i for s, i in vocab.items() if re.fullmatch(r"Ġ?[a-z]{3,8}", s))[:4000]
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.assistant_ids = tokenizer.encode("assistant", add_special_tokens=False)
        self.log: dict[str, list[int]] = {}
        self.served: dict[str, int] = {}  # "k/t" -> replies served for it (more than one: the client asked again)
        self.tool_seen: set[str] = set()  # "k/t": the conversation of turn t holds the result of tool call t - 1
        self._traces: dict[int, dict[str, Any]] = {}

    def trace(self, k: int) -> dict[str, Any]:
        if k not in self._traces:
            tr = self.profile.trace(self.seed + k)
            n = max(2, round(tr["turns"] / self.turn_div))
            self._traces[k] = {"turns": n, **{f: tr[f][:n] for f in ("reply_tokens", "gen_s", "tool_s")}}
        return self._traces[k]

    def turns(self, k: int) -> int:
        return self.trace(k)["turns"]

    def marker(self, k: int, t: int) -> str:
        """Text the result of trajectory k's tool call t holds when the tool really ran."""
        return f"{k}-{t}" if self.workload == "container" else f"k{(k * 31 + t) % 97} = "

    def saw(self, k: int, t: int, text: str) -> None:
        """Record whether the request for turn t carries the result of tool call t - 1."""
        if t > 0 and self.marker(k, t - 1) in text:
            self.tool_seen.add(f"{k}/{t}")

    def reset_logs(self) -> None:
        self.log.clear()
        self.served.clear()
        self.tool_seen.clear()

    async def reply(self, k: int, t: int, prompt_ids: list[int] | None = None) -> dict[str, Any]:
        tr = self.trace(k)
        t = min(t, tr["turns"] - 1)
        rng = np.random.default_rng([self.seed, k, t, 7])
        n_fill = int(min(FILLER_CAP, max(1, tr["reply_tokens"][t] - 24)))
        if self.model is not None and prompt_ids:
            filler = await self._sample(prompt_ids, n_fill, int(rng.integers(2**62)))
        else:
            filler = [int(x) for x in rng.choice(self.pool, size=n_fill)]
        call: dict[str, Any] | None = None
        if t < tr["turns"] - 1:
            if self.workload == "container":
                secs = tr["tool_s"][t] * self.time_scale
                call = {"name": "run", "arguments": {"cmd": f"sleep {secs:.4f}; echo {k}-{t}"}}
            else:
                call = {"name": "lookup", "arguments": {"key": f"k{(k * 31 + t) % 97}"}}
            tail = "\n<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        else:
            tail = f" ANSWER-{k}"
        ids = filler + self.tok.encode(tail, add_special_tokens=False)
        self.log[f"{k}/{t}"] = ids
        self.served[f"{k}/{t}"] = self.served.get(f"{k}/{t}", 0) + 1
        text = self.tok.decode(ids)
        content = self.tok.decode(filler) + ("" if call else tail)
        return {"ids": ids, "text": text, "content": content, "call": call,
                "delay_s": 0.0 if self.model is not None else tr["gen_s"][t] * self.time_scale}

    async def _sample(self, prompt_ids: list[int], n: int, seed: int) -> list[int]:
        """The model's reply to ``prompt_ids``: at most ``n`` sampled ids, its end-of-turn token dropped, cut
        before any text that would read as the script's own (a tool call, a task or answer marker)."""
        from agentfly_gym.rollout.policies.base import SamplingParams

        g = await self.model.generate(prompt_ids[-1500:], SamplingParams(max_tokens=n, temperature=1.0, seed=seed))
        ids = [i for i in g.token_ids if i != self.eos]
        while ids and any(m in self.tok.decode(ids) for m in ("<tool_call>", "TASK-", "ANSWER-", "<|im_")):
            ids.pop()
        return ids or self.pool[:1]


def _key_turn_chat(messages: list[dict[str, Any]]) -> tuple[int, int]:
    k = -1
    for m in messages:
        c = m.get("content")
        text = c if isinstance(c, str) else json.dumps(c)
        hit = TASK_RE.search(text or "")
        if hit:
            k = int(hit.group(1))
            break
    return k, sum(1 for m in messages if m.get("role") == "assistant")


def _key_turn_text(text: str) -> tuple[int, int, str]:
    """(trajectory k or -1, turn, the message before the generation prompt) of a text prompt."""
    hit = TASK_RE.search(text)
    parts = text.split("<|im_start|>")
    return (int(hit.group(1)) if hit else -1, max(0, text.count("<|im_start|>assistant") - 1),
            parts[-2] if len(parts) >= 2 else "")


def _key_turn_ids(replay: Replay, ids: list[int]) -> tuple[int, int, str]:
    """:func:`_key_turn_text` of a token-id prompt, decoding only the messages it needs (the task's and the last
    one), as an inference server given ids does not detokenize the whole prompt: the whole decode cost this server's
    CPU on every request of the token-id clients only."""
    starts = [i for i, x in enumerate(ids) if x == replay.im_start] + [len(ids)]
    asst = replay.assistant_ids
    t = max(0, sum(1 for i in starts[:-1] if ids[i + 1:i + 1 + len(asst)] == asst) - 1)
    k = -1
    for a, b in zip(starts, starts[1:3]):
        hit = TASK_RE.search(replay.tok.decode(ids[a:b]))
        if hit:
            k = int(hit.group(1))
            break
    last = replay.tok.decode(ids[starts[-3]:starts[-2]]) if len(starts) >= 3 else ""
    return k, t, last


def _render_chat(messages: list[dict[str, Any]]) -> str:
    """A chat request as the model's prompt text (ChatML, SmolLM2's format; tool calls and results as text)."""
    out = []
    for m in messages:
        c = m.get("content")
        text = c if isinstance(c, str) else json.dumps(c) if c else ""
        for call in m.get("tool_calls") or []:
            text += "\n<tool_call>\n" + json.dumps(call.get("function", call)) + "\n</tool_call>"
        out.append(f"<|im_start|>{m.get('role', 'user')}\n{text}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def make_app(replay: Replay):
    """The starlette app serving ``replay``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    stats = {"requests": 0, "bad": 0}

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [{"id": "replay", "object": "model", "owned_by": "bench"}]})

    async def chat(request: Request):
        body = await request.json()
        k, t = _key_turn_chat(body.get("messages") or [])
        stats["requests"] += 1
        if k < 0:
            stats["bad"] += 1
            return JSONResponse({"error": {"message": "no TASK-<k> in the conversation"}}, status_code=400)
        last = (body.get("messages") or [{}])[-1]
        replay.saw(k, t, last.get("content") if isinstance(last.get("content"), str) else json.dumps(last))
        prompt_ids = replay.tok.encode(_render_chat(body.get("messages") or []), add_special_tokens=False) \
            if replay.model is not None else None
        r = await replay.reply(k, t, prompt_ids)
        await asyncio.sleep(r["delay_s"])
        msg: dict[str, Any] = {"role": "assistant", "content": r["content"]}
        if r["call"]:
            msg["tool_calls"] = [{"id": f"call_{k}_{t}", "type": "function",
                                  "function": {"name": r["call"]["name"],
                                               "arguments": json.dumps(r["call"]["arguments"])}}]
        if body.get("stream"):
            return StreamingResponse(_sse(k, t, msg, r), media_type="text/event-stream")
        return JSONResponse({
            "id": f"chatcmpl-{k}-{t}", "object": "chat.completion", "created": int(time.time()), "model": "replay",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if r["call"] else "stop",
                         "token_ids": r["ids"], "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(r["ids"]), "total_tokens": len(r["ids"])}})

    async def _sse(k: int, t: int, msg: dict[str, Any], r: dict[str, Any]):
        base = {"id": f"chatcmpl-{k}-{t}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": "replay"}
        delta: dict[str, Any] = {"role": "assistant", "content": msg["content"]}
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + "\n\n"
        if msg.get("tool_calls"):
            calls = [{"index": 0, **c} for c in msg["tool_calls"]]
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"tool_calls": calls},
                                                              "finish_reason": None}]}) + "\n\n"
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "token_ids": r["ids"],
                                                          "finish_reason": "tool_calls" if r["call"] else "stop"}],
                                     "usage": {"prompt_tokens": 0, "completion_tokens": len(r["ids"]),
                                               "total_tokens": len(r["ids"])}}) + "\n\n"
        yield "data: [DONE]\n\n"

    async def completions(request: Request):
        body = await request.json()
        prompt = body.get("prompt")
        k, t, last = _key_turn_ids(replay, prompt) if isinstance(prompt, list) else _key_turn_text(str(prompt))
        stats["requests"] += 1
        if k < 0:
            stats["bad"] += 1
            return JSONResponse({"error": {"message": "no TASK-<k> in the prompt"}}, status_code=400)
        replay.saw(k, t, last)  # the message before the generation prompt
        r = await replay.reply(k, t, prompt if isinstance(prompt, list) else None)
        await asyncio.sleep(r["delay_s"])
        ids = r["ids"] + [replay.eos]
        return JSONResponse({
            "id": f"cmpl-{k}-{t}", "object": "text_completion", "created": int(time.time()), "model": "replay",
            "choices": [{"index": 0, "text": replay.tok.decode(ids), "token_ids": ids, "finish_reason": "stop",
                         "logprobs": {"token_logprobs": [-1.0] * len(ids)}}],
            "usage": {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 0,
                      "completion_tokens": len(ids), "total_tokens": len(ids)}})

    async def log(_: Request):
        return JSONResponse({"log": replay.log, "stats": stats})

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"]), Route("/log", log)])


class ReplayServer:
    """``with ReplayServer(replay) as url:`` serves ``replay`` on a free loopback port (a uvicorn thread);
    ``url`` ends in ``/v1``."""

    def __init__(self, replay: Replay) -> None:
        import socket

        import uvicorn

        self.replay = replay
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        cfg = uvicorn.Config(make_app(replay), host="127.0.0.1", port=self.port, log_level="warning",
                             backlog=4096, timeout_keep_alive=60)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the replay server did not start")
            time.sleep(0.05)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
