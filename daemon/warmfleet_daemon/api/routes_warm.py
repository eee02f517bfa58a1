"""The operator's push API (warm sets) and the prefix cache's admin route."""

from __future__ import annotations

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from warmfleet_common.contract import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    CacheClearResult,
    WarmSetList,
    WarmSetSpec,
    WarmSetStatus,
)
from warmfleet_daemon.api.deps import AdminDep, ReadyDep
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.openapi import errors
from warmfleet_daemon.warming.sets import (
    StateNotSaved,
    WarmSetError,
    WarmSetInvalid,
    WarmSetStale,
    WarmSetTooLarge,
)

router = APIRouter(prefix="/v1", dependencies=[AdminDep], responses=errors(401, 403, 503))

Namespace = Path(pattern=DNS_LABEL, max_length=63)
Name = Path(pattern=DNS_SUBDOMAIN, max_length=253)


@router.put(
    "/warm-sets/{namespace}/{name}",
    status_code=202,
    response_model=WarmSetStatus,
    responses=errors(400, 409, 413, 422),
)
async def put_warm_set(
    spec: WarmSetSpec, ready: ReadyDep, namespace: str = Namespace, name: str = Name
) -> WarmSetStatus:
    """Create or update a warm set. Idempotent: the same content re-warms nothing."""
    try:  # rendering and tokenizing every prompt: off the event loop
        return await run_in_threadpool(ready.warm.apply, namespace, name, spec)
    except WarmSetError as exc:
        raise _api_error(exc) from exc


@router.get("/warm-sets", response_model=WarmSetList)
async def list_warm_sets(ready: ReadyDep) -> WarmSetList:
    return WarmSetList(sets=ready.warm.list())


@router.get(
    "/warm-sets/{namespace}/{name}", response_model=WarmSetStatus, responses=errors(400, 404)
)
async def get_warm_set(
    ready: ReadyDep, namespace: str = Namespace, name: str = Name
) -> WarmSetStatus:
    found = ready.warm.get(namespace, name)
    if found is None:
        raise APIError(404, f"warm set {namespace}/{name} not found", code="not_found")
    return found


@router.delete("/warm-sets/{namespace}/{name}", responses=errors(400, 404))
async def delete_warm_set(
    ready: ReadyDep, namespace: str = Namespace, name: str = Name
) -> JSONResponse:
    """Unpin the set's prompts and drop their cache blocks."""
    try:
        deleted = ready.warm.delete(namespace, name)
    except WarmSetError as exc:  # the state could not be saved: nothing was deleted
        raise _api_error(exc) from exc
    if not deleted:
        raise APIError(404, f"warm set {namespace}/{name} not found", code="not_found")
    return JSONResponse({"status": "deleted", "namespace": namespace, "name": name})


@router.delete("/cache/prefix", response_model=CacheClearResult)
async def clear_prefix_cache(ready: ReadyDep) -> CacheClearResult:
    """Clear the prefix cache for real (pinned blocks too); warm sets re-warm in the
    background."""
    return ready.warm.clear_cache()


_STATUS: dict[type[WarmSetError], int] = {
    WarmSetInvalid: 422,
    WarmSetTooLarge: 413,
    WarmSetStale: 409,
    StateNotSaved: 503,
}


def _api_error(exc: WarmSetError) -> APIError:
    status = next(code for kind, code in _STATUS.items() if isinstance(exc, kind))
    return APIError(status, exc.message, param=exc.param)
