"""Health, readiness and the status document operators and dashboards read."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from warmfleet_daemon import __version__
from warmfleet_daemon.api.deps import ReadyDep, StateDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: StateDep, warm: bool = False) -> JSONResponse:
    """Ready once the model is loaded; with `?warm=1`, once every warm prompt is warm."""
    if state.ready is None:
        body = {"status": "failed" if state.load_error else "loading", "error": state.load_error}
        return JSONResponse(body, status_code=503)
    if warm:
        all_warm, detail = state.ready.warm.readiness()
        if not all_warm:
            return JSONResponse({"status": "warming", "detail": detail}, status_code=503)
        return JSONResponse({"status": "ready", "model": state.served_name(), "detail": detail})
    return JSONResponse({"status": "ready", "model": state.served_name()})


@router.get("/v1/status")
async def status(ready: ReadyDep, state: StateDep) -> dict[str, Any]:
    model = ready.model
    cache = ready.engine.cache.stats
    return {
        "version": __version__,
        "model": {
            "id": state.served_name(),
            "source": model.source,
            "context_length": model.context_length,
            "device": "gpu" if model.on_gpu else "cpu",
        },
        "engine": asdict(ready.engine.stats()),
        "cache": {
            **asdict(cache),
            "hit_rate": cache.hit_rate,
            "tokens_saved": cache.tokens_saved,
        },
        "warm_sets": [s.model_dump() for s in ready.warm.list()],
        "kv_transfer": ready.transfer.status() if ready.transfer else None,
        # Where recent misses diverge (no prompt text: that is on /v1/cache/diagnostics).
        "diagnostics": await run_in_threadpool(ready.diagnostics.summary),
    }


@router.get("/metrics")
async def metrics(ready: ReadyDep) -> Response:
    """Prometheus exposition of the daemon's OpenTelemetry metrics."""
    return Response(ready.telemetry.prometheus_text(), media_type=CONTENT_TYPE_LATEST)
