"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every
route but Anthropic's Messages API, which answers in Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`; and a request body size limit."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warmfleet_common.agent_apis.shapes import SHAPES
from warmfleet_common.errors import (
    anthropic_error_body,
    anthropic_type,
    openai_error_body,
)

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    409: "conflict_error",
    422: "invalid_request_error",
    503: "service_unavailable",
}


ANTHROPIC_PREFIX = SHAPES["anthropic"].path


def speaks_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_json(
    path: str,
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The error body a route at `path` answers with."""
    if speaks_anthropic(path):
        return anthropic_error_body(message, anthropic_type(status))
    return error_body(message, type_, param, code)


class APIError(Exception):
    """Raise from a route to answer with an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error")


error_body = openai_error_body


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        body = error_json(request.url.path, exc.status, exc.message, exc.type, exc.param, exc.code)
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first: dict[str, Any] = dict(errors[0]) if errors else {"msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ())]
        if loc and loc[0] in ("body", "path", "query", "header"):
            loc = loc[1:]
        if first.get("type") == "json_invalid":
            message = f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
            loc = []
        elif first.get("type") == "extra_forbidden":
            message = f"{'.'.join(loc)}: this parameter is not supported by this server"
        else:
            message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"
        param = ".".join(loc) or None
        body = error_json(request.url.path, 400, message.strip(), "invalid_request_error", param)
        return JSONResponse(body, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        return JSONResponse(
            error_json(
                request.url.path, status, str(exc.detail), _TYPES.get(status, "server_error")
            ),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )


class CatchUnexpected:
    """Any other error answers an OpenAI-style 500 and keeps the connection open.
    Starlette's own last-resort handler answers, then re-raises, and the server closes
    the keep-alive connection under the client. Add it as the outermost middleware."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # half a response went out: only closing the connection ends it
                raise
            message = f"internal error: {type(exc).__name__}"
            body = json.dumps(
                error_json(str(scope.get("path", "")), 500, message, "server_error")
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """Answer 413 to bodies over `max_bytes`, declared or streamed, before a route
    reads them."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, str(scope.get("path", "")))
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # An HTTPException, so the route's error handling answers it (413).
                    raise StarletteHTTPException(413, self._message())
            return message

        await self.app(scope, limited, send)

    def _message(self) -> str:
        return f"request body is larger than {self.max_bytes} bytes"

    async def _reject(self, send: Send, path: str) -> None:
        body = json.dumps(
            error_json(
                path, 413, self._message(), "invalid_request_error", code="request_too_large"
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
