"""The gateway's HTTP handlers (Starlette): reading hostile bodies, keys, and OpenAI-shaped answers.

See :mod:`.app` for the routes.  Every failure is answered as OpenAI's error object; nothing the agent sends
reaches a traceback or another session.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from ..limits import check_int
from .messages import BadRequest, as_bad_request

__all__ = ["dumps", "not_found", "read_json", "routes"]

log = logging.getLogger(__name__)


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (non-finite floats refused: OpenAI's clients parse strict JSON)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _error(e: BadRequest) -> Any:
    from starlette.responses import Response


    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return Response(dumps(e.body()), status_code=e.status, media_type="application/json", headers=headers)


def _ok(obj: Any) -> Any:
    from starlette.responses import Response


    return Response(dumps(obj), media_type="application/json")


async def not_found(request: Any, exc: Any) -> Any:
    """Starlette's 404 / 405 in OpenAI's error shape."""
    status = getattr(exc, "status_code", 404)
    what = "no such route" if status == 404 else f"method {request.method} is not allowed here"
    return _error(BadRequest(f"{what}: {request.method} {request.url.path}", status=status,
                             code="not_found" if status == 404 else "method_not_allowed"))


def bearer(request: Any) -> str | None:
    """The key of ``Authorization: Bearer <key>`` (None without one)."""
    auth = request.headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


async def read_json(request: Any, max_bytes: int) -> Any:
    """The request's JSON body, read in chunks up to ``max_bytes``.

    Raises:
        BadRequest: 413 past ``max_bytes`` (a declared ``Content-Length`` is refused before reading); 400 for a
            body that is not UTF-8 JSON (``NaN`` and ``Infinity`` included) or nests past the decoder's depth.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BadRequest(f"the request body ({declared} bytes) is larger than this gateway's limit of {max_bytes} bytes",
                         status=413, code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BadRequest(f"the request body is larger than this gateway's limit of {max_bytes} bytes",
                             status=413, code="request_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise BadRequest("the request body is not UTF-8 text") from None
    except RecursionError:
        raise BadRequest("the request body's JSON is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and an integer past Python's digit limit
        raise BadRequest(f"We could not parse the JSON body of your request. ({e})") from None


def _refuse_constant(name: str) -> Any:
    """``NaN`` / ``Infinity`` are not JSON (Python's decoder accepts them): refused, or they would reach a
    sampling field, a session's metadata or a trajectory that strict JSON cannot carry."""
    raise BadRequest(f"the request body's JSON holds {name}, which is not a JSON value")


def routes(gateway: Any) -> list[tuple[str, Any, list[str]]]:
    """``(path, handler, methods)`` of every route of ``gateway`` (a :class:`~.app.Gateway`)."""
    from starlette.responses import StreamingResponse

    def guarded(fn: Any) -> Any:
        async def handler(request: Any) -> Any:
            try:
                return await fn(request)
            except BadRequest as e:
                return _error(e)
            except Exception as e:  # a bug or a policy fault: an API error, never a traceback page
                log.exception("gateway: %s %s failed", request.method, request.url.path)
                return _error(BadRequest(f"internal error: {type(e).__name__}", status=500, kind="server_error"))
        return handler

    def _session(request: Any, *, admin_ok: bool = False) -> Any:
        return gateway.session_for(request.path_params["sid"], bearer(request), admin_ok=admin_ok)

    def _admin(request: Any) -> None:
        if not gateway.is_admin(bearer(request)):
            raise BadRequest("invalid api key", status=401, code="invalid_api_key")

    async def completions(request: Any, session: Any) -> Any:
        body = await read_json(request, gateway.max_body_bytes)
        completion = await gateway.complete(body, session)
        if not (isinstance(body, dict) and body.get("stream")):
            return _ok(completion)
        opts = body.get("stream_options")
        usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        chunks = gateway.stream_chunks(completion, usage)

        async def events() -> AsyncIterator[bytes]:
            for c in chunks:
                yield b"data: " + dumps(c) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def session_completions(request: Any) -> Any:
        return await completions(request, _session(request))

    async def session_models(request: Any) -> Any:
        _session(request)
        return _ok(gateway.models())

    async def trajectory(request: Any) -> Any:
        return _ok(_session(request, admin_ok=True).trajectory())

    async def open_session(request: Any) -> Any:
        _admin(request)
        body = await read_json(request, gateway.max_body_bytes)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object {\"max_turns\": int, \"metadata\": {...}}")
        max_turns = body.get("max_turns")
        if max_turns is not None:
            with as_bad_request("max_turns"):
                max_turns = check_int("max_turns", max_turns, maximum=100_000)
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("metadata must be an object", param="metadata")
        s = gateway.open_session(max_turns=max_turns, metadata=metadata)
        return _ok({"id": s.id, "api_key": s.api_key, "base_url": f"/sessions/{s.id}/v1"})

    async def close_session(request: Any) -> Any:
        _admin(request)
        sid = request.path_params["sid"]
        if sid not in gateway.sessions:
            raise BadRequest("no such session", status=404, code="session_not_found")
        return _ok(gateway.close_session(sid, forget=True))

    async def admin_completions(request: Any) -> Any:
        _admin(request)
        return await completions(request, None)

    async def admin_models(request: Any) -> Any:
        _admin(request)
        return _ok(gateway.models())

    return [
        ("/sessions", guarded(open_session), ["POST"]),
        ("/sessions/{sid}", guarded(close_session), ["DELETE"]),
        ("/sessions/{sid}/trajectory", guarded(trajectory), ["GET"]),
        ("/sessions/{sid}/v1/chat/completions", guarded(session_completions), ["POST"]),
        ("/sessions/{sid}/v1/models", guarded(session_models), ["GET"]),
        ("/v1/chat/completions", guarded(admin_completions), ["POST"]),
        ("/v1/models", guarded(admin_models), ["GET"]),
    ]
