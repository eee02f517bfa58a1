"""The prefix cache's change log: what the router's precise index follows.

Every stored, evicted (or dropped) block and every clear gets the next sequence number,
assigned under the cache's lock so numbers follow the cache's own order. A bounded
buffer replays recent events to a reconnecting subscriber; one that asks for events the
buffer no longer has, or for another epoch (a restarted daemon numbers from 1 again),
is told to resync from a snapshot instead. Plain Python (no mlx): the payload only says
whether a block carries its final logits, through `has_logits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from warmfleet_common.chunking import BlockKey
from warmfleet_common.tiers import FASTEST, Tier
from warmfleet_common.wire import (
    BlockEvicted,
    BlockStored,
    CacheChange,
    CacheCleared,
    SnapshotBlock,
)
from warmfleet_daemon.cache.prefix_cache import BlockView

P = TypeVar("P")

EventType = Literal["stored", "evicted", "cleared"]
DEFAULT_BUFFER = 65_536
# A subscriber this far behind is cut off (and resyncs) rather than buffering forever.
MAX_SUBSCRIBER_BACKLOG = 65_536


class HeldBlock(Protocol):
    """A block a tier holds, as the router's snapshot and event feed describe it."""

    @property
    def key(self) -> BlockKey: ...
    @property
    def parent(self) -> BlockKey | None: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def logits(self) -> bool: ...


# Told of each block a tier gains ("stored") or loses ("evicted"), from the tier's own
# threads; must not block (the cache event log, which the router follows).
TierListener = Callable[[Literal["stored", "evicted"], HeldBlock], None]


@dataclass(frozen=True)
class CacheEvent:
    seq: int
    type: EventType
    key: str | None = None  # hex block key
    parent: str | None = None
    start: int | None = None
    end: int | None = None
    logits: bool | None = None  # the block holds its chunk's last-position logits
    tier: Tier = "ram"  # the tier it entered or left
    source: str | None = None  # stored: where its KV came from (`BlockSource`)

    def as_wire(self) -> CacheChange:
        """The line `GET /v1/cache/events` sends for it."""
        if self.type == "cleared":
            return CacheCleared(seq=self.seq)
        fields = {
            "seq": self.seq,
            "key": self.key or "",
            "parent": self.parent,
            "start": self.start,
            "end": self.end,
            "logits": bool(self.logits),
            "tier": self.tier,
        }
        if self.type == "stored":
            return BlockStored(**fields, source=self.source)
        return BlockEvicted(**fields)


class Nudge:
    """Not an event: the subscriber's stream should send a heartbeat now (the daemon's
    state changed: it started draining)."""


NUDGE = Nudge()


class Subscription:
    """One subscriber's queue of events, fed from any thread into its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue[CacheEvent | Nudge | None] = asyncio.Queue()
        self.overflowed = False
        self.ended = False  # the daemon is stopping: the stream ends, its subscriber resyncs

    def end(self) -> None:
        self.ended = True
        with contextlib.suppress(RuntimeError):  # the subscriber's loop has closed
            self._loop.call_soon_threadsafe(self.queue.put_nowait, None)

    def nudge(self) -> None:
        with contextlib.suppress(RuntimeError):  # the subscriber's loop has closed
            self._loop.call_soon_threadsafe(self.queue.put_nowait, NUDGE)

    def push(self, event: CacheEvent) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() > MAX_SUBSCRIBER_BACKLOG:
            self.overflowed = True
            event_or_end: CacheEvent | None = None
        else:
            event_or_end = event
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, event_or_end)
        except RuntimeError:  # the subscriber's loop has closed
            self.overflowed = True


class CacheEventLog(Generic[P]):
    """Sequence-numbered cache events with a replay buffer and live subscribers."""

    def __init__(self, has_logits: Callable[[P], bool], buffer: int = DEFAULT_BUFFER) -> None:
        self.epoch = uuid.uuid4().hex
        self._has_logits = has_logits
        self._seq = 0
        self._buffer: deque[CacheEvent] = deque(maxlen=buffer)
        self._subscribers: set[Subscription] = set()
        self._lock = threading.Lock()

    @property
    def seq(self) -> int:
        with self._lock:
            return self._seq

    def record(self, kind: EventType, block: BlockView[P] | None) -> None:
        """A `PrefixCache` listener (called under the cache's lock): the RAM tier."""
        if block is None:
            self.record_block(kind)
        else:
            self.record_block(
                kind,
                block.key,
                block.parent,
                block.start,
                block.end,
                self._has_logits(block.payload),
                source=block.source if kind == "stored" else None,
            )

    def record_block(
        self,
        kind: EventType,
        key: bytes | None = None,
        parent: bytes | None = None,
        start: int | None = None,
        end: int | None = None,
        logits: bool | None = None,
        tier: Tier = "ram",
        source: str | None = None,
    ) -> None:
        """One event (`tier`: where the block entered or left; the tiers beyond RAM tell
        theirs through `tier_listener`)."""
        with self._lock:
            self._seq += 1
            if key is None:
                event = CacheEvent(self._seq, kind)
            else:
                event = CacheEvent(
                    self._seq,
                    kind,
                    key.hex(),
                    parent.hex() if parent is not None else None,
                    start,
                    end,
                    logits,
                    tier,
                    source,
                )
            self._buffer.append(event)
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            subscriber.push(event)

    def subscribe(
        self, after: int, loop: asyncio.AbstractEventLoop
    ) -> tuple[list[CacheEvent], Subscription] | None:
        """Events after `after` still buffered, and a subscription for the ones to come;
        None when some of them are gone (or `after` is from the future): resync."""
        with self._lock:
            if after > self._seq:
                return None
            oldest = self._buffer[0].seq if self._buffer else self._seq + 1
            if after + 1 < oldest:
                return None
            backlog = [e for e in self._buffer if e.seq > after]
            subscription = Subscription(loop)
            self._subscribers.add(subscription)
            return backlog, subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(subscription)

    def end_streams(self) -> None:
        """End every subscriber's stream (the daemon is stopping: a stream that waits for
        events would hold its connection, and the server's stop, until cut)."""
        with self._lock:
            subscribers = list(self._subscribers)
        for subscription in subscribers:
            subscription.end()

    def nudge_streams(self) -> None:
        """Every subscriber's stream sends a heartbeat now (from any thread)."""
        with self._lock:
            subscribers = list(self._subscribers)
        for subscription in subscribers:
            subscription.nudge()

    def tier_listener(self, tier: Tier) -> TierListener:
        """What a tier beyond RAM tells of its blocks, as events in `tier`."""

        def record(kind: Literal["stored", "evicted"], block: HeldBlock) -> None:
            self.record_block(
                kind, block.key, block.parent, block.start, block.end, block.logits, tier
            )

        return record

    def block_wire(self, block: BlockView[P], also: Sequence[Tier] = ()) -> SnapshotBlock:
        """The entry `GET /v1/cache/snapshot` lists for a RAM block (`also`: the slower
        tiers that hold it too)."""
        return SnapshotBlock(
            key=block.key.hex(),
            parent=block.parent.hex() if block.parent is not None else None,
            start=block.start,
            end=block.end,
            logits=self._has_logits(block.payload),
            pinned=block.pinned,
            tiers=[FASTEST, *also],
            on_disk="disk" in also,
            source=block.source,
        )
