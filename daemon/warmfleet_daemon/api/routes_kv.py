"""Warm blocks for peers: the KV fingerprint and a stream of stored blocks (admin token
or a peer grant), and the drain handoff's pull (admin)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from warmfleet_common.chunking import Chunk
from warmfleet_common.errors import ErrorResponse
from warmfleet_common.spill import peer_url_valid
from warmfleet_common.wire import CachePull, CachePullResult
from warmfleet_daemon.api.deps import AdminDep, PeerReaderDep, ReadyDep
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.cache.prefix_cache import PrefixCache
from warmfleet_daemon.kvtransfer.codec import BlockCodec
from warmfleet_daemon.kvtransfer.peers import MAX_KEYS
from warmfleet_daemon.kvtransfer.transfer import KVTransfer
from warmfleet_daemon.kvtransfer.wire import MEDIA_TYPE, frame

router = APIRouter(
    prefix="/v1/cache",
    responses={
        400: {"model": ErrorResponse},
        401: {"model": ErrorResponse},
        403: {"model": ErrorResponse},
        409: {"model": ErrorResponse},
    },
)


def _transfer(ready: Any) -> KVTransfer:
    if ready.transfer is None:
        raise APIError(503, "KV transfer is not set up on this daemon", code="unavailable")
    transfer: KVTransfer = ready.transfer
    return transfer


@router.get("/fingerprint", dependencies=[PeerReaderDep])
async def fingerprint(ready: ReadyDep) -> dict[str, Any]:
    """What a peer needs to copy blocks: the fingerprint, the key root, the block size."""
    return _transfer(ready).status()


@router.get("/blocks", response_class=StreamingResponse, dependencies=[PeerReaderDep])
async def blocks(
    ready: ReadyDep,
    keys: str = Query(description="comma-separated block keys (hex), a chain root first"),
    fingerprint: str | None = Query(None, description="the caller's; 409 if it differs"),
) -> StreamingResponse:
    """Stream the stored blocks of `keys`, in order, up to the first one not stored: one
    frame each (8-byte big-endian length, then the block as safetensors)."""
    transfer = _transfer(ready)
    if fingerprint is not None and fingerprint != transfer.fingerprint:
        raise APIError(
            409,
            f"fingerprint {fingerprint} is not this daemon's {transfer.fingerprint}",
            param="fingerprint",
            code="fingerprint_mismatch",
        )
    try:
        wanted = [bytes.fromhex(k) for k in keys.split(",") if k]
    except ValueError as exc:
        raise APIError(400, f"keys must be hex block keys: {exc}", param="keys") from exc
    if not wanted or len(wanted) > MAX_KEYS or any(len(k) != 16 for k in wanted):
        raise APIError(400, f"1 to {MAX_KEYS} keys of 32 hex digits each", param="keys")
    stream = _frames(ready.engine.cache, transfer.codec, wanted)
    return StreamingResponse(stream, media_type=MEDIA_TYPE)


@router.post("/pull", response_model=CachePullResult, dependencies=[AdminDep])
async def pull(ready: ReadyDep, body: CachePull) -> CachePullResult:
    """Copy a chain of blocks (a session's) from a peer daemon with this daemon's
    fingerprint and key root, from the first one not held here, within the body's
    deadline: a drain handoff, asked by the router. What the peer lacks, or sends late
    or broken, is not copied (the session prefills it when it comes)."""
    transfer = _transfer(ready)
    if not peer_url_valid(body.peer):
        raise APIError(400, "peer must be an http(s) base URL", param="peer")
    chunks = [Chunk(b.start, b.end, bytes.fromhex(b.key)) for b in body.blocks]
    expected = 0
    for i, chunk in enumerate(chunks):
        if chunk.start != expected or chunk.end <= chunk.start:
            raise APIError(
                400,
                f"blocks[{i}] spans [{chunk.start}, {chunk.end}): a chain starts at 0 and each "
                "block starts where the one before ends",
                param="blocks",
            )
        expected = chunk.end
    peer = body.peer.rstrip("/")
    return await run_in_threadpool(transfer.pull, peer, chunks, body.deadline_s, body.peer_grant)


def _frames(cache: PrefixCache[Any], codec: BlockCodec, keys: list[bytes]) -> Iterator[bytes]:
    # A sync generator: Starlette runs each step in its thread pool, one block at a time.
    for key in keys:
        found = cache.peek(key)
        if found is None:
            return
        payload, start, end = found
        yield frame(codec.to_bytes(payload, Chunk(start, end, key)))
