"""The disk tier's index: which blocks are on disk, their sizes, and which to delete
when the disk budget is full. Plain Python, no I/O and no mlx, tested with fakes.

Blocks are the prefix cache's (one prefill chunk each, keyed by the chained hash of the
tokens up to their end). A lookup continues a RAM match: the run of a prompt's chunks
that the disk holds, from where RAM stopped. Eviction is least-recently-used among the
blocks no other disk block extends (leaves first: a block without its parent cannot be
reached, so deleting a parent would strand its children), and a block larger than the
whole budget is refused. `add` returns the blocks it evicted so the I/O layer deletes
their files.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from warmfleet_common.chunking import BlockKey, Chunk


@dataclass(frozen=True)
class DiskEntry:
    key: BlockKey
    parent: BlockKey | None
    start: int
    end: int
    nbytes: int
    logits: bool = False  # the block holds its chunk's last-position logits


@dataclass(frozen=True)
class DiskIndexStats:
    blocks: int
    bytes: int
    budget_bytes: int
    evictions: int
    evicted_bytes: int


class DiskIndex:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[BlockKey, DiskEntry] = OrderedDict()  # LRU first
        self._children: dict[BlockKey, int] = {}
        self._bytes = 0
        self._evictions = 0
        self._evicted_bytes = 0

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: BlockKey) -> DiskEntry | None:
        return self._entries.get(key)

    def run(self, chunks: Sequence[Chunk], start: int) -> int:
        """How many of `chunks[start:]`, in order, the disk holds (leaves LRU alone)."""
        count = 0
        for chunk in chunks[start:]:
            entry = self._entries.get(chunk.key)
            if entry is None or (entry.start, entry.end) != (chunk.start, chunk.end):
                break
            count += 1
        return count

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """Mark blocks most recently used (they were read back)."""
        for key in keys:
            if key in self._entries:
                self._entries.move_to_end(key)

    def add(self, entry: DiskEntry) -> tuple[bool, list[DiskEntry]]:
        """Record a block written to disk (most recently used). Returns whether it fits
        the budget, and the blocks evicted to make room (their files are to go). A
        block already present is refreshed; one larger than the budget is refused."""
        if entry.key in self._entries:
            self._entries.move_to_end(entry.key)
            return True, []
        if entry.nbytes > self.budget_bytes:
            return False, []
        evicted = self._evict_until(self.budget_bytes - entry.nbytes, keep=entry.parent)
        if self._bytes + entry.nbytes > self.budget_bytes:
            return False, evicted
        self._entries[entry.key] = entry
        self._bytes += entry.nbytes
        if entry.parent is not None:
            self._children[entry.parent] = self._children.get(entry.parent, 0) + 1
        return True, evicted

    def would_fit(self, nbytes: int) -> bool:
        return nbytes <= self.budget_bytes

    def remove(self, key: BlockKey) -> DiskEntry | None:
        """Forget a block (its file is gone or unusable)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.nbytes
            if entry.parent is not None:
                left = self._children.get(entry.parent, 0) - 1
                if left > 0:
                    self._children[entry.parent] = left
                else:
                    self._children.pop(entry.parent, None)
        return entry

    def clear(self) -> list[DiskEntry]:
        entries = list(self._entries.values())
        self._entries.clear()
        self._children.clear()
        self._bytes = 0
        return entries

    def entries(self) -> list[DiskEntry]:
        return list(self._entries.values())

    def keys_lru_order(self) -> list[BlockKey]:
        return list(self._entries)

    @property
    def stats(self) -> DiskIndexStats:
        return DiskIndexStats(
            len(self._entries), self._bytes, self.budget_bytes, self._evictions, self._evicted_bytes
        )

    def _evict_until(self, limit: int, keep: BlockKey | None) -> list[DiskEntry]:
        evicted: list[DiskEntry] = []
        while self._bytes > limit:
            victim = next(
                (
                    e
                    for e in self._entries.values()
                    if not self._children.get(e.key) and e.key != keep
                ),
                None,
            )
            if victim is None:
                break
            self.remove(victim.key)
            self._evictions += 1
            self._evicted_bytes += victim.nbytes
            evicted.append(victim)
        return evicted
