"""Prefixes kept by Anthropic's cache_control: pinned for their TTL, renewed by use,
within the pin budget, forgotten with a cache clear (plain Python: fake payloads)."""

from __future__ import annotations

from warmfleet_common.chunking import plan_chunks, root_key
from warmfleet_daemon.cache.prefix_cache import PrefixCache
from warmfleet_daemon.warming.pins import TimedPins


def stored(cache: PrefixCache[str], tokens: list[int]) -> list[bytes]:
    chunks = plan_chunks(tokens, block_size=4, root=root_key("m"))
    parent = None
    for chunk in chunks:
        cache.insert(chunk, parent, "kv", 100)
        parent = chunk.key
    return [c.key for c in chunks]


def test_a_hold_lasts_its_ttl_and_each_use_renews_it() -> None:
    now = [0.0]
    cache: PrefixCache[str] = PrefixCache(10_000)
    pins = TimedPins(cache, lambda: 10_000, clock=lambda: now[0])
    keys = stored(cache, list(range(12)))
    assert pins.hold(keys, 300)
    assert cache.stats.pinned_bytes == 300 and pins.held() == 1
    now[0] = 200.0
    assert pins.hold(keys, 300)  # renewed until 500
    now[0] = 400.0
    assert pins.held() == 1 and cache.stats.pinned_bytes == 300
    now[0] = 501.0
    assert pins.held() == 0 and cache.stats.pinned_bytes == 0


def test_the_pin_budget_holds_and_a_clear_forgets_everything() -> None:
    cache: PrefixCache[str] = PrefixCache(10_000)
    pins = TimedPins(cache, lambda: 250)
    keys = stored(cache, list(range(12)))
    assert not pins.hold(keys, 300)  # 300 bytes > the 250 allowed
    assert pins.hold(keys[:2], 300)
    assert not pins.hold([b"missing"], 300)
    cache.clear()
    assert pins.held() == 0
    again = stored(cache, list(range(12)))
    cache.pin(again[:1])  # e.g. a warm set's pin: a stale hold must never undo it
    assert pins.held() == 0 and cache.stats.pinned_bytes == 100
