"""The router's errors in the shape of each route's API (the daemons' own: OpenAI's, or
Anthropic's on the Messages API), and the HTTP status of each domain error: the policy
says why no backend can take a request, this says what the client is answered. A
route's API is one of `warmfleet_common.agent_apis.shapes`."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from warmfleet_common.agent_apis.shapes import ApiName
from warmfleet_common.errors import anthropic_error_body, anthropic_type, openai_error_body
from warmfleet_router.policy import ModelNotFound, NoBackendReady, RoutingError
from warmfleet_router.prepare import Invalid
from warmfleet_router.quotas import Throttled

# kind -> (status, code, type, param)
_ROUTING: dict[type[RoutingError], tuple[int, str, str, str | None]] = {
    ModelNotFound: (404, "model_not_found", "not_found_error", "model"),
    NoBackendReady: (503, "no_backend", "service_unavailable", None),
}


def error_body(
    message: str,
    code: str | None,
    type_: str = "service_unavailable",
    param: str | None = None,
    *,
    shape: ApiName = "chat",
    status: int = 500,
) -> dict[str, Any]:
    """The body in the shape of the route's API (Anthropic's types follow the status)."""
    if shape == "anthropic":
        return anthropic_error_body(message, anthropic_type(status))
    return openai_error_body(message, type_, param, code)


def error_response(
    status: int,
    message: str,
    code: str | None,
    type_: str = "service_unavailable",
    param: str | None = None,
    headers: dict[str, str] | None = None,
    *,
    shape: ApiName = "chat",
) -> JSONResponse:
    body = error_body(message, code, type_, param, shape=shape, status=status)
    return JSONResponse(body, status_code=status, headers=headers)


def throttled(refused: Throttled, shape: ApiName) -> JSONResponse:
    """A 429 with Retry-After, in the route's API (Claude Code and Codex retry on it)."""
    return error_response(
        429,
        refused.message,
        "rate_limit_exceeded",
        "rate_limit_error",
        None,
        {"retry-after": str(refused.retry_after)},
        shape=shape,
    )


def stream_error(message: str, code: str, shape: ApiName) -> bytes:
    """The event that ends a stream the backend cut or timed out, in the route's API:
    chat's `data:` line, Anthropic's `error` event, the Responses API's `error` event."""
    if shape == "anthropic":
        body = anthropic_error_body(message, "api_error")
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    if shape == "responses":
        event = {"type": "error", "code": code, "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return b"data: " + json.dumps(error_body(message, code)).encode() + b"\n\n"


def routing_error(exc: RoutingError, shape: ApiName = "chat") -> JSONResponse:
    status, code, type_, param = next(
        v for kind, v in _ROUTING.items() if isinstance(exc, kind)
    )  # fmt: skip
    return error_response(status, str(exc), code, type_, param, shape=shape)


def invalid_request(invalid: Invalid, shape: ApiName = "chat") -> JSONResponse:
    """What a daemon answers a request it refuses (the router refuses it first when it
    cannot even key it, or when it is larger than every backend's context)."""
    return error_response(
        400, invalid.message, invalid.code, "invalid_request_error", invalid.param, shape=shape
    )
