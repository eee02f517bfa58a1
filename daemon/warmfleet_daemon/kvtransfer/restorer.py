"""Before a warm prompt is prefilled: take what the disk and warm peers have.

The prompt's blocks that are not cached yet are read, in chain order, from the
snapshot store, then from each peer in turn (all peers within one deadline, so a slow
one cannot keep the prompt from being warmed); every verified block is inserted into the
prefix cache as if it had just been prefilled. The warm-up request that follows finds
them cached and computes only the rest (or nothing), then pins the chain as usual.
Runs on its own small pool, so neither the engine nor the warm-up scheduler waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from warmfleet_common.chunking import Chunk
from warmfleet_common.contract import PeerRef
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.cache.prefix_cache import BlockSource, InsertOutcome
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.kvtransfer.peers import PeerClient
from warmfleet_daemon.kvtransfer.snapshots import SnapshotStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    blocks: int  # the prompt's blocks
    cached: int  # already in the cache
    from_disk: int
    from_peers: int
    tokens: int  # prompt tokens now cached without prefill (disk + peers)


class BlockRestorer:
    def __init__(
        self,
        engine: Engine,
        *,
        snapshots: SnapshotStore | None,
        peers: PeerClient | None,
        default_peers: Sequence[str] = (),
        peer_deadline_s: float = 120.0,
        workers: int = 2,
    ) -> None:
        self.engine = engine
        self.snapshots = snapshots
        self.peers = peers
        self.default_peers = list(default_peers)
        self.peer_deadline_s = peer_deadline_s  # copying one prompt from every peer
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="warmfleet-restore")
        self.restored_blocks = 0
        self.restored_tokens = 0

    def restore_then(
        self, prompt: RenderedPrompt, peers: Sequence[PeerRef], then: Callable[[], None]
    ) -> None:
        """Restore in the background, then call `then` (which submits the warm-up)."""
        if self.snapshots is None and not peers and not self.default_peers:
            then()  # nothing to restore from: no detour through the pool
            return

        def run() -> None:
            try:
                self.restore(prompt, peers)
            except Exception:  # the warm-up prefills whatever is missing
                log.exception("restoring warm blocks failed; prefilling instead")
            finally:
                then()

        self._pool.submit(run)

    def restore(self, prompt: RenderedPrompt, peers: Sequence[PeerRef] = ()) -> Restored:
        """Copy what is not cached from the snapshots, then `peers` (each with its grant,
        if any), then the default peers (`--warm-from`: with this daemon's token)."""
        started = time.perf_counter()
        chunks = self.engine.plan(prompt)
        index = 0
        while index < len(chunks) and chunks[index].key in self.engine.cache:
            index += 1
        cached = index
        from_disk = from_peers = 0
        if self.snapshots is not None:
            while index < len(chunks):
                payload = self.snapshots.read(chunks[index])
                if payload is None or not self._insert(chunks, index, payload, "snapshot"):
                    break
                index += 1
                from_disk += 1
        named = {p.url for p in peers}
        sources = [*peers, *(PeerRef(url=p) for p in self.default_peers if p not in named)]
        deadline = time.monotonic() + self.peer_deadline_s
        for peer in sources:
            if index >= len(chunks) or self.peers is None or time.monotonic() >= deadline:
                break
            fetched = self.peers.fetch(peer.url, prompt, chunks, index, deadline, grant=peer.grant)
            for position, payload in fetched:
                if position != index or not self._insert(chunks, index, payload, "peer"):
                    break
                index += 1
                from_peers += 1
        tokens = (chunks[index - 1].end if index else 0) - (chunks[cached - 1].end if cached else 0)
        if from_disk or from_peers:
            self.restored_blocks += from_disk + from_peers
            self.restored_tokens += tokens
            log.info(
                "Restored %d tokens of a warm prompt without prefill in %.2fs: %d block(s) "
                "from disk, %d from peers; %d of %d block(s) left to prefill",
                tokens,
                time.perf_counter() - started,
                from_disk,
                from_peers,
                len(chunks) - index,
                len(chunks),
            )
        return Restored(len(chunks), cached, from_disk, from_peers, tokens)

    def _insert(
        self, chunks: list[Chunk], index: int, payload: kv.BlockPayload, source: BlockSource
    ) -> bool:
        parent = chunks[index - 1].key if index else None
        outcome = self.engine.cache.insert(
            chunks[index], parent, payload, payload.nbytes, source=source
        )
        return outcome in (InsertOutcome.STORED, InsertOutcome.PRESENT)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
