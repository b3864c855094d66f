"""Any OpenAI-compatible chat endpoint as a policy: messages in, a reply out.

:class:`EndpointPolicy` talks to ``POST {base_url}/chat/completions`` through the official ``openai`` client
(``openai.AsyncOpenAI``): vLLM, SGLang, llama.cpp's server, ``transformers serve``, hosted APIs.  It is a
*chat policy* (:class:`~agentfly_gym.rollout.policies.base.ChatPolicy`): the rollout gives it the conversation
as messages and the env's tools (OpenAI function schemas, sent as ``tools=``) and gets back a
:class:`ChatReply`; a native ``tool_calls`` answer is kept as such (the episode turns it into the text form the
env parses, :mod:`agentfly_gym.rollout.chat_episode`).

Token ids: with ``token_ids=True`` (vLLM >= 0.10.2) the request asks for vLLM's ``return_token_ids`` and the
sampled tokens' ``logprobs``; the reply then carries the prompt's and the reply's token ids as the server
rendered and sampled them.  Without them (most servers, hosted APIs) the reply is text only, and so is the
trajectory (``Trajectory.text_only``): the training paths refuse it rather than re-tokenize its text.

Faults: HTTP 429 and 5xx, connection errors (a response cut short included) and timeouts are retried by the
``openai`` client (``max_retries`` times, exponential backoff, ``Retry-After`` honoured); what is left raises
:class:`EndpointError`, which the episode records as an infrastructure error (``status="error"``), never as a
reward of 0.  ``requests_per_second`` spaces the starts of requests evenly (a client-side rate limit).

The API key is read from the environment variable ``api_key_env`` when the policy is made and handed to the
client only: :meth:`EndpointPolicy.describe`, ``repr`` and error messages never hold it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import ConfigError, PolicyError
from ...limits import check_int
from .base import SamplingParams

__all__ = ["ChatReply", "EndpointError", "EndpointPolicy", "RateLimiter"]

log = logging.getLogger(__name__)

#: The placeholder key sent to local servers that need none (the ``openai`` client refuses to run without one).
NO_KEY = "EMPTY"


class EndpointError(PolicyError):
    """The endpoint failed after the retries (an HTTP status, a connection error, a timeout).  ``status`` is
    the last HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class ChatReply:
    """One reply of a chat endpoint.

    Attributes:
        text: the message's ``content`` ("" when it only called tools).
        tool_calls: native tool calls, each ``{"id": str, "name": str, "arguments": str}`` (arguments as the
            JSON text the endpoint returned); empty when none.
        finish_reason: ``"stop"``, ``"length"`` (``max_tokens`` hit) or ``"tool_calls"``.
        token_ids: the sampled ids (length n) when the server returned them, else None.
        logprobs: per sampled id its logprob (length n), when returned, else None.
        prompt_token_ids: the ids of the prompt as the server rendered it, when returned, else None.
        latency: seconds the request took, retries and rate-limit waits included.
    """

    text: str
    tool_calls: list[dict[str, str]] = dataclasses.field(default_factory=list)
    finish_reason: str = "stop"
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    latency: float = 0.0


class RateLimiter:
    """Spaces the starts of requests at least ``1 / per_second`` seconds apart (FIFO among waiters).

    Args:
        per_second: most request starts per second.
        clock, sleep: the monotonic clock (seconds) and the coroutine that waits (seconds); the defaults are
            ``time.monotonic`` and ``asyncio.sleep``.

    Raises:
        ConfigError: ``per_second`` is not a positive finite number.
    """

    def __init__(self, per_second: float, *, clock: Any = time.monotonic, sleep: Any = asyncio.sleep) -> None:
        import math

        if isinstance(per_second, bool) or not isinstance(per_second, (int, float)) or not math.isfinite(per_second) \
                or per_second <= 0:
            raise ConfigError(f"requests_per_second={per_second!r} must be a positive number")
        self.interval = 1.0 / float(per_second)
        self._clock, self._sleep = clock, sleep
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        """Return when the next request may start."""
        async with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            await self._sleep(start - now)


class EndpointPolicy:
    """A chat policy over an OpenAI-compatible endpoint (see the module docstring).

    Args:
        model: the model name the endpoint serves.
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (None: the ``openai`` client's default, i.e.
            ``$OPENAI_BASE_URL`` or OpenAI's API).
        api_key_env: the environment variable holding the key.  None: with no ``base_url`` (the ``openai``
            client's default endpoint) ``$OPENAI_API_KEY`` as that client reads it; with a ``base_url`` a
            placeholder key, for local servers that need none (a key is never sent to a URL it was not named for).
        timeout: seconds one attempt may take (connect + answer).
        max_retries: retries after a 429, a 5xx, a connection error or a timeout (the ``openai`` client's).
        requests_per_second: a client-side rate limit on request starts (None: none).
        max_concurrency: most requests in flight at once (None: no bound besides the rollout's).
        token_ids: ask for vLLM's ``return_token_ids`` and logprobs (a server without them answers 400).
        extra_body: more request fields (e.g. ``{"top_k": 20}`` for vLLM).

    Raises:
        ConfigError: ``api_key_env`` names an unset variable, or a bad number.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = None,
                 timeout: float = 120.0, max_retries: int = 4, requests_per_second: float | None = None,
                 max_concurrency: int | None = None, token_ids: bool = False,
                 extra_body: Mapping[str, Any] | None = None) -> None:
        import openai

        if not isinstance(model, str) or not model:
            raise ConfigError(f"model={model!r} must be a non-empty model name")
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise ConfigError(f"api_key_env={api_key_env!r}: the environment variable is not set (or empty); export "
                              "the endpoint's key there")
        max_retries = check_int("max_retries", max_retries, minimum=0)
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"timeout={timeout!r} must be a number of seconds > 0")
        max_concurrency = check_int("max_concurrency", max_concurrency, optional=True)
        self.model, self.base_url, self.api_key_env = model, base_url, api_key_env
        self.token_ids = bool(token_ids)
        self.extra_body = dict(extra_body or {})
        self.timeout, self.max_retries = float(timeout), max_retries
        self._limiter = RateLimiter(requests_per_second) if requests_per_second is not None else None
        self._max_concurrency = max_concurrency
        self._sem: asyncio.Semaphore | None = None
        # the key goes to the client only (it sends it as a header); nothing of this object keeps it
        if api_key_env:
            key = os.environ[api_key_env]
        else:
            key = (os.environ.get("OPENAI_API_KEY") if base_url is None else None) or NO_KEY
        self._client = openai.AsyncOpenAI(api_key=key,
                                          base_url=base_url, timeout=self.timeout, max_retries=max_retries)
        #: no local tokenizer: an endpoint renders and tokenizes on its side
        self.tokenizer = None

    def __repr__(self) -> str:
        return f"EndpointPolicy(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def text_only(self) -> bool:
        """True when replies carry no token ids (``token_ids=False``)."""
        return not self.token_ids

    def describe(self) -> dict[str, Any]:
        """What to record of this policy in an output file (never the key: only the variable's name)."""
        return {"kind": "endpoint", "model": self.model, "base_url": self.base_url, "api_key_env": self.api_key_env,
                "token_ids": self.token_ids}

    async def complete(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] = (),
                       sampling: SamplingParams | None = None) -> ChatReply:
        """One reply to ``messages`` (OpenAI chat messages; assistant messages may hold ``tool_calls``).

        Args:
            messages: the conversation so far.
            tools: OpenAI function schemas (``{"type": "function", "function": {...}}`` or the bare function
                dicts), sent as ``tools=``; empty: none sent.
            sampling: ``max_tokens``, ``temperature``, ``top_p``, ``seed`` are sent (``top_k`` and
                ``stop_token_ids`` through vLLM's extra fields, only when set).

        Raises:
            EndpointError: the endpoint failed after the retries, or answered a body that is not a chat
                completion (not JSON, not UTF-8, no choice, no message).
            asyncio.CancelledError: when cancelled.
        """
        import openai

        s = sampling or SamplingParams()
        body: dict[str, Any] = dict(self.extra_body)
        if s.top_k and s.top_k > 0:
            body.setdefault("top_k", s.top_k)
        if s.stop_token_ids:
            body.setdefault("stop_token_ids", list(s.stop_token_ids))
        kwargs: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages],
                                  "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
        if s.seed is not None:
            kwargs["seed"] = s.seed
        if tools:
            kwargs["tools"] = [t if "function" in t else {"type": "function", "function": dict(t)} for t in tools]
        if self.token_ids:
            body.setdefault("return_token_ids", True)
            kwargs["logprobs"] = True
        if body:
            kwargs["extra_body"] = body
        if self._max_concurrency is not None and self._sem is None:
            self._sem = asyncio.Semaphore(self._max_concurrency)
        t0 = time.monotonic()
        try:
            if self._sem is not None:
                async with self._sem:
                    resp = await self._send(kwargs)
            else:
                resp = await self._send(kwargs)
        except openai.APIStatusError as e:
            raise EndpointError(f"the endpoint {self.base_url or 'default'} answered HTTP {e.status_code} for model "
                                f"{self.model!r} after {self.max_retries} retries: {_short(e.message)}",
                                e.status_code) from None
        except openai.APITimeoutError:
            raise EndpointError(f"the endpoint {self.base_url or 'default'} did not answer within {self.timeout:g} s "
                                f"(after {self.max_retries} retries)") from None
        except openai.APIConnectionError as e:
            raise EndpointError(f"could not reach the endpoint {self.base_url or 'default'} (after {self.max_retries} "
                                f"retries): {_short(str(e.__cause__ or e))}") from None
        except ValueError as e:  # a body the client could not parse: not JSON, not UTF-8
            raise EndpointError(f"the endpoint {self.base_url or 'default'} answered a body that is not a chat "
                                f"completion: {type(e).__name__}: {_short(str(e))}") from None
        return _reply(resp, time.monotonic() - t0, max_tokens=s.max_tokens)

    async def _send(self, kwargs: dict[str, Any]) -> Any:
        if self._limiter is not None:
            await self._limiter.wait()
        return await self._client.chat.completions.create(**kwargs)

    async def aclose(self) -> None:
        """Close the HTTP client.  Idempotent."""
        await self._client.close()

    def close(self) -> None:
        """Sync :meth:`aclose` (from code with no running loop; the rollout CLI's way)."""
        from ...utils.aio import run_sync

        try:
            run_sync(self.aclose())
        except Exception:
            log.debug("closing the endpoint client failed", exc_info=True)


def _short(text: str, n: int = 300) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n] + "..."


# The most characters one sampled token can stand for, with room to spare: a reply longer than max_tokens times
# this (text and tool calls together) ignored max_tokens, and is refused rather than stored.
CHARS_PER_TOKEN_BOUND = 64


def _reply(resp: Any, latency: float, *, max_tokens: int | None = None) -> ChatReply:
    """A :class:`ChatReply` from a ``ChatCompletion`` (vLLM's ``token_ids`` / ``prompt_token_ids`` read from its
    extra fields).

    Raises:
        EndpointError: no choice, a choice without a message, token ids that do not match their logprobs, or
            (given ``max_tokens``) a reply past it: more token ids than ``max_tokens``, or more characters than
            ``max_tokens * CHARS_PER_TOKEN_BOUND + 1024`` (an endpoint that ignores ``max_tokens`` would
            otherwise fill the trajectory files).
    """
    choices = getattr(resp, "choices", None) or []
    if not choices:
        raise EndpointError(f"the endpoint's answer holds no choice: {_short(repr(resp))}")
    choice = choices[0]
    msg = getattr(choice, "message", None)
    if msg is None:
        raise EndpointError(f"the endpoint's choice holds no message: {_short(repr(choice))}")
    calls = []
    for c in getattr(msg, "tool_calls", None) or []:
        fn = getattr(c, "function", None)
        if fn is None:
            continue
        args = fn.arguments if isinstance(fn.arguments, str) else json.dumps(fn.arguments)
        calls.append({"id": str(getattr(c, "id", "") or ""), "name": str(fn.name or ""), "arguments": args or "{}"})
    if max_tokens is not None:
        size = len(msg.content or "") + sum(len(c["name"]) + len(c["arguments"]) for c in calls)
        bound = max_tokens * CHARS_PER_TOKEN_BOUND + 1024
        if size > bound:
            raise EndpointError(f"the endpoint's reply holds {size} characters, more than max_tokens={max_tokens} "
                                f"tokens can (at most {bound}): it ignored max_tokens; the reply is refused")
    finish = choice.finish_reason or "stop"
    finish = finish if finish in ("stop", "length", "tool_calls") else "stop"
    ids = _extra(choice, "token_ids")
    prompt_ids = _extra(resp, "prompt_token_ids")
    logprobs = None
    content_lp = getattr(getattr(choice, "logprobs", None), "content", None)
    if content_lp:
        logprobs = [float(x.logprob) for x in content_lp]
    if ids is not None:
        ids = [int(i) for i in ids]
        if max_tokens is not None and len(ids) > max_tokens:
            raise EndpointError(f"the endpoint returned {len(ids)} token ids for max_tokens={max_tokens}: it ignored "
                                "max_tokens; the reply is refused")
        if logprobs is not None and len(logprobs) != len(ids):
            # vLLM leaves the stop token out of the logprobs in some versions: such ids have no faithful logprobs
            log.debug("endpoint returned %d logprobs for %d token ids; logprobs dropped", len(logprobs), len(ids))
            logprobs = None
    return ChatReply(text=msg.content or "", tool_calls=calls, finish_reason=finish, token_ids=ids,
                     logprobs=logprobs if ids is not None else None,
                     prompt_token_ids=[int(i) for i in prompt_ids] if prompt_ids is not None else None,
                     latency=latency)


def _extra(obj: Any, name: str) -> Any:
    value = getattr(obj, name, None)
    if value is None:
        value = (getattr(obj, "model_extra", None) or {}).get(name)
    return value if isinstance(value, list) else None
