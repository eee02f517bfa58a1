"""The disk tier's index without a model or a disk: runs that continue a RAM match,
exact eviction orders (least recently used leaves first), the budget."""

from __future__ import annotations

from warmfleet_common.chunking import Chunk, plan_chunks, root_key
from warmfleet_daemon.kvtransfer.disk_index import DiskEntry, DiskIndex

ROOT = root_key("test")


def chain(tokens: list[int], size: int = 4) -> list[Chunk]:
    return plan_chunks(tokens, block_size=size, root=ROOT)


def entries(chunks: list[Chunk], nbytes: int = 10) -> list[DiskEntry]:
    out = []
    for i, c in enumerate(chunks):
        out.append(DiskEntry(c.key, chunks[i - 1].key if i else None, c.start, c.end, nbytes))
    return out


def test_a_run_continues_where_ram_stopped() -> None:
    chunks = chain(list(range(20)))  # 5 blocks
    index = DiskIndex(1000)
    for entry in entries(chunks)[2:4]:
        assert index.add(entry) == (True, [])
    assert index.run(chunks, 0) == 0
    assert index.run(chunks, 2) == 2
    assert index.run(chunks, 3) == 1
    assert index.run(chunks, 4) == 0
    other = chain([*range(12), 99, 98, 97, 96])  # the same first three blocks
    assert index.run(other, 2) == 1


def test_eviction_takes_least_recently_used_leaves_first() -> None:
    a = entries(chain(list(range(12))))  # a0 <- a1 <- a2
    b = entries(chain(list(range(100, 108))))  # b0 <- b1
    index = DiskIndex(50)
    for entry in [*a, *b]:
        assert index.add(entry) == (True, [])
    assert index.stats.bytes == 50
    # The LRU block is a0, but a1 extends it; the LRU leaf is a2.
    c = entries(chain(list(range(200, 204))))[0]
    fits, evicted = index.add(c)
    assert fits and [e.key for e in evicted] == [a[2].key]
    index.touch([a[0].key, a[1].key])  # read back: most recently used now
    d = entries(chain(list(range(300, 304))))[0]
    fits, evicted = index.add(d)
    assert fits and [e.key for e in evicted] == [b[1].key]  # b0 is older, but b1 extends it
    assert index.keys_lru_order() == [b[0].key, c.key, a[0].key, a[1].key, d.key]
    stats = index.stats
    assert (stats.blocks, stats.bytes, stats.evictions, stats.evicted_bytes) == (5, 50, 2, 20)


def test_a_block_never_evicts_its_own_parent() -> None:
    a = entries(chain(list(range(8))), nbytes=30)  # a0 <- a1: 60 bytes
    index = DiskIndex(50)
    assert index.add(a[0]) == (True, [])
    fits, evicted = index.add(a[1])  # only a0 could make room, and a1 needs it
    assert not fits and evicted == [] and a[1].key not in index and a[0].key in index


def test_blocks_larger_than_the_budget_are_refused_and_present_ones_refreshed() -> None:
    a = entries(chain(list(range(8))))
    index = DiskIndex(15)
    assert index.add(DiskEntry(b"x" * 16, None, 0, 4, 16)) == (False, [])
    assert index.add(a[0]) == (True, [])
    assert index.add(a[0]) == (True, [])
    assert len(index) == 1 and index.stats.bytes == 10


def test_remove_frees_a_parent_for_eviction_and_clear_empties() -> None:
    a = entries(chain(list(range(8))))
    index = DiskIndex(100)
    index.add(a[0])
    index.add(a[1])
    assert index.remove(a[1].key) == a[1]
    fits, evicted = index.add(DiskEntry(b"y" * 16, None, 0, 4, 95))
    assert fits and [e.key for e in evicted] == [a[0].key]  # a leaf again
    assert [e.nbytes for e in index.clear()] == [95] and index.stats.bytes == 0
