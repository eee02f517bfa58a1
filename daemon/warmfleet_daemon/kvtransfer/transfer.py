"""What the daemon holds for warm-without-prefill and its cache tiers: the fingerprint
and codec, the snapshot store (with `--state-dir`), the tiers beyond RAM (the registry's:
the disk, the peer copies of a spill), the peer client and the restorer. It builds the
tiers; the assembly attaches them to the engine."""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.tiers import TierCosts
from warmfleet_common.wire import CachePullResult
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.threads import on_a_thread_of_its_own
from warmfleet_daemon.engine.tiers import CacheTier
from warmfleet_daemon.kvtransfer.codec import BlockCodec, LayerLayout, probe_layout
from warmfleet_daemon.kvtransfer.context import SpillMode, TierContext, TierOptions
from warmfleet_daemon.kvtransfer.disk_tier import DiskTier
from warmfleet_daemon.kvtransfer.fingerprint import model_fingerprint
from warmfleet_daemon.kvtransfer.peers import PeerClient
from warmfleet_daemon.kvtransfer.registry import build_tiers
from warmfleet_daemon.kvtransfer.restorer import BlockRestorer
from warmfleet_daemon.kvtransfer.snapshots import SnapshotStore
from warmfleet_daemon.kvtransfer.spill import PeerSpill

log = logging.getLogger(__name__)

_SAVE_ON_STOP_S = 30  # a graceful stop writes the RAM blocks the disk lacks, this long


class KVTransfer:
    def __init__(
        self,
        engine: Engine,
        *,
        state_dir: str | Path | None = None,
        snapshot_budget_bytes: int = 0,
        warm_from: Sequence[str] = (),
        peer_token: str | None = None,
        peer_tls: ssl.SSLContext | None = None,
        peer_deadline_s: float = 120.0,
        cache_dir: str | Path | None = None,
        cache_disk_budget_bytes: int = 0,
        spill: SpillMode = "auto",
        spill_deadline_s: float = 30.0,
        costs: TierCosts | None = None,
        codec: BlockCodec | None = None,
    ) -> None:
        """Call before the engine thread starts (it probes the model, unless given the
        `codec`: the simulated engine's). With `cache_dir`, every block also goes to the
        disk tier there, and the engine reads it back once `tiers` are attached to it."""
        self.engine = engine
        if codec is None:
            bits = engine.config.kv_bits
            fingerprint = model_fingerprint(engine.loaded, engine.config.block_size, bits)
            codec = BlockCodec(fingerprint, _probe_on_a_thread_of_its_own(engine))
        self.codec = codec
        self.fingerprint = codec.fingerprint
        self.snapshots = (
            SnapshotStore(state_dir, self.codec, snapshot_budget_bytes)
            if state_dir is not None and snapshot_budget_bytes > 0
            else None
        )
        self.peers = PeerClient(self.codec, token=peer_token, tls=peer_tls)
        options = TierOptions(cache_dir, cache_disk_budget_bytes, spill, spill_deadline_s)
        # The tiers beyond RAM, fastest first, for the assembly to attach to the engine.
        self.tiers: list[CacheTier] = build_tiers(
            TierContext(engine.cache, self.codec, self.peers, options)
        )
        self.disk = next((t for t in self.tiers if isinstance(t, DiskTier)), None)
        self.spill = next(t for t in self.tiers if isinstance(t, PeerSpill))
        self.spill.costs = costs
        self.restorer = BlockRestorer(
            engine,
            snapshots=self.snapshots,
            peers=self.peers,
            default_peers=warm_from,
            peer_deadline_s=peer_deadline_s,
        )
        log.info(
            "KV fingerprint %s; snapshots %s; disk tier %s; warm from %s",
            self.fingerprint,
            f"in {self.snapshots.directory}" if self.snapshots else "off",
            f"in {self.disk.directory}" if self.disk else "off",
            ", ".join(warm_from) or "pushed peers only",
        )

    def sync_snapshots(self, wanted: Iterable[BlockKey], warm: Iterable[list[BlockKey]]) -> None:
        if self.snapshots is not None:
            self.snapshots.sync(set(wanted), list(warm), self.engine.cache.peek)

    def pull(
        self, peer: str, chunks: list[Chunk], deadline_s: float, grant: str | None = None
    ) -> CachePullResult:
        """Copy the chain `chunks` (a session's blocks, by key) from `peer` into the
        cache, from its first block this daemon lacks; within `deadline_s` (a drain
        handoff: the peer is leaving). `grant`: presented to the peer (the router's)."""
        started = time.monotonic()
        cache = self.engine.cache
        first = next((i for i, c in enumerate(chunks) if c.key not in cache), len(chunks))
        copied = tokens = nbytes = 0
        parent = chunks[first - 1].key if first else None
        if first < len(chunks):
            fetched = self.peers.fetch_chain(
                peer,
                self.engine.root,
                chunks[first:],
                started + deadline_s,
                "the handoff's deadline",
                grant,
            )
            for index, payload in fetched:
                chunk = chunks[first + index]
                held = any(
                    tier.store(chunk, parent, payload, source="peer") for tier in self.engine.tiers
                )
                if not held:
                    break  # no tier takes it (RAM, the disk): the rest would hang off nothing
                copied, tokens, nbytes = copied + 1, tokens + chunk.size, nbytes + payload.nbytes
                parent = chunk.key
        seconds = time.monotonic() - started
        log.info(
            "pulled %d of %d block(s) (%d tokens, %.1f MiB) from %s in %.2fs; %d held already",
            copied,
            len(chunks) - first,
            tokens,
            nbytes / (1 << 20),
            peer,
            seconds,
            first,
        )
        return CachePullResult(
            present_blocks=first,
            copied_blocks=copied,
            copied_tokens=tokens,
            copied_bytes=nbytes,
            seconds=seconds,
            complete=first + copied == len(chunks),
        )

    def status(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "root": self.engine.root.hex(),
            "block_size": self.engine.config.block_size,
            "kv_bytes_per_token": self.codec.kv_bytes_per_token(),
            "restored_blocks": self.restorer.restored_blocks,
            "restored_tokens": self.restorer.restored_tokens,
            "default_peers": self.restorer.default_peers,
            "snapshots": vars(self.snapshots.stats()) if self.snapshots else None,
            "spill": vars(self.spill.stats()),
        }

    def stop(self) -> None:
        if self.disk is not None:
            if not self.disk.save_all(timeout=_SAVE_ON_STOP_S):
                log.warning(
                    "The disk tier did not save every RAM block within %ds", _SAVE_ON_STOP_S
                )
            self.disk.stop()
        self.restorer.stop()
        self.spill.stop()
        if self.snapshots is not None:
            self.snapshots.stop()


def _probe_on_a_thread_of_its_own(engine: Engine) -> tuple[LayerLayout, ...]:
    return on_a_thread_of_its_own(
        lambda: probe_layout(engine.model, engine.config.kv_bits, engine.kv_group_size),
        "warmfleet-kv-probe",
    )
