"""The OpenAPI document says what the daemon really answers: FastAPI documents a 422
`HTTPValidationError` for every route with parameters, but validation errors are 400s
in OpenAI's error shape (`errors.install_error_handlers`). Kept true by the
schemathesis run in the tests."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from warmfleet_common.errors import ErrorResponse

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_FASTAPI_VALIDATION = "#/components/schemas/HTTPValidationError"


# Responses shared by the routes, for their `responses=`.
def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse, "description": _DESCRIPTIONS[code]} for code in codes}


_DESCRIPTIONS = {
    400: "Invalid request (OpenAI's error shape names the parameter)",
    401: "An admin token is configured and none was sent",
    403: "The admin token is not valid",
    404: "No such model or warm set",
    409: "An older generation than the one applied; nothing changed",
    413: "The body, a message, the pinned cache or the saved state would be too large",
    422: "The warm set cannot be applied (too many sets or prompts, a prompt that does not "
    "render or fit the context); nothing changed",
    499: "The client closed the request before it was answered",
    503: "The model is loading or failed to load, or the warm-set state cannot be saved",
}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _validation_errors_are_400s(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _validation_errors_are_400s(document: dict[str, Any]) -> dict[str, Any]:
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            fastapi_422 = responses.get("422", {})
            schema = fastapi_422.get("content", {}).get("application/json", {}).get("schema", {})
            if schema.get("$ref") == _FASTAPI_VALIDATION:
                del responses["422"]
                responses.setdefault(
                    "400",
                    {
                        "description": _DESCRIPTIONS[400],
                        "content": {"application/json": {"schema": _ERROR_REF}},
                    },
                )
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document
