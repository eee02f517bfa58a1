"""The cache tiers as one protocol: the registry names the tiers beyond RAM in the
order `warmfleet_common.tiers.TIERS` gives them, the engine keeps whatever is attached
in that order, and a tier the engine has never heard of (a fake one here) serves a
prompt's blocks through the protocol alone, counted in its own column of the usage and
token for token the answer computed without it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from support.engine import request, run, tokens_of
from support.kv import BLOCK, from_scratch, prompts
from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.tiers import TIERS, Tier
from warmfleet_daemon.cache.prefix_cache import BlockSource
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.requests import GenerationRequest
from warmfleet_daemon.engine.tiers import Prefetch, RamTier
from warmfleet_daemon.kvtransfer.registry import TIER_REGISTRY
from warmfleet_daemon.kvtransfer.transfer import KVTransfer


class HeldBlocks:
    """A tier that keeps every block offered to it in a dict, and hands a prompt the run
    of them it holds, all at once."""

    def __init__(self, name: Tier) -> None:
        self.name = name
        self.blocks: dict[BlockKey, kv.BlockPayload] = {}
        self.stored: list[Chunk] = []

    def prefetch(
        self,
        request: GenerationRequest,
        chunks: Sequence[Chunk],
        start: int,
        wake: Callable[[], None],
    ) -> Prefetch | None:
        run: list[Chunk] = []
        for chunk in chunks[start:]:
            if chunk.key not in self.blocks:
                break
            run.append(chunk)
        if not run:
            return None
        job = Prefetch(run, chunks[start - 1].key if start else None, done=len(run))
        job.read = {c.key for c in run}
        job.held = {c.key: self.blocks[c.key] for c in run}
        return job

    def store(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: kv.BlockPayload,
        source: BlockSource = "prefill",
    ) -> bool:
        self.blocks[chunk.key] = payload
        self.stored.append(chunk)
        return True

    def read_seconds(self, payload: kv.BlockPayload, chunk: Chunk, budget_s: float) -> float | None:
        return None


def test_the_registry_names_the_tiers_beyond_ram_in_order() -> None:
    assert [TIERS[0], *TIER_REGISTRY] == list(TIERS)
    assert RamTier.name == TIERS[0]


def test_what_the_registry_builds_is_named_as_registered(tiny, make_engine, tmp_path: Path) -> None:
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, cache_dir=tmp_path, cache_disk_budget_bytes=64 << 20)
    try:
        assert [t.name for t in transfer.tiers] == list(TIER_REGISTRY)
        for tier in reversed(transfer.tiers):  # any order: the engine keeps TIERS' order
            engine.attach_tier(tier)
        assert [t.name for t in engine.tiers] == list(TIERS)
    finally:
        transfer.stop()


def test_a_new_tier_keeps_and_serves_blocks_through_the_protocol_alone(tiny, make_engine) -> None:
    engine = make_engine(tiny, block_size=BLOCK, budget=1)  # RAM takes no block
    tier = HeldBlocks("disk")
    engine.attach_tier(tier)
    prefix, full = prompts()
    run(engine, request(prefix.tokens, prefix.cuts, prefill_only=True))
    assert [c.key for c in tier.stored] == [c.key for c in engine.plan(prefix)]
    events = run(engine, request(full.tokens, full.cuts))[0]
    usage = events[-1].usage
    assert usage is not None
    assert usage.cached["disk"] == usage.cached_tokens == len(prefix.tokens)
    assert tokens_of(events) == from_scratch(make_engine(tiny, block_size=BLOCK), full)
