"""What a router needs to know which blocks this daemon holds (admin routes).

`GET /v1/cache/layout`: how requests become block keys here (tokenizer, template
arguments, chunk size, root key). `GET /v1/cache/snapshot`: every stored block and the
sequence number it is current at. `GET /v1/cache/events?epoch=E&after=N`: a stream of
newline-delimited JSON, every block stored or evicted and every clear after N, then live;
a `reset` line (and the end of the stream) when events after N are gone or E is not this
daemon's epoch, which is the subscriber's cue to fetch a new snapshot.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Sequence
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from warmfleet_common.cache_layout import CacheLayout, export_layout
from warmfleet_common.contract import WarmSetList
from warmfleet_common.errors import ErrorResponse
from warmfleet_common.tiers import Tier
from warmfleet_common.wire import (
    CacheSnapshot,
    EventsHeartbeat,
    EventsHello,
    EventsReset,
    SnapshotBlock,
    event_line,
)
from warmfleet_daemon.api.deps import AdminDep, ReadyDep, StateDep
from warmfleet_daemon.cache.events import HeldBlock, Nudge
from warmfleet_daemon.engine.core import Engine

router = APIRouter(
    prefix="/v1/cache",
    dependencies=[AdminDep],
    responses={401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}},
)

NDJSON = "application/x-ndjson"


def layout_of(engine: Engine) -> CacheLayout:
    loaded = engine.loaded
    return _layout(loaded.tokenizer, loaded.name, engine.root, engine.config.block_size)


@lru_cache(maxsize=8)
def _layout(tokenizer: Any, model: str, root: bytes, block_size: int) -> CacheLayout:
    # Exporting the tokenizer takes ~90 ms: once per layout, which the hundred simulated
    # daemons of a process share (keyed by engine, an LRU of a few thrashed among them).
    return export_layout(tokenizer, model=model, root=root, block_size=block_size)


@router.get("/layout", response_model=CacheLayout)
async def layout(
    ready: ReadyDep,
    tokenizer_files: bool = Query(
        True,
        description="false: leave the tokenizer's files out (megabytes; the fingerprint "
        "still names them), for a router that already holds this fingerprint's",
    ),
) -> CacheLayout:
    """How requests become block keys here, and what a token costs in each tier."""
    found = await run_in_threadpool(layout_of, ready.engine)
    update: dict[str, Any] = {"costs": ready.costs}
    if not tokenizer_files:
        update["tokenizer_files"] = {}
    return found.model_copy(update=update)


@router.get("/snapshot", response_model=CacheSnapshot)
async def snapshot(ready: ReadyDep) -> CacheSnapshot:
    """Every stored block (root first) with the event sequence number it is current at."""
    events = ready.events
    slower = ready.engine.tiers[1:]  # the tiers beyond RAM, fastest first

    def current() -> tuple[int, list[tuple[Tier, Sequence[HeldBlock]]]]:
        # The number first: a tier's change after it is also an event after it (replayed).
        return events.seq, [(tier.name, tier.held()) for tier in slower]

    blocks, (seq, held) = await run_in_threadpool(ready.engine.cache.snapshot, current)
    found = await run_in_threadpool(layout_of, ready.engine)
    holders: dict[bytes, list[Tier]] = {}
    beyond_ram: dict[bytes, HeldBlock] = {}
    for name, entries in held:
        for entry in entries:
            holders.setdefault(entry.key, []).append(name)
            beyond_ram.setdefault(entry.key, entry)
    in_ram = {b.key for b in blocks}
    return CacheSnapshot(
        epoch=events.epoch,
        seq=seq,
        fingerprint=found.fingerprint,
        blocks=[
            *(events.block_wire(b, holders.get(b.key, ())) for b in blocks),
            *(
                held_block(entry, holders[entry.key])
                for entry in sorted(beyond_ram.values(), key=lambda e: e.end)  # parents first
                if entry.key not in in_ram
            ),
        ],
    )


def held_block(entry: HeldBlock, tiers: list[Tier]) -> SnapshotBlock:
    """A block only tiers beyond RAM hold (`tiers`, fastest first)."""
    return SnapshotBlock(
        key=entry.key.hex(),
        parent=entry.parent.hex() if entry.parent is not None else None,
        start=entry.start,
        end=entry.end,
        logits=entry.logits,
        tier=tiers[0],
        tiers=tiers,
        on_disk="disk" in tiers,
    )


@router.get("/events")
async def cache_events(
    ready: ReadyDep,
    state: StateDep,
    after: int = Query(0, ge=0, description="last sequence number the subscriber has"),
    epoch: str | None = Query(None, max_length=64, description="the epoch `after` is from"),
    heartbeat: float = Query(5.0, gt=0, le=60, description="seconds between heartbeat lines"),
) -> StreamingResponse:
    log = ready.events
    loop = asyncio.get_running_loop()

    def beat(seq: int) -> bytes:
        # What a router would otherwise poll /readyz and /v1/warm-sets for.
        sets = WarmSetList(sets=ready.warm.list()).model_dump_json().encode()
        return event_line(
            EventsHeartbeat(
                seq=seq,
                state="draining" if state.draining_until is not None else "serving",
                warm_sets=hashlib.sha256(sets).hexdigest()[:16],
            )
        )

    async def lines() -> AsyncIterator[bytes]:
        yield event_line(EventsHello(epoch=log.epoch, seq=log.seq))
        if epoch is not None and epoch != log.epoch:
            yield event_line(EventsReset(reason="epoch"))
            return
        found = log.subscribe(after, loop)
        if found is None:
            yield event_line(EventsReset(reason="gap"))
            return
        backlog, subscription = found
        try:
            last = after
            for old in backlog:
                yield event_line(old.as_wire())
                last = old.seq
            beaten = loop.time()
            if state.draining_until is not None:  # it began before this subscription
                yield beat(last)
            while True:
                if loop.time() - beaten >= heartbeat:  # a busy stream still beats
                    yield beat(last)
                    beaten = loop.time()
                try:
                    event = await asyncio.wait_for(subscription.queue.get(), heartbeat)
                except asyncio.TimeoutError:
                    yield beat(last)
                    beaten = loop.time()
                    continue
                if isinstance(event, Nudge):  # its state changed: say so now
                    yield beat(last)
                    beaten = loop.time()
                    continue
                if event is None and subscription.ended:  # the daemon is stopping
                    return
                if event is None:  # this subscriber fell too far behind
                    yield event_line(EventsReset(reason="overflow"))
                    return
                if event.seq > last:
                    yield event_line(event.as_wire())
                    last = event.seq
        finally:
            log.unsubscribe(subscription)

    return StreamingResponse(lines(), media_type=NDJSON, headers={"cache-control": "no-store"})
