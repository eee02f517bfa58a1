"""The peer a spilled request names (`x-warmfleet-peer`), checked before any route runs:
honoured only with the router's signature (keyed with this daemon's admin token) or for
one of this daemon's own `--warm-from` peers; otherwise 403, so no client can make the
daemon fetch from a URL of its choosing. A peer grant the router attaches
(`x-warmfleet-peer-grant`, presented to the peer instead of this daemon's token) must be
covered by that signature too. The peer and its grant reach the engine request through a
context variable the generation path reads (`current_peer`)."""

from __future__ import annotations

import json
import re
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

from warmfleet_common.grants import GRANT_HEADER, GRANT_PATTERN
from warmfleet_common.spill import (
    PEER_HEADER,
    PEER_SIGNATURE_HEADER,
    peer_url_valid,
    signature_valid,
)
from warmfleet_daemon.api.errors import error_json
from warmfleet_daemon.settings import DaemonSettings

_PEER: ContextVar[tuple[str, str | None] | None] = ContextVar("warmfleet_spill_peer", default=None)


def current_peer() -> tuple[str, str | None] | None:
    """The checked peer of the request being served and its grant (None: none named)."""
    return _PEER.get()


def check_peer(
    settings: DaemonSettings, url: str, signature: str | None, grant: str | None = None
) -> tuple[int, str] | None:
    """None when the daemon may copy from `url` (with `grant`); else the status and why."""
    if not peer_url_valid(url):
        return 400, f"{PEER_HEADER} must be an http(s) base URL"
    if grant is not None and re.fullmatch(GRANT_PATTERN, grant) is None:
        return 400, f"{GRANT_HEADER} must be <expiry>.<64 hex digits>"
    if grant is None and url.rstrip("/") in settings.warm_from:
        return None
    token = settings.admin_token
    if token and signature is not None and signature_valid(token, url, signature, grant):
        return None
    return 403, (
        f"{PEER_HEADER} is honoured only from the router ({PEER_SIGNATURE_HEADER} signed with "
        f"this daemon's admin token, over {GRANT_HEADER} too when there is one) or for this "
        "daemon's --warm-from peers"
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
        grant = headers.get(GRANT_HEADER.encode())
        refused = check_peer(
            self.settings,
            url,
            signature.decode("latin-1") if signature is not None else None,
            grant.decode("latin-1").strip() if grant is not None else None,
        )
        if refused is not None:
            status, message = refused
            body = error_json(
                str(scope.get("path", "")),
                status,
                message,
                "invalid_request_error" if status == 400 else "permission_error",
                param=GRANT_HEADER if message.startswith(GRANT_HEADER) else PEER_HEADER,
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
        token = _PEER.set(
            (url.rstrip("/"), grant.decode("latin-1").strip() if grant is not None else None)
        )
        try:
            await self.app(scope, receive, send)
        finally:
            _PEER.reset(token)
