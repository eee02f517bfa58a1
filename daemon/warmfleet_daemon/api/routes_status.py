"""Health, readiness and the status document operators and dashboards read."""

from __future__ import annotations

import datetime
import time
from dataclasses import asdict
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from warmfleet_common import __version__
from warmfleet_common.contract import PromptState
from warmfleet_common.wire import (
    DaemonStatus,
    StatusCache,
    StatusModel,
    StatusSim,
    WarmSetCounts,
)
from warmfleet_daemon.api.deps import IsAdminDep, ReadyDep, StateDep
from warmfleet_daemon.api.openapi import errors
from warmfleet_daemon.sim.engine import SimEngine

router = APIRouter()


class Readiness(BaseModel):
    """`/readyz`: 200 when ready, 503 otherwise (loading, failed, warming, draining)."""

    status: Literal["ready", "loading", "failed", "warming", "draining"]
    model: str | None = None
    detail: str | None = None
    error: str | None = None


_NOT_READY = {
    "model": Readiness,
    "description": "Not ready: loading, failed, warming or draining (stopping after a SIGTERM)",
}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, responses={503: _NOT_READY, **errors(400)})
async def readyz(state: StateDep, warm: bool = False) -> JSONResponse:
    """Ready once the model is loaded; with `?warm=1`, once every warm prompt is warm.
    Draining (a SIGTERM, `--drain-seconds`): 503, though it still serves."""
    if state.draining_until is not None:
        left = max(0.0, state.draining_until - time.time())
        detail = f"stopping in {left:.0f}s; still serving"
        return JSONResponse({"status": "draining", "detail": detail}, status_code=503)
    if state.ready is None:
        body = {"status": "failed" if state.load_error else "loading", "error": state.load_error}
        return JSONResponse(body, status_code=503)
    if warm:
        all_warm, detail = state.ready.warm.readiness()
        if not all_warm:
            return JSONResponse({"status": "warming", "detail": detail}, status_code=503)
        return JSONResponse({"status": "ready", "model": state.served_name(), "detail": detail})
    return JSONResponse({"status": "ready", "model": state.served_name()})


@router.get(
    "/v1/status",
    response_model=DaemonStatus,
    response_model_exclude_unset=True,
    responses=errors(403, 503),
)
async def status(ready: ReadyDep, state: StateDep, admin: IsAdminDep) -> DaemonStatus:
    """Engine, cache, warm sets and a diagnostics summary. Without the admin token (when
    one is configured) warm sets are counts only: their names, uids and content hashes
    are on the admin routes."""
    model = ready.model
    cache = ready.engine.cache.stats
    sets = ready.warm.list()
    detail: dict[str, Any] = {}
    if admin:  # set names and hashes, peer URLs and the model fingerprint: admin only
        detail["warm_sets"] = sets
        detail["kv_transfer"] = ready.transfer.status() if ready.transfer else None
    return DaemonStatus(
        version=__version__,
        instance_id=state.instance_id,
        state="draining" if state.draining_until is not None else "serving",
        started_at=datetime.datetime.fromtimestamp(
            state.started_at, datetime.timezone.utc
        ).isoformat(),
        model=StatusModel(
            id=state.served_name(),
            aliases=sorted(ready.model_ids),
            source=model.source,
            context_length=model.context_length,
            device="gpu" if model.on_gpu else "cpu",
        ),
        engine=asdict(ready.engine.stats()),
        # Conversations' next prefixes, prefilled at idle priority after each response.
        next_turn=asdict(ready.next_turn.stats()) if ready.next_turn else None,
        cache=StatusCache(
            **asdict(cache), hit_rate=cache.hit_rate, tokens_saved=cache.tokens_saved
        ),
        # The disk tier (--cache-dir / --state-dir): null when there is none; "off" with
        # the error when a full or failing disk turned it off.
        disk_tier=_disk_tier(ready, admin),
        tier_costs=ready.costs,
        tiers=[tier.name for tier in ready.engine.tiers],  # the tier registry's, by name
        **detail,
        warm_set_counts=WarmSetCounts(
            sets=len(sets),
            prompts=sum(s.total for s in sets),
            warm=sum(s.warm for s in sets),
            failed=sum(p.state is PromptState.FAILED for s in sets for p in s.prompts),
        ),
        # Where recent misses diverge (no prompt text: that is on /v1/cache/diagnostics).
        diagnostics=ready.diagnostics.summary(),
        # A simulated daemon's charged time and how late it ran (inflating every time).
        sim=StatusSim(**asdict(ready.engine.clock.stats()))
        if isinstance(ready.engine, SimEngine)
        else None,
    )


def _disk_tier(ready: ReadyDep, admin: bool) -> dict[str, Any] | None:
    disk = ready.transfer.disk if ready.transfer else None
    if disk is None:
        return None
    out = asdict(disk.stats())
    if not admin:  # a path on the daemon's machine: admin only
        out.pop("directory")
    return out


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
        **errors(503),
    },
)
async def metrics(ready: ReadyDep) -> Response:
    """Prometheus exposition of the daemon's OpenTelemetry metrics."""
    return Response(ready.telemetry.prometheus_text(), media_type=CONTENT_TYPE_LATEST)
