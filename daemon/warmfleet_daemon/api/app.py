"""The daemon's FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from warmfleet_common import __version__
from warmfleet_common.client_keys import KeysFile
from warmfleet_daemon.api import (
    openapi,
    routes_anthropic,
    routes_cache_events,
    routes_diagnostics,
    routes_kv,
    routes_openai,
    routes_responses,
    routes_status,
    routes_warm,
)
from warmfleet_daemon.api.errors import BodySizeLimit, CatchUnexpected, install_error_handlers
from warmfleet_daemon.api.spill import SpillPeer
from warmfleet_daemon.api.tenants import ClientAuth
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.runtime.assembly import DaemonState
from warmfleet_daemon.settings import DaemonSettings


def create_app(settings: DaemonSettings, *, engine: Engine | None = None) -> FastAPI:
    """The app; with `engine` it serves that (already loaded) engine, otherwise it loads
    `settings.model` in the background once the server starts."""
    state = DaemonState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            state.attach(engine)
        else:
            state.start_loading()
        yield
        state.shutdown()

    app = FastAPI(
        title="warmfleet daemon",
        version=__version__,
        description="OpenAI-compatible MLX server with a prefix cache kept warm by warmfleet.",
        lifespan=lifespan,
    )
    app.state.daemon = state
    install_error_handlers(app)
    openapi.install(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(SpillPeer, settings=settings)
    # Before anything else reads the request: no key, no work (and no peer check).
    keys = KeysFile(settings.api_keys_file) if settings.api_keys_file else None
    app.add_middleware(ClientAuth, settings=settings, keys=keys)
    app.add_middleware(CatchUnexpected)  # added last: the outermost
    app.include_router(routes_openai.router)
    app.include_router(routes_anthropic.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_status.router)
    app.include_router(routes_warm.router)
    app.include_router(routes_diagnostics.router)
    app.include_router(routes_cache_events.router)
    app.include_router(routes_kv.router)
    return app
