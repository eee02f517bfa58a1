"""The prefix (KV) cache index: plain Python, no mlx, tested with fake payloads.

Entries are blocks: one prefill chunk each (see `chunking`), keyed by a chained hash
of every token up to the block's end, linked to the block before it. A lookup walks a
prompt's planned chunks from the start and returns the longest run that is stored, so
a match always ends on a block boundary: a point where the stored state is exactly
the state after those tokens. That is also why caches that cannot be trimmed
(SSM/hybrid layers, rotating windows) work unchanged: they only ever resume from a
stored boundary, i.e. they match as strict prefixes.

Memory: a byte budget that always holds. Pinned blocks (warm prompts) are never
evicted; the rest are evicted least-recently-used, leaves first (a block's children
depend on it), and an insert that cannot fit is refused rather than overshooting.
Counters are token-weighted so hit rate = hit_tokens / queried_tokens over any window.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Literal, TypeVar

from warmfleet_common.chunking import BlockKey, Chunk

P = TypeVar("P")
T = TypeVar("T")


class InsertOutcome(str, Enum):
    STORED = "stored"
    PRESENT = "present"  # already stored (refreshed as most recently used)
    NO_PARENT = "no_parent"  # the block before it was evicted or never stored
    OVER_BUDGET = "over_budget"  # cannot fit without evicting pinned or ancestor blocks


@dataclass(frozen=True)
class PrefixMatch(Generic[P]):
    """The longest stored run of a prompt's chunks, root first."""

    payloads: tuple[P, ...]
    tokens: int  # prompt tokens covered: the end of the last matched block

    @property
    def blocks(self) -> int:
        return len(self.payloads)


@dataclass(frozen=True)
class CacheStats:
    entry_count: int
    pinned_count: int
    bytes: int
    pinned_bytes: int
    budget_bytes: int
    queried_tokens: int
    hit_tokens: int
    evictions: int
    evicted_bytes: int
    rejected_inserts: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def tokens_saved(self) -> int:
        # Every hit token is a prefill token the engine did not compute.
        return self.hit_tokens


# Where a stored block's KV came from: computed here, copied from a peer daemon, read
# back from the disk tier, or from a warm snapshot.
BlockSource = Literal["prefill", "peer", "disk", "snapshot"]


@dataclass(frozen=True)
class BlockView(Generic[P]):
    """One stored block as listeners and snapshots see it."""

    key: BlockKey
    parent: BlockKey | None
    start: int
    end: int
    payload: P
    pinned: bool
    source: BlockSource = "prefill"


# Called under the cache's lock with every change: ("stored", block), ("evicted", block)
# or ("cleared", None), so a listener's sequence numbers follow the cache's own order.
BlockListener = Callable[[Literal["stored", "evicted", "cleared"], "BlockView[P] | None"], None]


class PrefixCache(Generic[P]):
    """Chained-block prefix index with pinning and an LRU byte budget."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self._budget = budget_bytes
        self._blocks: OrderedDict[BlockKey, _Block[P]] = OrderedDict()  # LRU first
        self._bytes = 0
        self._pinned_bytes = 0
        self._queried = 0
        self._hits = 0
        self._evictions = 0
        self._evicted_bytes = 0
        self._rejected = 0
        self._lock = threading.RLock()
        self.listeners: list[BlockListener[P]] = []
        # Called under the lock with each block evicted for room (not dropped or cleared):
        # a lower tier keeps it. Must not block.
        self.spill: Callable[[BlockView[P]], None] | None = None

    # -- lookup ---------------------------------------------------------------

    def match(self, chunks: Sequence[Chunk], *, start: int = 0) -> PrefixMatch[P]:
        """Longest stored run of `chunks[start:]` (chunks[start-1] must already be in
        hand); marks the run most recently used."""
        with self._lock:
            found: list[_Block[P]] = []
            for chunk in chunks[start:]:
                block = self._blocks.get(chunk.key)
                if block is None:
                    break
                found.append(block)
            for block in found:
                self._blocks.move_to_end(block.key)
            end = found[-1].end if found else (chunks[start - 1].end if start else 0)
            return PrefixMatch(tuple(b.payload for b in found), end)

    def peek(self, key: BlockKey) -> tuple[P, int, int] | None:
        """A stored block's payload, start and end, leaving its LRU place alone (for
        snapshots and peer copies, which are not uses)."""
        with self._lock:
            block = self._blocks.get(key)
            return (block.payload, block.start, block.end) if block is not None else None

    def __contains__(self, key: BlockKey) -> bool:
        with self._lock:
            return key in self._blocks

    # -- store ----------------------------------------------------------------

    def insert(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: P,
        nbytes: int,
        *,
        source: BlockSource = "prefill",
    ) -> InsertOutcome:
        """Store one block. `parent` is the key of the chunk before it (None for the
        first chunk of a prompt); `source`: where its KV came from (for listeners and
        snapshots). Evicts unpinned LRU leaves to make room."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        with self._lock:
            existing = self._blocks.get(chunk.key)
            if existing is not None:
                self._blocks.move_to_end(chunk.key)
                return InsertOutcome.PRESENT
            parent_block = None
            if parent is not None:
                parent_block = self._blocks.get(parent)
                if parent_block is None:
                    return InsertOutcome.NO_PARENT
            if nbytes > self._budget - self._pinned_bytes:
                self._rejected += 1
                return InsertOutcome.OVER_BUDGET
            # The parent must survive the evictions this insert triggers.
            if parent_block is not None:
                parent_block.children += 1
            if not self._evict_until(self._budget - nbytes):
                if parent_block is not None:
                    parent_block.children -= 1
                self._rejected += 1
                return InsertOutcome.OVER_BUDGET
            self._blocks[chunk.key] = _Block(
                chunk.key, parent_block, chunk.start, chunk.end, payload, nbytes, source
            )
            self._bytes += nbytes
            self._notify("stored", self._blocks[chunk.key])
            return InsertOutcome.STORED

    # -- pinning --------------------------------------------------------------

    def pin(self, keys: Iterable[BlockKey]) -> bool:
        """Pin every block of a chain; all or nothing. False if one is missing."""
        with self._lock:
            blocks = [self._blocks.get(k) for k in keys]
            if any(b is None for b in blocks):
                return False
            for block in blocks:
                assert block is not None
                if block.pins == 0:
                    self._pinned_bytes += block.nbytes
                block.pins += 1
            return True

    def unpin(self, keys: Iterable[BlockKey]) -> None:
        with self._lock:
            for key in keys:
                block = self._blocks.get(key)
                if block is None or block.pins == 0:
                    continue
                block.pins -= 1
                if block.pins == 0:
                    self._pinned_bytes -= block.nbytes

    def pinned_bytes_of(self, keys: Iterable[BlockKey]) -> int:
        """Bytes these blocks would add to the pinned total (already pinned: zero)."""
        with self._lock:
            return sum(b.nbytes for k in set(keys) if (b := self._blocks.get(k)) and b.pins == 0)

    # -- removal ----------------------------------------------------------------

    def drop(self, keys: Sequence[BlockKey]) -> int:
        """Remove the given blocks, deepest first, where nothing pins or extends them.
        Returns how many were removed."""
        removed = 0
        with self._lock:
            for key in reversed(keys):
                block = self._blocks.get(key)
                if block is not None and block.pins == 0 and block.children == 0:
                    self._remove(block)
                    removed += 1
        return removed

    def clear(self) -> int:
        """Remove every block, pinned ones too. Returns how many were removed."""
        with self._lock:
            count = len(self._blocks)
            self._blocks.clear()
            self._bytes = 0
            self._pinned_bytes = 0
            for listener in self.listeners:
                listener("cleared", None)
            return count

    def set_budget(self, budget_bytes: int) -> None:
        with self._lock:
            self._budget = budget_bytes
            self._evict_until(budget_bytes)

    # -- accounting -------------------------------------------------------------

    def record_query(self, queried_tokens: int, hit_tokens: int) -> None:
        """Count one prompt: its tokens, and how many of them came from the cache."""
        if not 0 <= hit_tokens <= queried_tokens:
            raise ValueError("need 0 <= hit_tokens <= queried_tokens")
        with self._lock:
            self._queried += queried_tokens
            self._hits += hit_tokens

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                entry_count=len(self._blocks),
                pinned_count=sum(1 for b in self._blocks.values() if b.pins),
                bytes=self._bytes,
                pinned_bytes=self._pinned_bytes,
                budget_bytes=self._budget,
                queried_tokens=self._queried,
                hit_tokens=self._hits,
                evictions=self._evictions,
                evicted_bytes=self._evicted_bytes,
                rejected_inserts=self._rejected,
            )

    def snapshot(self, also: Callable[[], T]) -> tuple[list[BlockView[P]], T]:
        """Every stored block, root first, and `also()` read under the same lock (a
        listener's sequence number, so a snapshot and an event stream line up)."""
        with self._lock:
            blocks = sorted(self._blocks.values(), key=lambda b: b.end)
            return [_view(b) for b in blocks], also()

    def keys_lru_order(self) -> list[BlockKey]:
        """Block keys from least to most recently used (for tests and diagnostics)."""
        with self._lock:
            return list(self._blocks)

    # -- helpers ----------------------------------------------------------------

    def _evict_until(self, limit: int) -> bool:
        """Evict LRU unpinned leaves until bytes <= limit. False if that is impossible."""
        while self._bytes > limit:
            victim = next(
                (b for b in self._blocks.values() if b.pins == 0 and b.children == 0), None
            )
            if victim is None:
                return False
            if self.spill is not None:
                self.spill(_view(victim))
            self._remove(victim)
            self._evictions += 1
            self._evicted_bytes += victim.nbytes
        return True

    def _remove(self, block: _Block[P]) -> None:
        del self._blocks[block.key]
        self._bytes -= block.nbytes
        if block.pins:
            self._pinned_bytes -= block.nbytes
        if block.parent is not None:
            block.parent.children -= 1
        self._notify("evicted", block)

    def _notify(self, kind: Literal["stored", "evicted"], block: _Block[P]) -> None:
        if self.listeners:
            view = _view(block)
            for listener in self.listeners:
                listener(kind, view)


def _view(block: _Block[P]) -> BlockView[P]:
    parent = block.parent.key if block.parent is not None else None
    return BlockView(
        block.key, parent, block.start, block.end, block.payload, block.pins > 0, block.source
    )


class _Block(Generic[P]):
    __slots__ = (
        "children",
        "end",
        "key",
        "nbytes",
        "parent",
        "payload",
        "pins",
        "source",
        "start",
    )

    def __init__(
        self,
        key: BlockKey,
        parent: _Block[P] | None,
        start: int,
        end: int,
        payload: P,
        nbytes: int,
        source: BlockSource = "prefill",
    ) -> None:
        self.key = key
        self.source = source
        self.parent = parent
        self.start = start
        self.end = end
        self.payload = payload
        self.nbytes = nbytes
        self.children = 0
        self.pins = 0
