"""What the backend sync reads and how it waits: its limits and intervals, the events
route's answers as the sync's exceptions, a bounded wait for the stream's next line, the
readiness body, a snapshot block's tiers, and the waits between reads. No state of its
own."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from pydantic import BaseModel, ValidationError

from warmfleet_common import bounded
from warmfleet_common.tiers import OTHER_TIER, TIERS, Tier
from warmfleet_common.wire import SnapshotBlock


@dataclass(frozen=True)
class ReadLimits:
    """The most bytes the router reads of each answer (and the deadline of one)."""

    small: int = 1 << 20  # /readyz, /v1/models, /v1/status
    warm_sets: int = 16 << 20  # 256 prompts' block lists per set, a few sets
    layout: int = 64 << 20  # tokenizer files (a large vocabulary's tokenizer.json: ~10 MB)
    snapshot: int = 64 << 20  # ~350,000 blocks
    event_line: int = 64 << 10  # a stored event is ~250 bytes
    deadline: float = 10.0  # a whole small answer
    large_deadline: float = 60.0  # a whole layout or snapshot


@dataclass(frozen=True)
class SyncOptions:
    health_interval: float = 2.0
    models_interval: float = 10.0
    warm_sets_interval: float = 10.0
    heartbeat: float = 5.0  # asked of the daemon; a stream silent for 3x this is dead
    retry: float = 2.0
    max_retry: float = 60.0  # backoff after repeated trouble doubles up to this
    no_events_retry: float = 60.0  # a backend known to serve no events is asked this often
    # While a backend's live event stream says its state and warm sets (its heartbeats),
    # /readyz, its models and its warm sets are read this often instead: the stream says
    # when it drains, restarts or changes its warm sets, and its end wakes the health check.
    quiet_interval: float = 30.0
    limits: ReadLimits = field(default_factory=ReadLimits)


class NoEvents(Exception):
    """This backend serves no cache events to us (not a warmfleet daemon, no token...)."""


class Unavailable(Exception):
    """A 5xx: loading, draining or failing; asked again after a backoff."""


def raise_for_events_status(path: str, status: int) -> None:
    if status in (404, 405):
        raise NoEvents(f"{path}: {status} (not a warmfleet daemon?)")
    if status in (401, 403):
        raise NoEvents(f"{path}: {status}: the admin token is missing or wrong")
    if status >= 500:
        raise Unavailable(f"{path}: HTTP {status}")
    raise ValueError(f"{path}: unexpected HTTP {status}")


async def within(lines: AsyncIterator[bytes], seconds: float) -> bytes | None:
    """The next line, or None at the end; TooSlow when no whole line came in time (a
    trickle keeps the connection's read timeout from firing)."""
    try:
        with anyio.fail_after(seconds):
            return await anext(lines, None)
    except TimeoutError as exc:
        raise bounded.TooSlow(f"no whole event line within {seconds:g}s") from exc


def status_field(content: bytes) -> str | None:
    try:
        body = Readiness.model_validate_json(content)
    except ValidationError:
        return None
    return body.status


class Readiness(BaseModel):
    status: str | None = None


async def woken(event: asyncio.Event, seconds: float) -> None:
    """Waits `seconds`, or less if `event` is set meanwhile."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


def jitter(delay: float) -> float:
    return delay * random.uniform(0.8, 1.2)


def holders(block: SnapshotBlock) -> set[Tier]:
    """The tiers a snapshot says hold a block (from daemons before `tiers`: its fastest
    tier, and the disk when `on_disk`), as the index keeps them (`indexed_tier`)."""
    if block.tiers:
        return {indexed_tier(t) for t in block.tiers}
    named = {block.tier, "disk"} if block.on_disk else {block.tier}
    return {indexed_tier(t) for t in named}


def indexed_tier(tier: Tier) -> Tier:
    """The tier the index keeps a block of `tier` in: its own for a built-in tier; for a
    tier a daemon's registry added, `OTHER_TIER` (one bit for every such tier, the
    slowest): a tier beyond RAM (not a RAM hit for the faster-tier scorer) whose hit the
    time-saved score counts as saving nothing (the index keeps no name to price it by),
    predicted as `other`, as the router labels such served tokens."""
    return tier if tier in TIERS else OTHER_TIER
