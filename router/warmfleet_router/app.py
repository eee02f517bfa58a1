"""The router's HTTP front: OpenAI-compatible routes, health, metrics and status."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from httpx_aiohttp import AiohttpTransport
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from warmfleet_common import __version__, bounded
from warmfleet_common.agent_apis.shapes import ApiName
from warmfleet_common.client_keys import (
    SHOWS_DATA,
    TENANT_PATTERN,
    KeysFile,
    check_key,
    is_client_key,
    reader_refusal,
)
from warmfleet_common.errors import AnthropicErrorResponse, ErrorResponse
from warmfleet_common.heap import freeze_heap
from warmfleet_common.tls import peer_verified
from warmfleet_router.backend import Backend
from warmfleet_router.discovery import Source
from warmfleet_router.errors import error_body, error_response, throttled
from warmfleet_router.fleet import Fleet
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.options import RouterOptions
from warmfleet_router.proxy import forward
from warmfleet_router.quotas import OPEN
from warmfleet_router.routes import BODIES, ROUTES, ProxiedRoute
from warmfleet_router.status import status_detail, status_summary

log = logging.getLogger(__name__)

DISCOVERY_WAIT = 10.0  # seconds the router waits at start for its first backend list
MAX_REQUEST_BYTES = 8 << 20  # the daemons' default limit: larger bodies would fail there
MODELS_BYTES = 1 << 20  # of one backend's /v1/models


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


def _proxied_answers(route: ProxiedRoute) -> dict[int, dict[str, Any]]:
    shape = AnthropicErrorResponse if route.api == "anthropic" else ErrorResponse
    error = {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape.__name__}"}}}
    answers: dict[int, dict[str, Any]] = {
        200: {
            "description": "The backend's answer: JSON, or a text/event-stream when `stream`",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    }
    # The backends' own (400 invalid, 404 unknown model, 413, 499 client gone, 503 not
    # ready) and the router's (401 no client key, 429 over a quota, 502 every backend
    # failed, 504 request timeout).
    for code in (400, 401, 404, 413, 429, 499, 502, 503, 504):
        answers[code] = {"description": "An error, in the API's shape", "content": error}
    return answers


def _component_schemas(models: Sequence[type[BaseModel]]) -> dict[str, Any]:
    """The models' JSON schemas as components, their nested definitions among them
    (pydantic names apart the models of one name from different modules)."""
    keys, found = models_json_schema(
        [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
    )
    schemas: dict[str, Any] = dict(found.get("$defs", {}))
    for (model, _), ref in keys.items():  # each model also under its own name
        schemas[model.__name__] = schemas[ref["$ref"].rsplit("/", 1)[-1]]
    return schemas


# With a keys file these need a client key or the admin token (metrics name tenants and
# their usage); only the probes stay open.
READER_PATHS = SHOWS_DATA | {"/v1/router/status"}


class RouterApp(FastAPI):
    """FastAPI, except that the proxied routes' POSTs go straight to their handler: the
    middleware stack and route matching around a body the router does not parse cost
    a fifth of its CPU per request. Everything else (documents, errors) is FastAPI's."""

    proxied: dict[str, tuple[Callable[[Request], Awaitable[Response]], ApiName]]
    # With client keys: the refusal of a request to a route that shows data (else None).
    reader_guard: Callable[[Request], Response | None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.proxied.get(scope["path"]) if scope["type"] == "http" else None
        if found is None or scope["method"] != "POST":
            guard = self.reader_guard
            if guard is not None and scope["type"] == "http" and scope["path"] in READER_PATHS:
                refused = guard(Request(scope, receive))
                if refused is not None:
                    return await refused(scope, receive, send)
            return await super().__call__(scope, receive, send)
        handler, shape = found
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            response = await handler(Request(scope, receive))
            await response(scope, receive, sending)
        except Exception:
            log.exception("unexpected error on %s", scope["path"])
            if started:
                raise  # the response has begun: only closing the connection says so
            answer = error_response(
                500, "internal error in the router", "internal_error", "api_error", shape=shape
            )
            await answer(scope, receive, send)


def create_app(
    source: Source, options: RouterOptions, tls_client: ssl.SSLContext | None = None
) -> FastAPI:
    """The router's app; `tls_client` verifies the daemons it calls (and presents the
    router's certificate to those that ask), else the system's CAs."""
    holder: dict[str, Fleet] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(
            max_connections=1000,
            max_keepalive_connections=100,
            keepalive_expiry=bounded.CLIENT_KEEP_ALIVE_S,
        )
        # httpx's API over aiohttp's connection pool and C parser: httpcore's pool looked
        # at every connection on every request (bench/router_overhead.py, PERFORMANCE.md).
        transport = AiohttpTransport(
            limits=limits, verify=tls_client if tls_client is not None else True
        )
        async with httpx.AsyncClient(transport=transport, timeout=30.0) as client:
            metrics = RouterMetrics()
            fleet = Fleet(options, client, metrics)
            holder["fleet"] = fleet
            await fleet.pool.start()
            follower = asyncio.create_task(fleet.members.follow(source), name="discovery")
            try:
                # Start with the backends known (an API server down at start: none yet).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        asyncio.shield(fleet.members.discovered.wait()), DISCOVERY_WAIT
                    )
                await fleet.members.first_checks()
                if options.freeze_gc_heap:
                    freeze_heap()
                yield
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follower
                await fleet.close()
                await source.close()
                metrics.shutdown()

    app = RouterApp(
        title="warmfleet router",
        version=__version__,
        description="OpenAI-compatible gateway that routes each request to the daemon "
        "holding most of its prefix.",
        lifespan=lifespan,
    )
    app.proxied = {}
    keys = KeysFile(options.api_keys_file) if options.api_keys_file else None

    def fleet() -> Fleet:
        return holder["fleet"]

    def reader_guard(request: Request) -> Response | None:
        assert keys is not None
        refusal = reader_refusal(keys.current(), request.headers, options.admin_token)
        if refusal is None:
            return None
        challenge = {"www-authenticate": "Bearer"}
        return error_response(
            401, refusal.message, refusal.code, "authentication_error", None, challenge
        )

    if keys is not None:
        app.reader_guard = reader_guard

    def refusal(request: Request, shape: ApiName) -> tuple[str | None, Response | None]:
        """The request's tenant (None: an open router), or its 401 in `shape`."""
        if keys is None:
            return None, None
        checked = check_key(keys.current(), request.headers, anthropic=shape == "anthropic")
        if isinstance(checked, str):
            return checked, None
        challenge = {"www-authenticate": "Bearer"}
        return None, error_response(
            401, checked.message, checked.code, "authentication_error", None, challenge, shape=shape
        )

    async def proxied(request: Request, route: ProxiedRoute) -> Response:
        tenant, refused = refusal(request, route.api)
        if refused is not None:  # before the body is read: no key, no work
            return refused
        over = fleet().quotas.check(tenant or OPEN)
        if over is not None:  # and a tenant over its quota costs little more
            fleet().metrics.throttled(over.tenant, over.limit)
            return throttled(over, route.api)
        too_large = error_response(
            413, f"the body exceeds {MAX_REQUEST_BYTES} bytes", "request_too_large",
            "invalid_request_error", shape=route.api,
        )  # fmt: skip
        declared = request.headers.get("content-length") or ""
        if declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
            return too_large
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > MAX_REQUEST_BYTES:
                return too_large
            parts.append(part)
        raw = b"".join(parts)
        parts.clear()  # one copy of a large body, not two
        # The client may leave before the response begins (during a long prefill): then
        # the backend request is cancelled (its connection closed) and leaves in-flight.
        work = asyncio.ensure_future(forward(fleet(), route, raw, dict(request.headers), tenant))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(work, gone, return_exceptions=True)
        if work.cancelled():
            return error_response(
                499, "the client closed the request", "client_closed", shape=route.api
            )
        return work.result()

    def add_proxied(route: ProxiedRoute) -> None:
        async def endpoint(request: Request) -> Response:
            return await proxied(request, route)

        # Served by RouterApp itself; a plain Starlette route too (other methods get the
        # usual 405), and the document is written below.
        app.proxied[route.path] = (endpoint, route.api)
        app.router.routes.append(Route(route.path, endpoint, methods=["POST"], name=route.name))
        body = {"$ref": f"#/components/schemas/{BODIES[route.name].__name__}"}
        proxied_paths[route.path] = {
            "post": {
                "summary": f"Proxied to the chosen backend's {route.path}",
                "operationId": route.name,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                },
                "responses": {
                    str(code): answer for code, answer in _proxied_answers(route).items()
                },
            }
        }

    proxied_paths: dict[str, Any] = {}
    for route in ROUTES:
        add_proxied(route)

    @app.get("/v1/models", responses=_errors(401))
    async def models(request: Request) -> Response:
        """The union of the ready backends' models."""
        _, refused = refusal(request, "chat")
        if refused is not None:
            return refused
        current = fleet()
        seen: dict[str, dict[str, Any]] = {}

        async def one(backend: Backend) -> list[dict[str, Any]]:
            url = backend.url
            try:
                answer = await bounded.get(
                    current.client,
                    f"{url}/v1/models",
                    limit=MODELS_BYTES,
                    deadline=5.0,
                    headers=backend.admin_headers(),
                )
                body = json.loads(answer.content) if answer.status == 200 else {}
                data = body.get("data") if isinstance(body, dict) else None
            except (httpx.HTTPError, ValueError, bounded.TooSlow, RecursionError):
                return []
            return [m for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]

        for found in await asyncio.gather(*(one(b) for b in current.members.usable())):
            for m in found:
                seen.setdefault(m["id"], m)
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "No backend is ready"}})
    async def readyz() -> JSONResponse:
        ready = [b.name for b in fleet().members.usable()]
        if not ready:
            return JSONResponse(
                {"status": "no ready backend", "backends": len(fleet().members.backends)},
                status_code=503,
            )
        return JSONResponse({"status": "ready", "ready_backends": ready})

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        return Response(fleet().metrics.prometheus_text(), media_type=CONTENT_TYPE_LATEST)

    def admin_refusal(request: Request) -> Response | None:
        """Why the request may not read the admin's detail (None: it may): the client
        certificate under --tls-client-ca, and the admin token when one is configured."""
        if options.tls.client_ca and not peer_verified(request.scope):
            return error_response(
                403, "the detail needs a client certificate signed by the router's "
                "--tls-client-ca", "client_certificate_required", "permission_error",
            )  # fmt: skip
        token = options.admin_token
        if token:
            scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or not given:
                return error_response(
                    401, "the detail needs the admin token: Authorization: Bearer <token>",
                    "missing_token", "authentication_error",
                )  # fmt: skip
            if not hmac.compare_digest(given.strip().encode(), token.encode()):
                return error_response(
                    403, "the admin token is not valid", "invalid_token", "permission_error"
                )
        return None

    @app.get("/v1/router/status", responses=_errors(401, 403))
    async def status(request: Request) -> Response:
        """Counts only, unless the admin token (when one is configured) is sent: then
        backends (URLs, health, errors, warm sets), the index and recent decisions
        (session keys as hashes, never as sent)."""
        token = options.admin_token
        header = request.headers.get("authorization")
        reader = keys is not None and is_client_key(keys.current(), request.headers)
        if (token and header is None) or reader:  # a client key reads the counts
            return JSONResponse(status_summary(fleet()))
        return admin_refusal(request) or JSONResponse(status_detail(fleet()))

    @app.get("/v1/router/learned", responses=_errors(400, 401, 403))
    async def learned(request: Request) -> Response:
        """The warm prompts learned from the static heads many sessions share (text
        included): the admin token's only, so a router without one never shows them.
        `?tenant=NAME` lists one tenant's (`-`: the fleet-wide ones of an open router)."""
        if not options.admin_token:
            return error_response(
                403, "learned warm prompts are shown only with the admin token, and this "
                "router has none (--admin-token-file)", "no_admin_token", "permission_error",
            )  # fmt: skip
        refused = admin_refusal(request)
        if refused is not None:
            return refused
        tenant = request.query_params.get("tenant")
        if tenant is not None and tenant != OPEN and not re.fullmatch(TENANT_PATTERN, tenant):
            return error_response(400, f"not a tenant name: {tenant[:64]!r}", "invalid_tenant")
        table = fleet().learned
        data = table.listing(None if tenant == OPEN else tenant, every=tenant is None)
        backends = list(fleet().members.backends.values())
        for item in data:  # its tokens where a warm set holds it (None: nowhere yet)
            item["tokens"] = max((b.warm_tokens.get(item["name"], 0) for b in backends),
                                 default=0) or None  # fmt: skip
        return JSONResponse(
            {
                "object": "list",
                "min_sessions": table.options.min_sessions,
                "ttl_seconds": table.options.ttl,
                "data": data,
            }
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = "no such route" if exc.status_code == 404 else str(exc.detail)
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(error_body(message, code, kind), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("invalid request", None, "invalid_request_error"), 400)

    def openapi() -> dict[str, Any]:
        """FastAPI's document with the proxied routes' body schemas."""
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes,
            )  # fmt: skip
            document["paths"] = {**proxied_paths, **document["paths"]}
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(
                _component_schemas([ErrorResponse, AnthropicErrorResponse, *BODIES.values()])
            )
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body is read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
