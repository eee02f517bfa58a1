"""What a cache tier beyond RAM is built from: the daemon's prefix cache, the block
codec (the fingerprinted on-disk and on-wire format), the peer client, and the tiers'
settings. Each tier module's `build(context)` takes it (see `registry`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from warmfleet_daemon.cache.prefix_cache import PrefixCache
from warmfleet_daemon.engine import kv
from warmfleet_daemon.kvtransfer.codec import BlockCodec
from warmfleet_daemon.kvtransfer.peers import PeerClient

SpillMode = Literal["auto", "always", "off"]


@dataclass(frozen=True)
class TierOptions:
    cache_dir: str | Path | None = None  # the disk tier's directory (None: no disk tier)
    cache_disk_budget_bytes: int = 0
    spill: SpillMode = "auto"  # copies from the peer the router names
    spill_deadline_s: float = 30.0


@dataclass(frozen=True)
class TierContext:
    cache: PrefixCache[kv.BlockPayload]
    codec: BlockCodec
    peers: PeerClient
    options: TierOptions
