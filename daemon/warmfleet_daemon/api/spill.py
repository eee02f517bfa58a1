"""The peer a spilled request names (`x-warmfleet-peer`), checked before any route runs:
honoured only with the router's signature (keyed with this daemon's admin token) or for
one of this daemon's own `--warm-from` peers; otherwise 403, so no client can make the
daemon fetch from a URL of its choosing. The peer reaches the engine request through a
context variable the generation path reads (`current_peer`)."""

from __future__ import annotations

import json
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

from warmfleet_common.spill import (
    PEER_HEADER,
    PEER_SIGNATURE_HEADER,
    peer_url_valid,
    signature_valid,
)
from warmfleet_daemon.api.errors import error_json
from warmfleet_daemon.settings import DaemonSettings

_PEER: ContextVar[str | None] = ContextVar("warmfleet_spill_peer", default=None)


def current_peer() -> str | None:
    """The checked peer of the request being served (None: none named)."""
    return _PEER.get()


def check_peer(settings: DaemonSettings, url: str, signature: str | None) -> tuple[int, str] | None:
    """None when the daemon may copy from `url`; else the status and why."""
    if not peer_url_valid(url):
        return 400, f"{PEER_HEADER} must be an http(s) base URL"
    if url.rstrip("/") in settings.warm_from:
        return None
    token = settings.admin_token
    if token and signature is not None and signature_valid(token, url, signature):
        return None
    return 403, (
        f"{PEER_HEADER} is honoured only from the router ({PEER_SIGNATURE_HEADER} signed with "
        "the fleet's admin token) or for this daemon's --warm-from peers"
    )


class SpillPeer:
    def __init__(self, app: ASGIApp, settings: DaemonSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        raw = headers.get(PEER_HEADER.encode())
        if raw is None:
            await self.app(scope, receive, send)
            return
        url = raw.decode("latin-1").strip()
        signature = headers.get(PEER_SIGNATURE_HEADER.encode())
        refused = check_peer(
            self.settings, url, signature.decode("latin-1") if signature is not None else None
        )
        if refused is not None:
            status, message = refused
            body = error_json(
                str(scope.get("path", "")),
                status,
                message,
                "invalid_request_error" if status == 400 else "permission_error",
                param=PEER_HEADER,
                code="invalid_peer" if status == 400 else "peer_not_allowed",
            )
            data = json.dumps(body).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(data)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        token = _PEER.set(url.rstrip("/"))
        try:
            await self.app(scope, receive, send)
        finally:
            _PEER.reset(token)
