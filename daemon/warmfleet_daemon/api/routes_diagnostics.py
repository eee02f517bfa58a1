"""`GET /v1/cache/diagnostics`: where recent cache misses diverge from what was cached,
with the decoded text there. An admin route: that text comes from other users'
prompts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from warmfleet_daemon.api.deps import AdminDep, ReadyDep
from warmfleet_daemon.api.openapi import errors

router = APIRouter(
    prefix="/v1",
    dependencies=[AdminDep],
    responses=errors(401, 403, 503),
)


@router.get("/cache/diagnostics")
async def cache_diagnostics(ready: ReadyDep) -> dict[str, Any]:
    """The recent window of requests, its misses, the divergence points of the misses
    (position, what varies, decoded text) and advice. Computed by the diagnostics
    thread; this waits for it on the event loop, at most 10 s (then the latest)."""
    return await ready.diagnostics.fresh_report()
