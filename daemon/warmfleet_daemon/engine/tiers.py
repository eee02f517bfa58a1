"""Cache tiers as the engine sees them: RAM (the prefix cache), the disk, a peer daemon,
and whatever comes next, all behind one protocol.

A prompt's match runs through the tiers fastest first (RAM, then the tier registry's
in its order; a tier's name is any `warmfleet_common.tiers.Tier`, not only a built-in):
each tier is asked for the prompt's chunks from where the tier before it stopped, and
answers with a `Prefetching` (the run it holds, read in chain order while the engine
restores or computes the earlier chunks) or None. RAM answers at once with the run it
holds; the disk and a peer read theirs on threads of their own, put each block into RAM
(or hold it for the prompt when RAM will not take it) and wake the engine. A block a
prompt computed goes to the first tier that keeps it: RAM, else (its parent left RAM)
the disk. Each tier also prices itself: the time to read a block into RAM, from which
the daemon's published costs are made (`kvtransfer.costs`).

The RAM tier is here, beside the engine that owns the prefix cache; the others are in
`kvtransfer` and listed by its tier registry, which the assembly attaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.tiers import Tier
from warmfleet_daemon.cache.events import HeldBlock, TierListener
from warmfleet_daemon.cache.prefix_cache import BlockSource, InsertOutcome, PrefixCache
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.requests import GenerationRequest


class Prefetching(Protocol):
    """Blocks a tier is reading into the prefix cache for one prompt."""

    chunks: list[Chunk]  # the run of the prompt's chunks it reads, in order
    read: set[BlockKey]  # read from the tier so far

    def waiting_on(self, key: BlockKey) -> bool:
        """True while the block `key` may still come from the tier (the prompt must not
        compute it meanwhile)."""
        ...

    def take(self, key: BlockKey) -> kv.BlockPayload | None:
        """A block read for this prompt that RAM had no room for."""
        ...

    def abandon(self) -> None:
        """The prompt is gone (finished, failed, cancelled)."""
        ...


class CacheTier(Protocol):
    """A place that holds prefix-cache blocks: RAM, the disk, a peer daemon."""

    @property
    def name(self) -> Tier:
        """What the cache events, the snapshot, the status and the usage call it."""
        ...

    # Told of the blocks it gains and loses (RAM's changes are the prefix cache's own).
    listeners: list[TierListener]

    def held(self) -> Sequence[HeldBlock]:
        """Every block it holds now, for a snapshot of the cache (RAM's are the prefix
        cache's own; a peer's are the peer's)."""
        ...

    def prefetch(
        self,
        request: GenerationRequest,
        chunks: Sequence[Chunk],
        start: int,
        wake: Callable[[], None],
    ) -> Prefetching | None:
        """Start reading the run of `chunks[start:]` this tier holds for `request`, in
        order, calling `wake` as blocks arrive. None: it holds none of them (or reading
        them is not worth it); the next tier is asked from `start`."""
        ...

    def store(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: kv.BlockPayload,
        source: BlockSource = "prefill",
    ) -> bool:
        """Keep a block a tier before this one did not take; False: not kept here. Never
        blocks on I/O. `source`: where its KV came from."""
        ...

    def read_seconds(self, payload: kv.BlockPayload, chunk: Chunk, budget_s: float) -> float | None:
        """The time to read one block like `payload` (of `chunk`) from this tier into RAM,
        measured at start within about `budget_s`; None: not priced (a hit here is counted
        as saving nothing, as for a peer whose cost is its link's)."""
        ...


@dataclass
class Prefetch:
    """The reads one prompt waits for: its next chunks that the tier holds, in order."""

    chunks: list[Chunk]
    parent: BlockKey | None
    read: set[BlockKey] = field(default_factory=set)  # read from the tier for this prompt
    # Read and not taken yet: the prompt's own (RAM may evict them before it takes them).
    held: dict[BlockKey, kv.BlockPayload] = field(default_factory=dict)
    done: int = 0  # chunks finished (read or given up)
    failed: bool = False
    cancelled: bool = False
    # Whether reading goes on once the prompt is gone: a disk read lands in RAM for the
    # requests after it; a peer copy holds a link and a copy slot, so it stops.
    outlives_prompt: bool = True

    def take(self, key: BlockKey) -> kv.BlockPayload | None:
        return self.held.pop(key, None)

    def waiting_on(self, key: BlockKey) -> bool:
        if self.failed or self.cancelled:
            return False
        return any(c.key == key for c in self.chunks[self.done :])

    def abandon(self) -> None:
        if not self.outlives_prompt:
            self.cancelled = True  # the reader stops at its next block


class RamTier:
    """The prefix cache as the first tier: its run is known at once (and marked most
    recently used, so RAM keeps it until the prompt restores it); the engine then
    matches RAM again at every prefill step, since the other tiers read into it."""

    name: Tier = "ram"

    def __init__(self, cache: PrefixCache[kv.BlockPayload]) -> None:
        self.cache = cache
        self.listeners: list[TierListener] = []  # the prefix cache tells its own

    def held(self) -> Sequence[HeldBlock]:
        return ()  # the prefix cache's snapshot lists them, with what only RAM knows

    def prefetch(
        self,
        request: GenerationRequest,
        chunks: Sequence[Chunk],
        start: int,
        wake: Callable[[], None],
    ) -> Prefetching | None:
        found = self.cache.match(chunks, start=start).blocks
        if not found:
            return None
        run = list(chunks[start : start + found])
        parent = chunks[start - 1].key if start else None
        return Prefetch(run, parent, read={c.key for c in run}, done=found)

    def store(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: kv.BlockPayload,
        source: BlockSource = "prefill",
    ) -> bool:
        outcome = self.cache.insert(chunk, parent, payload, payload.nbytes, source=source)
        return outcome in (InsertOutcome.STORED, InsertOutcome.PRESENT)

    def read_seconds(self, payload: kv.BlockPayload, chunk: Chunk, budget_s: float) -> float | None:
        return 0.0  # a RAM block is where a restore reads it
