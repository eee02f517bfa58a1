"""The router's errors in OpenAI's shape (the daemons' own), and the HTTP status of each
domain error: the policy says why no backend can take a request, this says what the
client is answered."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from warmfleet_router.policy import ModelNotFound, NoBackendReady, RoutingError
from warmfleet_router.prepare import Invalid

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
) -> dict[str, Any]:
    text = message.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates
    return {"error": {"message": text, "type": type_, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    code: str | None,
    type_: str = "service_unavailable",
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(message, code, type_, param), status_code=status, headers=headers
    )


def routing_error(exc: RoutingError) -> JSONResponse:
    status, code, type_, param = next(
        v for kind, v in _ROUTING.items() if isinstance(exc, kind)
    )  # fmt: skip
    return error_response(status, str(exc), code, type_, param)


def invalid_request(invalid: Invalid) -> JSONResponse:
    """What a daemon answers a request it refuses (the router refuses it first when it
    cannot even key it, or when it is larger than every backend's context)."""
    return error_response(
        400, invalid.message, invalid.code, "invalid_request_error", invalid.param
    )
