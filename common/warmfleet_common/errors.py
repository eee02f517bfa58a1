"""Error bodies as clients read them, from a daemon or the router alike: OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}` (chat, completions, Responses, every
other route), and Anthropic's, `{"type": "error", "error": {"type", "message"}}` (the
Messages API). Plain pydantic and dicts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error body (the Messages API)."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


# Anthropic's error types by HTTP status; a loading (or, later, busy) engine is its
# `overloaded_error`, kept as a 503 (the SDKs and Claude Code retry both).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


def openai_error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": utf8(message),
            "type": type_,
            "param": None if param is None else utf8(param),
            "code": code,
        }
    }


def anthropic_error_body(message: str, type_: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": utf8(message)}}


def anthropic_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status, "api_error")


def utf8(text: str) -> str:
    """`text` with lone surrogates escaped: messages may quote client input, and one
    would make the body unencodable (and the error a 500)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
