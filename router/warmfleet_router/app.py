"""The router's HTTP front: OpenAI-compatible routes, health, metrics and status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from warmfleet_common import __version__
from warmfleet_router.discovery import Source
from warmfleet_router.errors import error_body, error_response
from warmfleet_router.fleet import Fleet, RouterOptions
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.proxy import forward
from warmfleet_router.routes import ROUTES, ProxiedRoute

log = logging.getLogger(__name__)

DISCOVERY_WAIT = 10.0  # seconds the router waits at start for its first backend list
MAX_REQUEST_BYTES = 8 << 20  # the daemons' default limit: larger bodies would fail there


def create_app(source: Source, options: RouterOptions) -> FastAPI:
    holder: dict[str, Fleet] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
            metrics = RouterMetrics()
            fleet = Fleet(options, client, metrics)
            holder["fleet"] = fleet
            follower = asyncio.create_task(fleet.follow(source), name="discovery")
            # Start with the backends known (an API server down at start: none yet).
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(fleet.discovered.wait()), DISCOVERY_WAIT)
            await fleet.first_checks()
            try:
                yield
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follower
                await fleet.close()
                await source.close()
                metrics.shutdown()

    app = FastAPI(
        title="warmfleet router",
        version=__version__,
        description="OpenAI-compatible gateway that routes each request to the daemon "
        "holding most of its prefix.",
        lifespan=lifespan,
    )

    def fleet() -> Fleet:
        return holder["fleet"]

    async def proxied(request: Request, route: ProxiedRoute) -> Response:
        too_large = error_response(
            413, f"the body exceeds {MAX_REQUEST_BYTES} bytes", "request_too_large",
            "invalid_request_error",
        )  # fmt: skip
        if int(request.headers.get("content-length") or 0) > MAX_REQUEST_BYTES:
            return too_large
        raw = await request.body()
        if len(raw) > MAX_REQUEST_BYTES:
            return too_large
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = None
        return await forward(fleet(), route, raw, body, dict(request.headers))

    def add_proxied(route: ProxiedRoute) -> None:
        async def endpoint(request: Request) -> Response:
            return await proxied(request, route)

        app.add_api_route(route.path, endpoint, methods=["POST"], name=route.name)

    for route in ROUTES:
        add_proxied(route)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        """The union of the ready backends' models."""
        current = fleet()
        seen: dict[str, dict[str, Any]] = {}

        async def one(url: str) -> list[dict[str, Any]]:
            try:
                r = await current.client.get(f"{url}/v1/models", timeout=5.0)
                data = r.json().get("data", []) if r.status_code == 200 else []
                return [m for m in data if isinstance(m, dict) and "id" in m]
            except (httpx.HTTPError, ValueError, AttributeError):
                return []

        for found in await asyncio.gather(*(one(b.url) for b in current.usable())):
            for m in found:
                seen.setdefault(str(m["id"]), m)
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = [b.name for b in fleet().usable()]
        if not ready:
            return JSONResponse(
                {"status": "no ready backend", "backends": len(fleet().backends)}, status_code=503
            )
        return JSONResponse({"status": "ready", "ready_backends": ready})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(fleet().metrics.prometheus_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/router/status")
    async def status() -> dict[str, Any]:
        return fleet().status()

    @app.exception_handler(404)
    async def not_found(_: Request, __: Exception) -> JSONResponse:
        return JSONResponse(error_body("no such route", "not_found", "not_found_error"), 404)

    return app
