"""A tier the router has never heard of (a daemon's registry added it): its events and
snapshot entries keep the index working, a block held only there counts as held beyond
RAM (never a RAM hit, and saving nothing in the time-saved score), its served tokens
are read from the usage, and the metrics label it `other`, never by a name a backend
chose; a malformed tier name is refused where the wire is read."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from warmfleet_common.chunking import plan_chunks, root_key
from warmfleet_common.tiers import TierCosts, TierTokens
from warmfleet_common.wire import CacheEventLine, SnapshotBlock, parse_event_line
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.index import BlockIndex
from warmfleet_router.keys import RequestBlocks
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.policy.model import Candidate
from warmfleet_router.policy.scorers import FasterTier, prefill_saved
from warmfleet_router.routes import openai_usage
from warmfleet_router.sync import BackendSync, SyncOptions
from warmfleet_router.sync_reads import holders

ROOT = root_key("m")
CHUNKS = plan_chunks(list(range(1, 13)), block_size=4, root=ROOT)
REQUEST = RequestBlocks(tuple(c.key for c in CHUNKS), tuple(c.end for c in CHUNKS), 12)


def make_sync() -> tuple[BackendSync, BlockIndex]:
    backend = Backend(BackendSpec("a", "http://a"))
    index = BlockIndex()

    async def no_layout(_: object) -> None:
        return None

    sync = BackendSync(backend, httpx.AsyncClient(), index, no_layout, SyncOptions())
    backend.epoch, backend.seq = "e1", 10
    index.load_snapshot("a", [])
    return sync, index


def tiered(seq: int, kind: str, key: bytes, tier: str) -> CacheEventLine:
    line = {"seq": seq, "type": kind, "key": key.hex(), "logits": False, "tier": tier}
    return parse_event_line(json.dumps(line))


def test_a_block_only_an_unknown_tier_holds_is_held_beyond_ram() -> None:
    sync, index = make_sync()
    a, b, _ = REQUEST.keys
    for seq, (kind, key, tier) in enumerate(
        [
            ("stored", a, "ram"),
            ("stored", b, "ram"),
            ("stored", a, "vault"),  # a tier only that daemon's registry names
            ("evicted", a, "ram"),  # RAM let it go: the vault still has it
        ],
        start=11,
    ):
        sync.apply(tiered(seq, kind, key, tier))
    assert index.tiers("a", a) == {"other"}  # every tier it has no name for, as served
    hit = index.predict_tiers("a", REQUEST)
    assert hit.total == 8 and hit["ram"] == 4 and hit["other"] == 4  # a beyond RAM, b in RAM
    assert index.predict_fleet({"a": REQUEST})["a"].hit == hit  # the fleet walk agrees
    sync.apply(tiered(15, "evicted", a, "vault"))
    assert index.predict_tiers("a", REQUEST) == TierTokens()  # the run starts at a: gone


def test_a_snapshot_naming_an_unknown_tier_loads() -> None:
    index = BlockIndex()
    a, b, _ = REQUEST.keys
    listed = [
        SnapshotBlock(key=a.hex(), tier="vault", tiers=["vault"]),
        SnapshotBlock(key=b.hex(), tier="ram", tiers=["ram", "vault"]),
    ]
    index.load_snapshot("a", [(bytes.fromhex(s.key), s.logits, holders(s)) for s in listed])
    assert "ram" not in index.tiers("a", a) and "ram" in index.tiers("a", b)
    hit = index.predict_tiers("a", REQUEST)
    assert hit.total == 8 and hit["ram"] == 4


def test_scorers_take_a_hit_beyond_ram_as_no_ram_hit_and_unpriced_as_saving_nothing() -> None:
    costs = TierCosts(
        prefill_us_per_token=100.0,
        hit_us_per_token={"ram": 2.0, "vault": 10.0},
        kv_bytes_per_token=8,
    )
    sync, index = make_sync()
    a, b, _ = REQUEST.keys
    sync.apply(tiered(11, "stored", a, "vault"))
    sync.apply(tiered(12, "stored", b, "vault"))
    cached = index.predict_tiers("a", REQUEST)
    candidate = Candidate("a", in_flight=0, cached=cached, costs=costs)
    assert cached.total == 8
    request: Any = None  # neither scorer reads it
    assert FasterTier().scores([candidate], request) == [0]
    # The index keeps no name for it, so the daemon's price for "vault" is not used here.
    assert prefill_saved(candidate, 0.98) == 0.0


def test_served_tokens_of_an_unknown_tier_count_and_are_labelled_other() -> None:
    usage = openai_usage(
        {
            "usage": {
                "prompt_tokens": 40,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 32},
                "cached_tokens_by_tier": {"ram": 0, "disk": 0, "peer": 0, "vault": 32},
            }
        }
    )
    assert usage is not None and usage.tiers == TierTokens({"vault": 32})
    metrics = RouterMetrics()
    backend = Backend(BackendSpec("a", "http://a"))
    for name in ("vault", "nvme", "cxl-pool"):  # three names, one series
        served = TierTokens({name: 32})
        metrics.request_finished(backend, "prefix", "ok", 32, "events", 40, 32, 0.1, served, served)
    text = metrics.prometheus_text().decode()
    series = re.compile(
        r'warmfleet_router_tier_hit_tokens_total\{[^}]*warmfleet_cache_tier="([^"]*)"'
    )
    assert set(series.findall(text)) == {"ram", "disk", "peer", "other"}
    assert 'warmfleet_cache_tier="vault"' not in text


@pytest.mark.parametrize("name", ["Vault", "", "9lives", "x" * 33, "a b", "ram\n"])
def test_a_malformed_tier_name_is_refused_on_the_wire(name: str) -> None:
    with pytest.raises(ValidationError, match="pattern"):
        tiered(11, "stored", REQUEST.keys[0], name)
    with pytest.raises(ValidationError):
        SnapshotBlock(key=REQUEST.keys[0].hex(), tier=name)
    bad = {"ram": 0, name: 8}
    assert TierTokens.parse(bad, total=8) is None
