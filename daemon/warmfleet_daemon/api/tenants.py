"""Who a request on an inference route comes from, checked before any route runs.

With `--api-keys-file`, every inference route (chat, completions, Anthropic's Messages
and its token count, Responses, and `/v1/models`) needs a client key in its API's header
(`client_keys`), or the router's signed tenant (`tenancy`: the router checked the key);
`/v1/models` also takes the admin token (the router reads it). The routes that show data
(`/metrics`, `/v1/status`, the API document) need a client key or the admin token; the
admin and peer routes keep their own guards, the probes stay open. A missing or unknown
key is a 401 in the route's API shape. Without a keys file the routes stay open; a tenant
the router names (signed, or unsigned on a daemon without an admin token) still salts
the request's blocks. The tenant reaches the request path through a context variable
(`current_tenant`). Keys are never logged.
"""

from __future__ import annotations

import hmac
import json
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

from warmfleet_common.client_keys import (
    SHOWS_DATA,
    KeysFile,
    check_key,
    is_client_key,
    presented_key,
    reader_refusal,
)
from warmfleet_common.tenancy import TENANT_HEADER, TENANT_SIGNATURE_HEADER, tenant_refusal
from warmfleet_daemon.api.errors import error_json, speaks_anthropic
from warmfleet_daemon.settings import DaemonSettings

INFERENCE_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/models",
    }
)
# Routes the router itself reads with the admin token.
_ADMIN_READABLE = frozenset({"/v1/models"})
# With a keys file these need the admin token or a client key (they show data);
# the admin and peer routes have guards of their own, the probes stay open.
READER_PATHS = SHOWS_DATA | {"/v1/status"}

_TENANT: ContextVar[str | None] = ContextVar("warmfleet_tenant", default=None)
_CLIENT_READER: ContextVar[bool] = ContextVar("warmfleet_client_reader", default=False)


def current_tenant() -> str | None:
    """The tenant of the request being served (None: an open daemon, no tenant named)."""
    return _TENANT.get()


def reads_with_client_key() -> bool:
    """The request presents a client key, not the admin token (status: the public view)."""
    return _CLIENT_READER.get()


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def tenant_of(
    settings: DaemonSettings, keys: KeysFile | None, path: str, headers: dict[str, str]
) -> str | None:
    """The request's tenant (None: none, on an open daemon); Refused when it may not be
    served."""
    named = headers.get(TENANT_HEADER)
    token = settings.admin_token
    if named is not None:
        signature = headers.get(TENANT_SIGNATURE_HEADER)
        if token and signature is not None:
            refused = tenant_refusal(token, named.strip(), signature)
            if refused is not None:
                raise Refused(401, f"{TENANT_HEADER} is not valid: {refused}", "invalid_tenant")
            return named.strip()
        if token or keys is not None:
            raise Refused(
                401,
                f"{TENANT_HEADER} is honoured only from the router ({TENANT_SIGNATURE_HEADER} "
                "signed with this daemon's admin token)",
                "invalid_tenant",
            )
        return named.strip() or None  # an open loopback daemon: anyone may do anything
    if keys is None:
        return None
    checked = check_key(keys.current(), headers, anthropic=speaks_anthropic(path))
    if isinstance(checked, str):
        return checked
    given = presented_key(headers, anthropic=False)
    if path in _ADMIN_READABLE and token and given and hmac.compare_digest(_b(given), _b(token)):
        return None  # the router reads the models with the admin token
    raise Refused(401, checked.message, checked.code)


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class ClientAuth:
    """The middleware: refuses, or serves the request with its tenant set."""

    def __init__(self, app: ASGIApp, settings: DaemonSettings, keys: KeysFile | None) -> None:
        self.app = app
        self.settings = settings
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        reader = self.keys is not None and path in READER_PATHS
        if scope["type"] != "http" or (path not in INFERENCE_PATHS and not reader):
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []
        }
        if reader and self.keys is not None:
            ring = self.keys.current()
            refusal = reader_refusal(ring, headers, self.settings.admin_token)
            if refusal is not None:
                await _refuse(send, path, Refused(401, refusal.message, refusal.code))
                return
            marked = _CLIENT_READER.set(is_client_key(ring, headers))
            try:
                await self.app(scope, receive, send)
            finally:
                _CLIENT_READER.reset(marked)
            return
        try:
            tenant = tenant_of(self.settings, self.keys, path, headers)
        except Refused as refused:
            await _refuse(send, path, refused)
            return
        reset = _TENANT.set(tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            _TENANT.reset(reset)


async def _refuse(send: Send, path: str, refused: Refused) -> None:
    body = error_json(
        path, refused.status, refused.message, "authentication_error", code=refused.code
    )
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": refused.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
