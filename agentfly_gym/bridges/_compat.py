"""Workarounds for openenv-core (0.3.x), version-guarded.

:class:`QuietClientDisconnect`: OpenEnv's WebSocket endpoint closes the socket in a ``finally`` and catches only
``RuntimeError`` there; when the client has already gone (every normal client disconnect), Starlette raises
``WebSocketDisconnect`` from that ``close()``, which escapes the app and uvicorn prints a 61-line "Exception in
ASGI application" traceback.  This ASGI middleware drops exactly that exception for WebSocket connections:
the session has been torn down by then (the endpoint destroys it before closing).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

#: openenv-core versions whose endpoint lets the disconnect escape (checked: 0.3.x).
_OPENENV_CHECKED = ("0.3.",)


def needs_quiet_disconnect() -> bool:
    """True for the openenv-core versions checked to need :class:`QuietClientDisconnect`."""
    try:
        return importlib.metadata.version("openenv-core").startswith(_OPENENV_CHECKED)
    except importlib.metadata.PackageNotFoundError:
        return False


class QuietClientDisconnect:
    """ASGI middleware: a WebSocket app that raises ``WebSocketDisconnect`` (the client left) ends quietly."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass  # an expected end of a session: the client closed its connection
