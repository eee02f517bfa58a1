"""The prefix cache's change log with fake payloads: sequence numbers follow the cache's
own order, a snapshot lines up with them, and a subscriber whose events are gone (or
from the future) is told to resync."""

from __future__ import annotations

import asyncio

from warmfleet_common.chunking import Chunk, plan_chunks, root_key
from warmfleet_daemon.cache.events import CacheEventLog
from warmfleet_daemon.cache.prefix_cache import PrefixCache

ROOT = root_key("test-model")


def chunks_for(tokens: list[int], block: int = 4) -> list[Chunk]:
    return plan_chunks(tokens, block_size=block, root=ROOT)


def logged(budget: int = 10_000, buffer: int = 1000) -> tuple[PrefixCache[str], CacheEventLog[str]]:
    cache: PrefixCache[str] = PrefixCache(budget)
    # A fake payload "has logits" when it says so.
    log: CacheEventLog[str] = CacheEventLog(lambda p: p.endswith("+logits"), buffer=buffer)
    cache.listeners.append(log.record)
    return cache, log


def store(cache: PrefixCache[str], chunks: list[Chunk], nbytes: int = 10) -> None:
    parent = None
    for i, c in enumerate(chunks):
        payload = f"kv{c.end}" + ("+logits" if i == len(chunks) - 1 else "")
        cache.insert(c, parent, payload, nbytes)
        parent = c.key


def replay(log: CacheEventLog[str], after: int = 0) -> list[dict[str, object]]:
    found = log.subscribe(after, asyncio.new_event_loop())
    assert found is not None
    backlog, subscription = found
    log.unsubscribe(subscription)
    return [e.as_wire().model_dump() for e in backlog]


def test_stores_evictions_and_clears_are_numbered_in_cache_order() -> None:
    cache, log = logged(budget=30)  # room for three 10-byte blocks
    a = chunks_for(list(range(1, 9)))  # two blocks
    store(cache, a)
    b = chunks_for([50, 51, 52, 53])  # a third: fits
    store(cache, b)
    c = chunks_for([60, 61, 62, 63])  # a fourth: evicts the LRU leaf (a's second block)
    store(cache, c)
    events = replay(log)
    assert [(e["seq"], e["type"]) for e in events] == [
        (1, "stored"),
        (2, "stored"),
        (3, "stored"),
        (4, "evicted"),
        (5, "stored"),
    ]
    assert events[0]["key"] == a[0].key.hex() and events[0]["parent"] is None
    assert events[1]["parent"] == a[0].key.hex() and events[1]["logits"] is True
    assert events[0]["logits"] is False
    assert events[3]["key"] == a[1].key.hex()
    assert (events[1]["start"], events[1]["end"]) == (4, 8)
    cache.clear()
    assert replay(log, after=5) == [{"seq": 6, "type": "cleared"}]
    assert log.seq == 6


def test_a_snapshot_is_current_at_the_sequence_number_read_with_it() -> None:
    cache, log = logged()
    store(cache, chunks_for(list(range(1, 13))))
    cache.pin(c.key for c in chunks_for(list(range(1, 13)))[:1])
    blocks, seq = cache.snapshot(lambda: log.seq)
    assert seq == 3
    assert [(b.start, b.end, b.pinned) for b in blocks] == [
        (0, 4, True),
        (4, 8, False),
        (8, 12, False),
    ]
    assert blocks[1].parent == blocks[0].key
    listed = log.block_wire(blocks[2])
    assert listed.logits is True and listed.pinned is False


def test_a_subscriber_whose_events_are_gone_or_from_the_future_must_resync() -> None:
    cache, log = logged(buffer=4)
    store(cache, chunks_for(list(range(1, 25))))  # six blocks: six events, four kept
    loop = asyncio.new_event_loop()
    assert log.subscribe(1, loop) is None  # event 2 is gone
    assert log.subscribe(7, loop) is None  # never happened (another epoch's number)
    found = log.subscribe(2, loop)
    assert found is not None
    assert [e.seq for e in found[0]] == [3, 4, 5, 6]
    log.unsubscribe(found[1])
    found = log.subscribe(6, loop)  # up to date: nothing to replay, live from here
    assert found is not None and found[0] == []


def test_live_subscribers_get_every_event_after_their_backlog() -> None:
    async def scenario() -> list[int]:
        cache, log = logged()
        store(cache, chunks_for([1, 2, 3, 4]))
        found = log.subscribe(0, asyncio.get_running_loop())
        assert found is not None
        backlog, subscription = found
        # Stored from another thread, as the engine does.
        await asyncio.to_thread(store, cache, chunks_for([9, 9, 9, 9, 8, 8, 8, 8]))
        seqs = [e.seq for e in backlog]
        while len(seqs) < 3:
            event = await asyncio.wait_for(subscription.queue.get(), 5)
            assert event is not None
            seqs.append(event.seq)
        log.unsubscribe(subscription)
        return seqs

    assert asyncio.run(scenario()) == [1, 2, 3]


def test_stored_events_and_snapshots_say_where_a_blocks_kv_came_from() -> None:
    cache, log = logged()
    a, b, c = chunks_for(list(range(1, 13)))
    cache.insert(a, None, "kv4", 10)  # computed here
    cache.insert(b, a.key, "kv8", 10, source="peer")
    cache.insert(c, b.key, "kv12", 10, source="disk")
    assert [e["source"] for e in replay(log)] == ["prefill", "peer", "disk"]
    blocks, _ = cache.snapshot(lambda: None)
    assert [log.block_wire(v).source for v in blocks] == ["prefill", "peer", "disk"]
    cache.clear()
    assert "source" not in replay(log, after=3)[0]  # only a stored block has one


def test_a_stopping_daemon_ends_every_stream() -> None:
    """The daemon's stop ends each subscriber's stream (a stream waiting for events held
    the server's stop for its whole graceful timeout)."""

    async def scenario() -> tuple[object, bool]:
        _, log = logged()
        found = log.subscribe(0, asyncio.get_running_loop())
        assert found is not None
        _, subscription = found
        log.end_streams()
        return await asyncio.wait_for(subscription.queue.get(), 5), subscription.ended

    assert asyncio.run(scenario()) == (None, True)
