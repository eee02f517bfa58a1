"""`GET /v1/cache/diagnostics`: where recent cache misses diverge from what was cached,
with the decoded text there. An admin route: that text comes from other users'
prompts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from warmfleet_daemon.api.deps import AdminDep, ReadyDep
from warmfleet_daemon.api.errors import ErrorResponse

router = APIRouter(
    prefix="/v1",
    dependencies=[AdminDep],
    responses={401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}},
)


@router.get("/cache/diagnostics")
async def cache_diagnostics(ready: ReadyDep) -> dict[str, Any]:
    """The recent window of requests, its misses, the divergence points of the misses
    (position, what varies, decoded text) and advice."""
    return await run_in_threadpool(ready.diagnostics.report)
