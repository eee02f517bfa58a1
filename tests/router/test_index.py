"""The router's block index and the event stream's bookkeeping, with fake blocks."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest

from warmfleet_common.chunking import plan_chunks, root_key
from warmfleet_common.tiers import TierTokens
from warmfleet_common.wire import CacheEventLine, parse_event_line
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.index import ENTRY_BYTES, BlockIndex
from warmfleet_router.keys import RequestBlocks
from warmfleet_router.sync import BackendSync, ResyncNeeded, SyncOptions

ROOT = root_key("m")


def blocks(tokens: list[int], block: int = 4) -> RequestBlocks:
    chunks = plan_chunks(tokens, block_size=block, root=ROOT)
    return RequestBlocks(tuple(c.key for c in chunks), tuple(c.end for c in chunks), len(tokens))


SHARED = list(range(1, 13))  # three blocks
REQUEST = blocks([*SHARED, 40, 41])  # the three shared blocks and a final one


def test_prediction_is_the_longest_held_run_from_the_first_block() -> None:
    index = BlockIndex()
    held = blocks(SHARED)
    index.load_snapshot("a", [(held.keys[0], False), (held.keys[2], False)])  # hole at 1
    assert index.predict("a", REQUEST) == 4
    index.stored("a", held.keys[1], False)
    assert index.predict("a", REQUEST) == 12
    index.evicted("a", held.keys[2])
    assert index.predict("a", REQUEST) == 8
    index.cleared("a")
    assert index.predict("a", REQUEST) == 0
    assert index.predict("unknown", REQUEST) == 0


def test_the_final_block_counts_only_with_its_logits() -> None:
    index = BlockIndex()
    index.load_snapshot("a", [(k, False) for k in REQUEST.keys])  # e.g. warmed, no logits
    assert index.predict("a", REQUEST) == 12  # the engine recomputes the last chunk
    index.stored("a", REQUEST.keys[-1], True)  # an exact repeat stored its logits
    assert index.predict("a", REQUEST) == 14


def test_history_estimates_for_backends_without_events() -> None:
    index = BlockIndex(history_blocks=5)
    index.routed("plain", REQUEST)
    assert not index.is_precise("plain")
    assert index.predict("plain", REQUEST) == 14
    index.routed("plain", blocks([7, 7, 7, 7, 8, 8, 8, 8]))  # two more: the oldest go
    assert index.size("plain") == 5
    assert index.predict("plain", REQUEST) == 0  # its first block was forgotten
    index.load_snapshot("precise", [])
    index.routed("precise", REQUEST)  # events, not routing, say what a daemon holds
    assert index.predict("precise", REQUEST) == 0


def make_sync() -> tuple[BackendSync, Backend, BlockIndex]:
    backend = Backend(BackendSpec("a", "http://a"))
    index = BlockIndex()

    async def no_layout(_: object) -> None:
        return None

    sync = BackendSync(backend, httpx.AsyncClient(), index, no_layout, SyncOptions())
    backend.epoch, backend.seq = "e1", 10
    index.load_snapshot("a", [])
    return sync, backend, index


def event(seq: int, kind: str, key: bytes = b"", logits: bool = False) -> dict[str, object]:
    return {"seq": seq, "type": kind, "key": key.hex(), "logits": logits}


def wire(line: dict[str, object]) -> CacheEventLine:
    return parse_event_line(json.dumps(line))


def test_events_in_sequence_update_the_index() -> None:
    sync, backend, index = make_sync()
    sync.apply(wire({"type": "hello", "epoch": "e1", "seq": 12}))
    sync.apply(wire(event(11, "stored", REQUEST.keys[0])))
    sync.apply(wire(event(12, "stored", REQUEST.keys[1])))
    sync.apply(wire({"type": "heartbeat", "seq": 12}))
    assert backend.seq == 12 and index.predict("a", REQUEST) == 8
    sync.apply(wire(event(13, "evicted", REQUEST.keys[1])))
    assert index.predict("a", REQUEST) == 4
    sync.apply(wire({"seq": 14, "type": "cleared"}))
    assert index.size("a") == 0 and backend.seq == 14


@pytest.mark.parametrize(
    "line",
    [
        event(12, "stored", b"x" * 16),  # 11 is missing
        {"type": "heartbeat", "seq": 11},  # the daemon sent an event we never saw
        {"type": "hello", "epoch": "e2", "seq": 0},  # the daemon restarted
        {"type": "reset", "reason": "gap"},
    ],
)
def test_a_gap_a_restart_or_a_reset_means_resync(line: dict[str, object]) -> None:
    sync, backend, _ = make_sync()
    with pytest.raises(ResyncNeeded):
        sync.apply(wire(line))
    assert backend.seq == 10  # nothing applied


async def open_stream(lines: bytes) -> AsyncIterator[bytes]:
    """An event stream that stays open after its lines, as a daemon's does (its end means
    a new snapshot)."""
    yield lines
    await asyncio.sleep(60)


def test_resync_after_a_gap_against_a_fake_daemon() -> None:
    """The events loop: snapshot, stream with a gap, a new snapshot, then in sync."""
    served = {"snapshots": 0}
    key_a, key_b = REQUEST.keys[0], REQUEST.keys[1]

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/cache/snapshot":
            served["snapshots"] += 1
            if served["snapshots"] == 1:
                return httpx.Response(
                    200, json={"epoch": "e1", "seq": 1, "fingerprint": None, "blocks": []}
                )
            blocks_now = [
                {"key": key_a.hex(), "logits": False},
                {"key": key_b.hex(), "logits": False},
            ]
            return httpx.Response(
                200, json={"epoch": "e1", "seq": 5, "fingerprint": None, "blocks": blocks_now}
            )
        if path == "/v1/cache/events":
            after = int(request.url.params["after"])
            if after == 1:  # event 2 was lost: 3 arrives first
                body = [{"type": "hello", "epoch": "e1", "seq": 3}, event(3, "stored", key_a)]
            else:
                body = [{"type": "hello", "epoch": "e1", "seq": 5}, {"type": "heartbeat", "seq": 5}]
            text = "".join(json.dumps(line) + "\n" for line in body)
            ndjson = {"content-type": "application/x-ndjson"}
            return httpx.Response(200, content=open_stream(text.encode()), headers=ndjson)
        return httpx.Response(404)

    async def scenario() -> tuple[int, int, str, int]:
        backend = Backend(BackendSpec("a", "http://a"))
        index = BlockIndex()

        async def no_layout(_: object) -> None:
            return None

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = BackendSync(backend, client, index, no_layout, SyncOptions(retry=0.01))
            task = asyncio.create_task(sync._events_loop())
            for _ in range(500):
                await asyncio.sleep(0.01)
                if served["snapshots"] >= 2 and backend.seq == 5:
                    break
            task.cancel()
        return served["snapshots"], backend.seq, backend.index_mode, index.predict("a", REQUEST)

    snapshots, seq, mode, predicted = asyncio.run(scenario())
    assert (snapshots, seq, mode, predicted) == (2, 5, "following", 8)


def test_warm_sets_count_as_held_on_backends_without_events() -> None:
    index = BlockIndex()
    warm = blocks(SHARED)  # a warm prefix: the request's first three blocks
    index.set_pinned("plain", warm.keys)
    assert index.predict("plain", REQUEST) == 12
    assert index.size("plain") == 3
    index.routed("plain", blocks([*SHARED, 40, 41]))  # the history adds the rest
    assert index.predict("plain", REQUEST) == 14 and index.size("plain") == 4
    # A request that is exactly the warm prefix: its final block has no logits there.
    assert index.predict("other", warm) == 0
    index.set_pinned("other", warm.keys)
    assert index.predict("other", warm) == 8
    # A backend that lost its events keeps its warm sets; one that is gone does not.
    index.forget("other", keep_pinned=True)
    assert index.predict("other", warm) == 8
    index.forget("other")
    assert index.predict("other", warm) == 0


def test_events_not_warm_sets_say_what_a_daemon_with_events_holds() -> None:
    index = BlockIndex()
    index.load_snapshot("precise", [])  # e.g. just cleared: its warm-up not redone yet
    index.set_pinned("precise", blocks(SHARED).keys)
    assert index.predict("precise", REQUEST) == 0


def warm_sets_body(blocks_of: dict[str, list[bytes]]) -> dict[str, object]:
    def prompt(name: str, state: str) -> dict[str, object]:
        keys = [k.hex() for k in blocks_of[name]]
        return {"name": name, "state": state, "content_hash": "h", "tokens": 4, "blocks": keys}

    def warm_set(name: str, pin: bool, prompts: list[dict[str, object]]) -> dict[str, object]:
        return {
            "namespace": "ns", "name": name, "generation": 1, "content_hash": "c",
            "concurrency": 2, "pin": pin, "prompts": prompts, "warm": 1,
            "total": len(prompts), "updated_at": 0.0,
        }  # fmt: skip

    return {
        "sets": [
            warm_set("pinned", True, [prompt("warm", "warm"), prompt("warming", "warming")]),
            warm_set("unpinned", False, [prompt("evictable", "warm")]),
        ]
    }


def test_a_backend_without_events_is_asked_rarely_and_its_warm_sets_are_read() -> None:
    """Not a daemon with events (404): the index estimates from history plus the warm,
    pinned prompts of its warm sets; it asks for a snapshot again only after
    `no_events_retry`, not every `retry`."""
    asked: dict[str, int] = {}
    keys = blocks([*SHARED, 1, 2, 3, 4]).keys
    body = warm_sets_body({"warm": [keys[0]], "warming": [keys[1]], "evictable": [keys[2]]})

    def handler(request: httpx.Request) -> httpx.Response:
        asked[request.url.path] = asked.get(request.url.path, 0) + 1
        if request.url.path == "/v1/warm-sets":
            return httpx.Response(200, json=body)
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    async def scenario() -> tuple[dict[str, int], str, int]:
        backend = Backend(BackendSpec("a", "http://a"), health="ready")
        index = BlockIndex()

        async def no_layout(_: object) -> None:
            return None

        options = SyncOptions(retry=0.01, no_events_retry=30.0)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = BackendSync(backend, client, index, no_layout, options)
            task = asyncio.create_task(sync._events_loop())
            await asyncio.sleep(0.3)
            task.cancel()
            await sync.read_warm_sets()
        return dict(asked), backend.index_mode, index.predict("a", blocks([*SHARED, 1, 2, 3, 4]))

    asked_now, mode, predicted = asyncio.run(scenario())
    assert mode == "history"
    assert asked_now["/v1/cache/snapshot"] == 1  # not 30 times in 0.3 s
    assert asked_now["/v1/cache/layout"] == 1  # its warm sets' keys would be in its layout
    assert predicted == 4  # the warm prompt's block; not the warming or unpinned ones


def test_requests_in_prefill_together_that_could_share_an_unheld_block_contend() -> None:
    """Both cold on one daemon: it computes the shared block once and either of them
    may be the one that reuses it, so neither prediction can be exact by design."""
    index = BlockIndex()
    first = blocks(SHARED[:4])
    index.load_snapshot("a", [(first.keys[0], False)])
    index.load_snapshot("b", [])
    one = index.take_off("a", blocks([*SHARED, 40]))  # holds block 0, needs 1, 2, 3
    other_backend = index.take_off("b", blocks([*SHARED, 41]))
    assert not one.contended and not other_backend.contended
    two = index.take_off("a", blocks([*SHARED, 42]))  # needs block 1 too
    assert one.contended and two.contended
    index.land(one)
    index.land(two)
    index.stored("a", blocks(SHARED).keys[1], False)
    # Prefill done (its blocks stored): a later request does not contend with it.
    three = index.take_off("a", blocks([*SHARED, 43]))
    assert not three.contended
    # Nothing in common beyond what is held: no contention.
    four = index.take_off("a", blocks([1, 2, 3, 4, 9, 9, 9, 9]))
    assert not four.contended and not three.contended


# -- tiers: where each block lives on a daemon with a disk tier ----------------------------


def tiered(seq: int, kind: str, key: bytes, tier: str, logits: bool = False) -> CacheEventLine:
    return wire({**event(seq, kind, key, logits), "tier": tier})


def test_a_block_evicted_from_ram_that_the_disk_holds_becomes_a_disk_block() -> None:
    sync, _, index = make_sync()
    a, b, c = REQUEST.keys[:3]
    for seq, (kind, key, tier) in enumerate(
        [
            ("stored", a, "ram"),
            ("stored", b, "ram"),
            ("stored", c, "ram"),
            ("stored", a, "disk"),  # written behind
            ("stored", b, "disk"),
            ("evicted", a, "ram"),  # RAM let a go: still on disk
            ("evicted", c, "ram"),  # c never reached the disk: gone
        ],
        start=11,
    ):
        sync.apply(tiered(seq, kind, key, tier))
    assert index.tiers("a", a) == {"disk"} and index.tiers("a", b) == {"ram", "disk"}
    assert index.tiers("a", c) == frozenset()
    assert index.predict_tiers("a", REQUEST) == TierTokens(ram=4, disk=4)  # a from disk, b RAM
    sync.apply(tiered(18, "evicted", a, "disk"))  # the disk's own LRU let it go too
    assert index.predict_tiers("a", REQUEST) == TierTokens()
    sync.apply(tiered(19, "stored", a, "ram"))  # read back (or computed again)
    assert index.predict_tiers("a", REQUEST) == TierTokens(ram=8)


@pytest.mark.parametrize("shape", ["tiers", "older daemons: on_disk"])
def test_a_snapshot_says_which_ram_blocks_the_disk_holds_too(shape: str) -> None:
    """A snapshot lists every tier holding each block (`tiers`; daemons before it said
    the fastest tier and `on_disk`): a RAM eviction after the snapshot leaves a block the
    disk also holds on disk."""
    served: dict[str, object] = {}
    a, b, c = REQUEST.keys[:3]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/cache/snapshot":
            blocks_now: list[dict[str, object]] = [
                {"key": a.hex(), "tier": "ram", "tiers": ["ram", "disk"]},
                {"key": b.hex(), "tier": "ram", "tiers": ["ram"]},  # not written yet
                {"key": c.hex(), "tier": "disk", "tiers": ["disk"]},  # only the disk has it
            ]
            if shape != "tiers":
                for block in blocks_now:
                    held = block.pop("tiers")
                    block["on_disk"] = "disk" in held  # type: ignore[operator]

            return httpx.Response(
                200, json={"epoch": "e1", "seq": 7, "fingerprint": None, "blocks": blocks_now}
            )
        served["other"] = request.url.path
        return httpx.Response(404)

    async def scenario() -> BlockIndex:
        index = BlockIndex()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            backend = Backend(BackendSpec("a", "http://a"))

            async def no_layout(_: object) -> None:
                return None

            sync = BackendSync(backend, client, index, no_layout, SyncOptions())
            await sync._resync()
            assert backend.seq == 7
            sync.apply(tiered(8, "evicted", a, "ram"))
            sync.apply(tiered(9, "evicted", b, "ram"))
        return index

    index = asyncio.run(scenario())
    assert index.tiers("a", a) == {"disk"} and index.tiers("a", c) == {"disk"}
    assert index.tiers("a", b) == frozenset()  # RAM-only: gone
    assert index.predict_tiers("a", REQUEST) == TierTokens(disk=4)


def test_tokens_by_tier_follow_the_fastest_tier_of_each_block_in_the_run() -> None:
    index = BlockIndex()
    a, b, c, last = REQUEST.keys
    index.load_snapshot("a", [(a, False, {"ram", "disk"}), (b, False, {"disk"}), (c, False)])
    index.stored("a", last, True, "disk")
    hit = index.predict_tiers("a", REQUEST)
    assert hit == TierTokens(ram=8, disk=6) and hit.total == index.predict("a", REQUEST) == 14
    index.routed("plain", REQUEST)  # history estimates say nothing of tiers: RAM
    assert index.predict_tiers("plain", REQUEST) == TierTokens(ram=14)


def test_entries_with_tiers_stay_within_their_budgeted_bytes() -> None:
    """ENTRY_BYTES still holds with the tiers in each entry (packed in a small int)."""
    count = 20_000
    index = BlockIndex()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(count):
        key = bytes.fromhex(f"{i:032x}")  # as an event's key arrives
        index.stored("a", key, i % 2 == 0, "ram")
        if i % 3 == 0:
            index.stored("a", key, i % 2 == 0, "disk")
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert index.entries() == count
    assert used <= count * ENTRY_BYTES
