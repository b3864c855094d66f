"""The gateway: an OpenAI-compatible HTTP API (Starlette) in front of any :class:`TextPolicy`, recording token ids.

Routes (every body and error in OpenAI's shapes; errors are ``{"error": {"message", "type", "param", "code"}}``):

* ``POST /sessions`` (admin key): open a session; body ``{"max_turns": int, "metadata": {...}}`` (both optional);
  answers ``{"id", "api_key", "base_url"}`` (``base_url`` is the session's path ``/sessions/{id}/v1``).
* ``POST /sessions/{id}/v1/chat/completions`` and ``GET /sessions/{id}/v1/models`` (the session's api key): the
  OpenAI API of one rollout; every call is recorded (:mod:`.session`).
* ``GET /sessions/{id}/trajectory`` (the session's key or the admin key): the recorded segments
  (:meth:`Session.trajectory`).  ``DELETE /sessions/{id}`` (admin key): close it, return its trajectory and
  forget it (the gateway holds no more of it).
* ``POST /v1/chat/completions``, ``GET /v1/models`` (admin key): the same API, recorded nowhere.

Keys travel as ``Authorization: Bearer <key>`` (what the ``openai`` client sends).  A wrong key and an unknown
session get the same 401, so session ids cannot be probed.  Bodies over ``max_body_bytes`` get 413, JSON that does
not parse (or nests too deeply) 400, a prompt past the policy's context 400 ``context_length_exceeded``.

Request fields read: ``messages``, ``tools``, ``tool_choice`` (``"none"`` turns tool-call parsing off),
``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop`` (a reply is cut right
after the first token whose text completes a stop string: the ids kept are a prefix of the ids sampled),
``logprobs`` (``choices[0].logprobs.content``: one ``{"token", "logprob", "bytes", "top_logprobs": []}`` per
sampled id), ``stream`` (server-sent events, ``chat.completion.chunk``; ``stream_options.include_usage``), ``n``
(1 only) and vLLM's ``return_token_ids`` (``prompt_token_ids`` and ``choices[0].token_ids``).  Other fields are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import secrets
import time
import uuid
from typing import Any

from ..data.task_draw import check_seed
from ..errors import ConfigError, PolicyError, TokenizationError
from ..limits import check_int
from ..rollout.policies.base import SamplingParams
from .messages import BadRequest, as_bad_request, read_messages, read_tools, reply_message
from .session import Session

__all__ = ["Gateway"]

log = logging.getLogger(__name__)


class Gateway:
    """Sessions over one policy, and the ASGI app that serves them (:attr:`app`).

    Args:
        policy: a :class:`~agentfly_gym.rollout.policies.base.TextPolicy`.
        chat: the :class:`~agentfly_gym.rollout.chat.ChatTokenizer` of its tokenizer.
        model_name: the model id ``/v1/models`` lists and replies carry.
        max_turns: default turn limit of a session (calls).
        max_tokens: default and largest ``max_tokens`` of a reply (tokens).
        max_body_bytes: largest request body (bytes).
        max_sessions: most open sessions (a new one beyond is refused, 429).
        admin_key: the key of the admin routes; None draws one (:attr:`admin_key`).
        tool_format: how tool calls are written (:data:`~agentfly_gym.tools.formats.FORMATS`); None: what the
            chat template teaches (:func:`~agentfly_gym.tools.formats.detect_tool_format`).
        default_sampling: the sampling of a request that sets none (``temperature`` 1.0, ``top_p`` 1.0).

    Raises:
        ConfigError: a bad limit.
    """

    def __init__(self, policy: Any, chat: Any, *, model_name: str = "agentfly-policy", max_turns: int = 32,
                 max_tokens: int = 512, max_body_bytes: int = 4 << 20, max_sessions: int = 1024,
                 admin_key: str | None = None, tool_format: str | None = None,
                 default_sampling: SamplingParams | None = None) -> None:
        from ..tools.formats import FORMATS, detect_tool_format

        max_turns, max_tokens = check_int("max_turns", max_turns), check_int("max_tokens", max_tokens, unit="tokens")
        max_body_bytes = check_int("max_body_bytes", max_body_bytes, unit="bytes")
        max_sessions = check_int("max_sessions", max_sessions)
        if tool_format is not None and tool_format not in FORMATS:
            raise ConfigError(f"tool_format={tool_format!r} is not one of {FORMATS}", field="tool_format")
        self.policy, self.chat, self.model_name = policy, chat, model_name
        self.max_turns, self.max_tokens, self.max_body_bytes, self.max_sessions = (max_turns, max_tokens,
                                                                                   max_body_bytes, max_sessions)
        self.admin_key = admin_key or "afg-admin-" + secrets.token_urlsafe(32)
        self.tool_format = tool_format or detect_tool_format(getattr(chat.tokenizer, "chat_template", None))
        self.default_sampling = default_sampling or SamplingParams(max_tokens=max_tokens)
        self.sessions: dict[str, Session] = {}
        self._decoy_key = ("afg-" + secrets.token_urlsafe(32)).encode()
        self.app = self._build_app()

    # ------------------------------------------------------------------ sessions (Python API)

    def open_session(self, *, max_turns: int | None = None, metadata: dict[str, Any] | None = None) -> Session:
        """A new session (its :attr:`Session.id` and :attr:`Session.api_key` go to the agent).

        Raises:
            BadRequest: ``max_sessions`` sessions are open (429).
            ConfigError: a bad ``max_turns``.
        """
        if sum(not s.closed for s in self.sessions.values()) >= self.max_sessions:
            raise BadRequest(f"{self.max_sessions} sessions are open; close one first", status=429,
                             code="too_many_sessions", kind="rate_limit_error")
        s = Session(max_turns=self.max_turns if max_turns is None else max_turns, metadata=metadata)
        self.sessions[s.id] = s
        return s

    def close_session(self, session_id: str, *, forget: bool = False) -> dict[str, Any]:
        """Close a session and return its trajectory; ``forget`` also drops it from memory.

        Raises:
            KeyError: no such session.
        """
        s = self.sessions[session_id]
        s.close()
        if forget:
            del self.sessions[session_id]
        return s.trajectory()

    # ------------------------------------------------------------------ one call

    def _sampling(self, body: dict[str, Any]) -> SamplingParams:
        d = self.default_sampling
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:  # absent or null (clients send null for "not set")
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = min(d.max_tokens, self.max_tokens)
        with as_bad_request("max_tokens"):
            max_tokens = check_int("max_tokens", max_tokens, maximum=self.max_tokens)
        kw: dict[str, Any] = {"max_tokens": max_tokens}
        for name in ("temperature", "top_p"):
            v = body.get(name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise BadRequest(f"{name}={v!r} must be a number", param=name)
                kw[name] = float(v)
        seed = body.get("seed")
        if seed is not None:
            with as_bad_request("seed"):
                seed = check_seed(seed)
        with as_bad_request():
            return SamplingParams(temperature=kw.get("temperature", d.temperature), top_p=kw.get("top_p", d.top_p),
                                  top_k=d.top_k, max_tokens=max_tokens, seed=seed, stop_token_ids=d.stop_token_ids)

    def _stop_strings(self, body: dict[str, Any]) -> list[str]:
        stop = body.get("stop")
        if stop is None:
            return []
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or len(stops) > 16 or not all(isinstance(s, str) and s for s in stops):
            raise BadRequest("stop must be a non-empty string or a list of up to 16 of them", param="stop")
        return stops

    def _cut_at_stop(self, ids: list[int], stops: list[str]) -> int | None:
        """The number of ids up to and including the one whose text completes a stop string, or None."""
        if not stops:
            return None
        text = self.chat.tokenizer.decode(ids, skip_special_tokens=True)
        if not any(s in text for s in stops):
            return None
        for k in range(1, len(ids) + 1):
            if any(s in self.chat.tokenizer.decode(ids[:k], skip_special_tokens=True) for s in stops):
                return k
        return None

    def _plan_prompt(self, messages: list[Any], tools: list[dict[str, Any]] | None,
                     session: Session | None) -> tuple[list[int], bool]:
        if session is not None:
            return session.plan_prompt(messages, tools, self.chat)
        from .messages import template_messages

        return self.chat.prompt_ids(template_messages(messages, renders_tools=self.chat.renders_tools),
                                    tools=tools), False

    async def complete(self, body: Any, session: Session | None) -> dict[str, Any]:
        """Answer one chat-completion request (a parsed JSON body) and record it in ``session`` (None: nowhere).

        Returns:
            The ``chat.completion`` object.

        Raises:
            BadRequest: anything wrong with the request, the session's limits, or the prompt's length.
        """
        if not isinstance(body, dict):
            raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
        if body.get("n") not in (None, 1):
            raise BadRequest("n must be 1: each sample is one recorded call", param="n")
        messages = read_messages(body.get("messages"))
        tools = read_tools(body.get("tools"))
        sampling = self._sampling(body)
        stops = self._stop_strings(body)
        parse_calls = body.get("tool_choice") != "none"
        t0 = time.monotonic()
        if session is not None:
            session.take_turn()
            try:
                await session.lock.acquire()
            except BaseException:  # cancelled while another call of the session runs: the turn was not used
                session.release_turn()
                raise
        try:
            try:
                # rendering and tokenizing a body of megabytes takes seconds: off the event loop, so one agent's
                # huge prompt does not stall every other session (the session's lock keeps its state still)
                prompt_ids, incremental = await asyncio.to_thread(self._plan_prompt, messages, tools, session)
            except TokenizationError as e:
                raise BadRequest(f"the chat template cannot render these messages: {e}", param="messages") from None
            except Exception as e:  # noqa: BLE001  (a template's own error, e.g. jinja's raise_exception)
                raise BadRequest(f"the chat template rejects these messages: {type(e).__name__}: {e}",
                                 param="messages") from None
            try:
                with as_bad_request():
                    gen = await self.policy.generate(list(prompt_ids), sampling)
            except PolicyError as e:
                if any(w in str(e) for w in ("long", "length", "context")):  # the prompt does not fit the model
                    raise BadRequest(str(e), code="context_length_exceeded", param="messages") from None
                raise BadRequest(f"the policy failed: {e}", status=500, kind="server_error") from None
            sampled, logprobs = list(gen.token_ids), (list(gen.logprobs) if gen.logprobs is not None else None)
            finish = gen.finish_reason if gen.finish_reason in ("stop", "length") else "stop"
            cut = self._cut_at_stop(sampled, stops)
            if cut is not None:
                sampled, logprobs, finish = sampled[:cut], (logprobs[:cut] if logprobs is not None else None), "stop"
            text = self.chat.tokenizer.decode(sampled, skip_special_tokens=True)
            message, canon, hint = reply_message(text, tools=tools, tool_format=self.tool_format,
                                                 parse_calls=parse_calls)
            if hint and finish == "stop":
                finish = hint
            if session is not None:
                session.record(prompt_ids, sampled, logprobs, messages, canon, tools, incremental=incremental,
                               finish_reason=finish, seconds=time.monotonic() - t0)
        except BaseException:
            if session is not None:
                session.release_turn()
            raise
        finally:
            if session is not None:
                session.lock.release()
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._token_logprobs(sampled, logprobs)}
        out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
               "model": self.model_name, "choices": [choice], "system_fingerprint": None,
               "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(sampled),
                         "total_tokens": len(prompt_ids) + len(sampled)}}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(sampled)
        return out

    def _token_logprobs(self, ids: list[int], logprobs: list[float] | None) -> list[dict[str, Any]]:
        tok = self.chat.tokenizer
        out = []
        for k, t in enumerate(ids):
            piece = tok.decode([t])
            lp = logprobs[k] if logprobs is not None else None
            out.append({"token": piece, "logprob": lp if lp is not None and math.isfinite(lp) else -9999.0,
                        "bytes": list(piece.encode("utf-8")), "top_logprobs": []})
        return out

    # ------------------------------------------------------------------ HTTP

    def _build_app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        from .http import not_found, routes

        return Starlette(routes=[Route(path, handler, methods=methods) for path, handler, methods in routes(self)],
                         exception_handlers={404: not_found, 405: not_found})

    def session_for(self, session_id: str, key: str | None, *, admin_ok: bool = False) -> Session:
        """The session ``session_id`` if ``key`` is its api key (or, with ``admin_ok``, the admin key).

        Raises:
            BadRequest: 401 for an unknown session and for a wrong key alike.
        """
        s = self.sessions.get(session_id)
        # an unknown session compares the key too (against a key no one holds): its 401 takes the time a known
        # session's does, so answers' timing does not tell which session ids exist
        ok = s.check_key(key) if s is not None else hmac.compare_digest(str(key).encode(), self._decoy_key)
        if s is not None and (ok or (admin_ok and self.is_admin(key))):
            return s
        raise BadRequest("invalid api key for this session", status=401, code="invalid_api_key")

    def is_admin(self, key: str | None) -> bool:
        """Whether ``key`` is the admin key (constant-time comparison)."""
        return isinstance(key, str) and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def models(self) -> dict[str, Any]:
        """``/v1/models``'s list object."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentfly-gym"}]}

    def stream_chunks(self, completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        """A finished completion as ``chat.completion.chunk`` objects: the role, the content (one chunk per
        sampled token's text), the tool calls, the finish reason, and the usage when asked."""
        choice = completion["choices"][0]
        msg = choice["message"]
        base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
                "model": completion["model"], "system_fingerprint": None}

        def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

        out = [chunk({"role": "assistant", "content": ""})]
        lps = (choice.get("logprobs") or {}).get("content") or []
        if msg.get("content"):
            if lps and not msg.get("tool_calls") and "".join(x["token"] for x in lps) == msg["content"]:
                out += [chunk({"content": x["token"]}, logprobs={"content": [x]}) for x in lps]
            else:
                out.append(chunk({"content": msg["content"]}, logprobs={"content": lps} if lps else None))
        for k, call in enumerate(msg.get("tool_calls") or []):
            out.append(chunk({"tool_calls": [{"index": k, **call}]}))
        out.append(chunk({}, choice["finish_reason"]))
        if include_usage:
            out.append({**base, "choices": [], "usage": completion["usage"]})
        return out

