"""The cache tiers as one protocol, and the tier registry as the authority for which
tiers a daemon has: the built-in registry names the built-in tiers beyond RAM in
`TIERS`' order, the engine keeps what is attached in the order attached, and a tier
nobody has heard of, registered under a name of its own with the whole protocol, is
served, evicted and restored through in a whole daemon (in process, tiny model), its
name in the cache events, the snapshot, the status, the costs and every usage."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from fastapi.testclient import TestClient

from support.engine import model
from support.kv import BLOCK
from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.tiers import TIERS, TierTokens
from warmfleet_common.wire import CacheSnapshot, DaemonStatus, parse_event_line
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.cache.events import HeldBlock, TierListener
from warmfleet_daemon.cache.prefix_cache import BlockSource
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, GenerationRequest
from warmfleet_daemon.engine.tiers import CacheTier, Prefetch, RamTier
from warmfleet_daemon.kvtransfer import registry
from warmfleet_daemon.kvtransfer.context import TierContext
from warmfleet_daemon.kvtransfer.registry import TIER_REGISTRY
from warmfleet_daemon.kvtransfer.transfer import KVTransfer
from warmfleet_daemon.settings import DaemonSettings

NAME = "vault"  # in no list of tiers anywhere: the registry below is the only one naming it


@dataclass(frozen=True)
class Kept:
    """A block the vault holds: what the snapshot and the events say of it, and its KV."""

    key: BlockKey
    parent: BlockKey | None
    start: int
    end: int
    logits: bool
    payload: kv.BlockPayload


class Vault:
    """A tier beyond RAM with the whole protocol: it keeps every block offered to it, up
    to `capacity` (the oldest out first, telling its listeners), hands a prompt
    the run of them it holds at once, and prices itself."""

    def __init__(self, name: str, capacity: int = 1 << 20) -> None:
        self._name = name
        self.capacity = capacity
        self.blocks: OrderedDict[BlockKey, Kept] = OrderedDict()
        self.listeners: list[TierListener] = []

    @property
    def name(self) -> str:
        return self._name

    def held(self) -> Sequence[HeldBlock]:
        return list(self.blocks.values())

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
        job.held = {c.key: self.blocks[c.key].payload for c in run}  # RAM takes none
        return job

    def store(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: kv.BlockPayload,
        source: BlockSource = "prefill",
    ) -> bool:
        kept = Kept(chunk.key, parent, chunk.start, chunk.end, payload.logits is not None, payload)
        self.blocks[chunk.key] = kept
        self._tell("stored", kept)
        while len(self.blocks) > self.capacity:
            self._tell("evicted", self.blocks.popitem(last=False)[1])
        return True

    def read_seconds(self, payload: kv.BlockPayload, chunk: Chunk, budget_s: float) -> float | None:
        return 1e-4  # priced: its name is in the costs too

    def _tell(self, kind: Literal["stored", "evicted"], block: Kept) -> None:
        for listener in self.listeners:
            listener(kind, block)


def test_the_vault_is_a_whole_tier() -> None:
    tier: CacheTier = Vault(NAME)  # mypy checks it against the protocol
    assert tier.name == NAME and NAME not in TIERS


def test_the_builtin_registry_names_the_builtin_tiers_beyond_ram_in_order() -> None:
    assert [TIERS[0], *TIER_REGISTRY] == list(TIERS)
    assert RamTier.name == TIERS[0]


def test_the_engine_keeps_the_tiers_in_the_order_attached(
    tiny, make_engine, tmp_path: Path
) -> None:
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, cache_dir=tmp_path, cache_disk_budget_bytes=64 << 20)
    try:
        assert [t.name for t in transfer.tiers] == list(TIER_REGISTRY)
        for tier in transfer.tiers:
            engine.attach_tier(tier)
        engine.attach_tier(Vault(NAME))
        assert [t.name for t in engine.tiers] == [*TIERS, NAME]
        again = Vault("disk")  # replaces the disk tier in its place
        engine.attach_tier(again)
        assert [t.name for t in engine.tiers] == [*TIERS, NAME] and engine.tiers[1] is again
        for bad in ("Vault", "", "9lives", "x" * 33, "ram"):
            with pytest.raises(ValueError):
                engine.attach_tier(Vault(bad))
    finally:
        transfer.stop()


CHAT = {
    "model": "tiny-random",
    "temperature": 0,
    "max_tokens": 6,
    "messages": [
        {"role": "system", "content": "You are Ledger, the accounts agent. Be exact. " * 6},
        {"role": "user", "content": "Which invoices are overdue?"},
    ],
}
OTHER = {
    **CHAT,
    "messages": [
        {"role": "system", "content": "You are Sentinel, who watches the build. " * 6},
        {"role": "user", "content": "Did the nightly build pass?"},
    ],
}


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, list[Vault]]]:
    """A daemon whose registry lists the vault first beyond RAM, and whose RAM keeps no
    block: every block a prompt computes goes to the vault, every hit comes from it."""
    built: list[Vault] = []

    def build(context: TierContext) -> Vault:
        built.append(Vault(NAME))
        return built[-1]

    monkeypatch.setattr(registry, "TIER_REGISTRY", {NAME: build, **TIER_REGISTRY})
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=1))
    settings = DaemonSettings(model="tiny-random", next_turn_prefill=False)
    with TestClient(create_app(settings, engine=engine)) as client:
        yield client, built


def chat(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def events(client: TestClient, after: int) -> list[dict[str, Any]]:
    """The block events after `after`, as the route streams them (up to a heartbeat)."""
    out: list[dict[str, Any]] = []
    with client.stream("GET", "/v1/cache/events", params={"after": after, "heartbeat": 0.2}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            parse_event_line(line)  # every line a wire model's: the name validates
            event = json.loads(line)
            if event["type"] == "heartbeat":
                return out
            if event["type"] != "hello":
                out.append(event)
    return out


def snapshot(client: TestClient) -> CacheSnapshot:
    r = client.get("/v1/cache/snapshot")
    assert r.status_code == 200
    return CacheSnapshot.model_validate_json(r.content)


def test_a_registered_tier_serves_evicts_and_restores_under_its_own_name(
    daemon: tuple[TestClient, list[Vault]],
) -> None:
    client, built = daemon
    [vault] = built
    status = DaemonStatus.model_validate(client.get("/v1/status").json())
    assert status.tiers == ["ram", NAME, "peer"]  # the registry's order; no disk configured
    assert status.tier_costs is not None and NAME in status.tier_costs.hit_us_per_token

    first = chat(client, CHAT)  # computed: nothing cached anywhere
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    stored = events(client, 0)
    assert stored and {(e["type"], e["tier"]) for e in stored} == {("stored", NAME)}
    keys = [e["key"] for e in stored]
    assert keys == [k.hex() for k in vault.blocks]
    listed = snapshot(client).blocks
    assert [b.key for b in listed] == keys  # RAM holds none: the vault's own, in order
    assert all(b.tier == NAME and b.tiers == [NAME] and not b.on_disk for b in listed)

    again = chat(client, CHAT)  # served from the vault, its KV restored into the sequence
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    by_tier = again["usage"]["cached_tokens_by_tier"]
    assert cached >= 32 and by_tier == {"ram": 0, "disk": 0, "peer": 0, NAME: cached}
    assert TierTokens.parse(by_tier, total=cached) == TierTokens({NAME: cached})
    assert again["choices"][0]["message"] == first["choices"][0]["message"]  # token for token
    metrics = client.get("/metrics").text  # the daemon's own tiers label its series
    assert f'warmfleet_cache_tier="{NAME}"' in metrics

    seq = snapshot(client).seq
    vault.capacity = len(vault.blocks)  # another prompt's blocks push the first one's out
    chat(client, OTHER)
    changed = events(client, seq)
    evicted = [e["key"] for e in changed if e["type"] == "evicted"]
    assert evicted == keys[: len(evicted)] and evicted  # the oldest first
    assert {e["tier"] for e in changed} == {NAME}
    assert not {b.key for b in snapshot(client).blocks} & set(evicted)

    third = chat(client, CHAT)  # its first block is gone: computed again, nothing read
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert third["usage"]["cached_tokens_by_tier"] == {"ram": 0, "disk": 0, "peer": 0}
    assert third["choices"][0]["message"] == first["choices"][0]["message"]
