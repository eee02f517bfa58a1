"""The blocks a lower tier (the disk, a peer) reads for one prompt, in chain order: the
engine takes each as it arrives and computes a block only once the tier gave up on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_daemon.engine import kv


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

    def take(self, key: BlockKey) -> kv.BlockPayload | None:
        return self.held.pop(key, None)

    def waiting_on(self, key: BlockKey) -> bool:
        """True while the block `key` may still come from the tier (the prompt must
        not compute it meanwhile)."""
        if self.failed or self.cancelled:
            return False
        return any(c.key == key for c in self.chunks[self.done :])
