"""The cache index with fake payloads: no model, no mlx."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet_common.chunking import Chunk, chain_key, plan_chunks, root_key
from warmfleet_daemon.cache.prefix_cache import InsertOutcome, PrefixCache

ROOT = root_key("test-model")


def chunks_for(tokens: list[int], block: int = 4, cuts: tuple[int, ...] = ()) -> list[Chunk]:
    return plan_chunks(tokens, block_size=block, cuts=cuts, root=ROOT)


def store(cache: PrefixCache[str], chunks: list[Chunk], nbytes: int = 10) -> list[InsertOutcome]:
    out = []
    parent = None
    for c in chunks:
        out.append(cache.insert(c, parent, f"kv[{c.start}:{c.end}]", nbytes))
        parent = c.key
    return out


def test_match_returns_the_longest_stored_run_of_blocks() -> None:
    cache: PrefixCache[str] = PrefixCache(10_000)
    stored = chunks_for(list(range(1, 13)))  # 12 tokens: 3 blocks
    store(cache, stored)
    query = chunks_for([*range(1, 10), 99, 98, 97, 96])  # shares 9 tokens
    match = cache.match(query)
    assert match.payloads == ("kv[0:4]", "kv[4:8]")
    assert match.tokens == 8 and match.blocks == 2


def test_a_match_never_ends_inside_a_block() -> None:
    # 7 shared tokens, block 4: only the first block is reusable (strict-prefix rule).
    cache: PrefixCache[str] = PrefixCache(10_000)
    store(cache, chunks_for([1, 2, 3, 4, 5, 6, 7, 8]))
    assert cache.match(chunks_for([1, 2, 3, 4, 5, 6, 7, 0])).tokens == 4


def test_different_chunk_boundaries_do_not_match() -> None:
    # Same tokens, but a cut at 2 changes the plan: KV computed in other chunks differs.
    cache: PrefixCache[str] = PrefixCache(10_000)
    tokens = list(range(1, 12))
    store(cache, chunks_for(tokens))
    assert cache.match(chunks_for(tokens, cuts=(2,))).tokens == 0
    assert cache.match(chunks_for(tokens)).tokens == 11


def test_match_from_a_later_chunk() -> None:
    cache: PrefixCache[str] = PrefixCache(10_000)
    chunks = chunks_for(list(range(1, 13)))
    store(cache, chunks)
    more = cache.match(chunks, start=1)
    assert more.payloads == ("kv[4:8]", "kv[8:12]") and more.tokens == 12


def test_insert_requires_the_parent_block() -> None:
    cache: PrefixCache[str] = PrefixCache(10_000)
    c = chunks_for(list(range(1, 10)))
    assert cache.insert(c[1], c[0].key, "orphan", 1) is InsertOutcome.NO_PARENT
    assert cache.insert(c[0], None, "a", 1) is InsertOutcome.STORED
    assert cache.insert(c[0], None, "a", 1) is InsertOutcome.PRESENT
    assert cache.stats.entry_count == 1


def test_eviction_is_lru_over_leaves_in_exact_order() -> None:
    cache: PrefixCache[str] = PrefixCache(40)
    a = chunks_for([1, 2, 3, 4, 5, 6, 7, 8])  # blocks a0 -> a1
    b = chunks_for([7, 7, 7, 7])  # block b0
    store(cache, a)  # a0, a1 (20 bytes)
    store(cache, b)  # b0 (30 bytes)
    cache.match(a)  # a0, a1 become most recent: LRU order b0, a0, a1
    assert cache.keys_lru_order() == [b[0].key, a[0].key, a[1].key]
    c = chunks_for([5, 5, 5, 5])
    store(cache, c)  # 40 bytes: fits exactly, nothing evicted
    assert cache.stats.evictions == 0
    d = chunks_for([6, 6, 6, 6])
    store(cache, d)  # needs 10: evicts b0 (least recent leaf)
    assert b[0].key not in cache and a[0].key in cache
    e = chunks_for([4, 4, 4, 4])
    store(cache, e)  # next LRU is a0, but it has a child: evict leaf a1 instead
    assert a[1].key not in cache and a[0].key in cache
    f = chunks_for([3, 3, 3, 3])
    store(cache, f)  # now a0 is the least recent leaf
    assert a[0].key not in cache
    assert cache.stats.evictions == 3
    assert cache.stats.bytes <= 40


def test_pinned_blocks_are_never_evicted() -> None:
    cache: PrefixCache[str] = PrefixCache(30)
    warm = chunks_for([1, 2, 3, 4, 5, 6, 7, 8])
    store(cache, warm)
    assert cache.pin(c.key for c in warm)
    for i in range(10):
        store(cache, chunks_for([100 + i] * 4))
    assert all(c.key in cache for c in warm)
    assert cache.stats.pinned_count == 2 and cache.stats.pinned_bytes == 20
    cache.unpin(c.key for c in warm)
    store(cache, chunks_for([7] * 8))
    assert warm[1].key not in cache


def test_an_insert_that_cannot_fit_is_refused_not_overshot() -> None:
    cache: PrefixCache[str] = PrefixCache(25)
    warm = chunks_for([1, 2, 3, 4, 5, 6, 7, 8])
    store(cache, warm)
    cache.pin(c.key for c in warm)
    outcome = cache.insert(chunks_for([9] * 4)[0], None, "big", 6)
    assert outcome is InsertOutcome.OVER_BUDGET
    assert cache.stats.bytes == 20 and cache.stats.rejected_inserts == 1


def test_insert_never_evicts_its_own_parent() -> None:
    cache: PrefixCache[str] = PrefixCache(20)
    chain = chunks_for([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    assert store(cache, chain) == [
        InsertOutcome.STORED,
        InsertOutcome.STORED,
        InsertOutcome.OVER_BUDGET,  # would need to evict its parent or grandparent
    ]


def test_pin_is_all_or_nothing() -> None:
    cache: PrefixCache[str] = PrefixCache(100)
    chain = chunks_for(list(range(1, 10)))
    cache.insert(chain[0], None, "a", 10)
    assert not cache.pin([chain[0].key, chain[1].key])
    assert cache.stats.pinned_count == 0


def test_drop_removes_unreferenced_blocks_deepest_first() -> None:
    cache: PrefixCache[str] = PrefixCache(1000)
    warm = chunks_for([1, 2, 3, 4, 5, 6, 7, 8])
    longer = chunks_for([1, 2, 3, 4, 9, 9, 9, 9])  # shares block 0
    store(cache, warm)
    store(cache, longer)
    assert cache.drop([c.key for c in warm]) == 1  # block 0 still extended by `longer`
    assert warm[0].key in cache and warm[1].key not in cache


def test_clear_removes_everything_including_pins() -> None:
    cache: PrefixCache[str] = PrefixCache(1000)
    warm = chunks_for(list(range(1, 9)))
    store(cache, warm)
    cache.pin(c.key for c in warm)
    assert cache.clear() == 2
    s = cache.stats
    assert (s.entry_count, s.bytes, s.pinned_bytes, s.pinned_count) == (0, 0, 0, 0)
    assert cache.match(warm).tokens == 0


def test_counters_are_token_weighted() -> None:
    cache: PrefixCache[str] = PrefixCache(1000)
    cache.record_query(1000, 900)
    cache.record_query(10, 0)
    s = cache.stats
    assert (s.queried_tokens, s.hit_tokens, s.tokens_saved) == (1010, 900, 900)
    assert s.hit_rate == pytest.approx(900 / 1010)
    with pytest.raises(ValueError):
        cache.record_query(5, 6)


def test_keys_chain_every_boundary() -> None:
    tokens = [5, 6, 7, 8, 9]
    assert chain_key(ROOT, tokens[:2]) != chain_key(ROOT, tokens[:3])
    assert chunks_for(tokens)[0].key == chunks_for([*tokens[:4], 42])[0].key
    assert chunks_for(tokens)[1].key != chunks_for([*tokens[:4], 42])[1].key


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(0, 200),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "pin", "unpin", "match", "drop"]),
            st.lists(st.integers(1, 4), min_size=2, max_size=14),
            st.integers(1, 40),
        ),
        max_size=60,
    ),
)
def test_random_operations_keep_the_budget_and_chain_integrity(
    budget: int, ops: list[tuple[str, list[int], int]]
) -> None:
    cache: PrefixCache[str] = PrefixCache(budget)
    for op, tokens, nbytes in ops:
        chunks = chunks_for(tokens, block=3)
        if op == "insert":
            parent = None
            for c in chunks:
                if cache.insert(c, parent, "x", nbytes) not in (
                    InsertOutcome.STORED,
                    InsertOutcome.PRESENT,
                ):
                    break
                parent = c.key
        elif op == "pin":
            cache.pin(c.key for c in cache_prefix(cache, chunks))
        elif op == "unpin":
            cache.unpin(c.key for c in chunks)
        elif op == "match":
            cache.match(chunks)
        else:
            cache.drop([c.key for c in chunks])
        s = cache.stats
        assert 0 <= s.pinned_bytes <= s.bytes <= budget
        # every stored block's chain back to the root is stored too
        for c in chunks:
            if c.key not in cache:
                assert all(later.key not in cache for later in chunks[chunks.index(c) :])
                break


def cache_prefix(cache: PrefixCache[str], chunks: list[Chunk]) -> list[Chunk]:
    out = []
    for c in chunks:
        if c.key not in cache:
            break
        out.append(c)
    return out
