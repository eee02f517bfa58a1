"""The router's table of hot sessions (plain data): the block chain of each session's
last request and where it was served, most recent first per backend, within a count and
a byte budget; and the pull body a handoff sends (the chain's keys and spans)."""

from __future__ import annotations

from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.handoff import HotSessions, pull_body
from warmfleet_router.keys import EMPTY, RequestBlocks


def blocks(n: int, seed: int = 0) -> RequestBlocks:
    keys = tuple(bytes([seed, i]) * 8 for i in range(n))
    return RequestBlocks(keys, tuple(32 * (i + 1) for i in range(n)), 32 * n)


def test_sessions_on_a_backend_most_recent_first() -> None:
    hot = HotSessions()
    hot.served("a", "m1", blocks(3, 1))
    hot.served("b", "m2", blocks(3, 2))
    hot.served("c", "m1", blocks(3, 3))
    hot.served("a", "m1", blocks(4, 1))  # a's next turn
    assert [s.key for s in hot.on("m1", 10)] == ["a", "c"]
    assert [s.key for s in hot.on("m1", 1)] == ["a"]
    assert hot.on("m1", 1)[0].blocks == blocks(4, 1)
    hot.moved("a", "m2")
    assert [s.key for s in hot.on("m2", 10)] == ["a", "b"]
    hot.served("d", "m1", EMPTY)  # nothing keyed: nothing to hand off
    assert len(hot) == 3


def test_the_table_keeps_to_its_count_and_byte_budget() -> None:
    hot = HotSessions(max_sessions=2)
    for key in "abc":
        hot.served(key, "m", blocks(2))
    assert [s.key for s in hot.on("m", 10)] == ["c", "b"]
    small = HotSessions(budget_bytes=1000)
    for key in "abcdef":
        small.served(key, "m", blocks(8))
    assert 0 < len(small) < 6 and small.on("m", 1)[0].key == "f"


def test_the_pull_body_is_the_chain() -> None:
    peer = Backend(BackendSpec("m1", "http://m1:8000", "t"))
    body = pull_body(peer, blocks(3, 7), 5.0)
    assert body.peer == "http://m1:8000" and body.deadline_s == 5.0
    assert [(b.start, b.end) for b in body.blocks] == [(0, 32), (32, 64), (64, 96)]
    assert body.blocks[1].key == (bytes([7, 1]) * 8).hex()
