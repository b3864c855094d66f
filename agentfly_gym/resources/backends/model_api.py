"""External OpenAI-compatible endpoints as resources (``ModelAPISpec``).

The resource is an HTTP client plus a concurrency bound: at most ``spec.max_instances``
requests are in flight through one instance (a semaphore), so a global-scope instance
shared by every rollout caps the load on the endpoint.  Retries: HTTP 429 and 5xx, and
connection errors, up to ``spec.max_retries`` times with exponential backoff starting at
``spec.backoff`` seconds (``Retry-After`` honoured when given).  The API key is read from
the environment variable ``spec.api_key_env`` at start; it is never logged or shown in
errors or ``repr``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any

from ...errors import ResourceDied, ResourceError, ResourceStartError
from ..base import Resource, ResourceStatus
from ..spec import ModelAPISpec

__all__ = ["ModelAPIResource", "APIError", "create"]

log = logging.getLogger(__name__)


class APIError(ResourceError):
    """The endpoint answered with an error that retries did not fix.  ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


#: Requests in flight per ``httpx.AsyncClient`` (its pooled connections).  httpcore's pool scans every queued
#: request against every connection, and every idle connection against all of them, on each request's start
#: and end: one client for 256 requests in flight spent 36 s of a 44 s run there.  ``max_instances`` requests
#: are spread over ``ceil(max_instances / CONNECTIONS_PER_CLIENT)`` clients, the least busy first.  Measured with
#: the peers benchmark's light workload (128 multi-turn rollouts, 64 in flight, replay server on this host,
#: 2 cores; benchmarks/bench_peers.py): 8 per client ran in 1.28-1.46 s, 32 in 2.0-2.6 s, 64 in 4.2-4.4 s.
CONNECTIONS_PER_CLIENT = 8


#: Longest wait, in seconds, that a 429 or 5xx answer's ``Retry-After`` can ask for before a retry.
MAX_RETRY_AFTER = 60.0


def _json_object(r: Any, url: str) -> dict[str, Any]:
    """The JSON object answered in ``r`` (an ``httpx.Response`` with a status below 400).

    Raises:
        APIError: the body is not a JSON object (an HTML page, a 204, a redirect not followed, a list).
    """
    try:
        data = r.json()
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        data = None
    if not isinstance(data, dict):
        raise APIError(f"{url} answered {r.status_code} without a JSON object: {r.text[:300]!r}", r.status_code)
    return data


class ModelAPIResource(Resource):
    """An OpenAI-compatible endpoint: ``await api.chat(messages, ...)``, ``await api.post(path, json)``.

    Attributes:
        requests: requests sent (attempts, retries included).
        retries: retries made after 429/5xx/connection errors.
    """

    def __init__(self, spec: ModelAPISpec, *, labels: dict[str, str] | None = None) -> None:
        super().__init__(spec, labels=labels)
        self.spec: ModelAPISpec = spec
        self._clients: list[Any] = []
        self._busy: list[int] = []  # requests in flight per client
        self._sem = asyncio.Semaphore(spec.max_instances)
        self.requests = 0
        self.retries = 0

    def __repr__(self) -> str:  # never show headers or the key
        return f"<ModelAPIResource {self.id} {self.spec.base_url} model={self.spec.model} {self._status.value}>"

    async def start(self) -> None:
        import httpx

        headers = {}
        if self.spec.api_key_env is not None:
            key = os.environ.get(self.spec.api_key_env)
            if not key:
                raise ResourceStartError(f"environment variable {self.spec.api_key_env} (the API key for "
                                         f"{self.spec.base_url}) is not set")
            headers["Authorization"] = f"Bearer {key}"
        per = min(CONNECTIONS_PER_CLIENT, self.spec.max_instances)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        self._clients = [httpx.AsyncClient(base_url=self.spec.base_url.rstrip("/") + "/", headers=headers,
                                           timeout=self.spec.request_timeout, limits=limits)
                         for _ in range(-(-self.spec.max_instances // per))]
        self._busy = [0] * len(self._clients)
        self._status = ResourceStatus.READY

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` as JSON to ``base_url/path`` and return the JSON answer (with retries; a 429 or 5xx
        answer's ``Retry-After`` is honoured up to :data:`MAX_RETRY_AFTER` seconds).

        Raises:
            APIError: a 4xx other than 429, retries exhausted, or an answer that is not a JSON object.
            ResourceDied: the resource was released.
        """
        import httpx

        if not self._clients:
            raise ResourceDied(f"{self.id} is not started or was released")
        delay = self.spec.backoff
        async with self._sem:
            for attempt in range(self.spec.max_retries + 1):
                self.requests += 1
                try:
                    r = await self._post_once(path.lstrip("/"), payload)
                except httpx.TransportError as e:
                    if not self._clients:  # released while the request was in flight: its client was closed
                        raise ResourceDied(f"{self.id} was released") from e
                    status, detail, retry_after = 0, f"{type(e).__name__}: {e}", None
                else:
                    if r.status_code < 400:
                        return _json_object(r, f"{self.spec.base_url}/{path.lstrip('/')}")
                    status, detail = r.status_code, r.text[:500]
                    retry_after = r.headers.get("retry-after")
                    if status != 429 and status < 500:
                        raise APIError(f"{self.spec.base_url}/{path.lstrip('/')} answered {status}: {detail}", status)
                if attempt == self.spec.max_retries:
                    raise APIError(f"{self.spec.base_url}/{path.lstrip('/')} failed after {attempt + 1} attempts "
                                   f"(last: {status or 'no answer'}: {detail})", status)
                self.retries += 1
                # the server's Retry-After, up to MAX_RETRY_AFTER: a hostile or broken one must not park the
                # request (and its slot of max_instances) for hours
                wait = min(float(retry_after), MAX_RETRY_AFTER) \
                    if retry_after and retry_after.replace(".", "", 1).isdigit() else delay
                log.info("%s: retrying after %s (%.2fs)", self.id, status or "connection error", wait)
                await asyncio.sleep(wait * (1 + 0.1 * random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    async def _post_once(self, path: str, payload: dict[str, Any]) -> Any:
        """One POST on the least busy client."""
        clients, busy = self._clients, self._busy
        if not clients:
            raise ResourceDied(f"{self.id} was released")
        k = min(range(len(busy)), key=busy.__getitem__)
        busy[k] += 1
        try:
            return await clients[k].post(path, json=payload)
        finally:
            busy[k] -= 1

    async def chat(self, messages: list[dict[str, str]], **params: Any) -> str:
        """One chat completion; returns the first choice's message content."""
        payload = {"model": self.spec.model, "messages": messages, **params}
        data = await self.post("chat/completions", payload)
        try:
            content = data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise APIError(f"unexpected chat completion answer: {str(data)[:300]}") from e
        if not isinstance(content, str):
            raise APIError(f"unexpected chat completion answer (content is not text): {str(data)[:300]}")
        return content

    async def reset(self) -> None:
        """Nothing to do: an endpoint client keeps no per-rollout state."""

    async def status(self) -> ResourceStatus:
        return self._status

    async def adestroy(self) -> None:
        clients, self._clients, self._busy = self._clients, [], []
        self._status = ResourceStatus.STOPPED
        for client in clients:
            await client.aclose()


def create(spec: ModelAPISpec, labels: dict[str, str]) -> ModelAPIResource:
    """The ``("model_api", "")`` backend: an unstarted :class:`ModelAPIResource` for ``spec``."""
    return ModelAPIResource(spec, labels=labels)
