"""Warm without prefill, from a peer: blocks copied over real HTTP (a stdlib server
that replays the real route's bytes, so a test can cut it off mid-block). Copied
blocks decode like scratch; a peer that disappears mid-transfer leaves the blocks
verified so far and the rest is prefilled; a peer of another model gives nothing."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from support.engine import request, run
from support.kv import BLOCK, Peer, answer, from_scratch, prompts
from warmfleet_daemon.kvtransfer.transfer import KVTransfer


@pytest.fixture
def warm_peer(tiny, make_engine) -> Iterator[KVTransfer]:
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine)
    prefix, _ = prompts()
    run(engine, request(prefix.tokens, prefix.cuts, prefill_only=True, pin=True))
    yield transfer
    transfer.stop()


def test_blocks_copied_from_a_peer_decode_like_scratch(warm_peer, tiny, make_engine) -> None:
    peer = Peer(warm_peer)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, warm_from=[peer.url])
    prefix, full = prompts()
    restored = transfer.restorer.restore(prefix)
    assert (restored.from_peers, restored.tokens) == (len(engine.plan(prefix)), len(prefix.tokens))
    computed_before = engine.stats().prefill_tokens_total
    tokens, cached = answer(engine, full)
    assert cached == len(prefix.tokens)
    assert engine.stats().prefill_tokens_total - computed_before == len(full.tokens) - cached
    assert tokens == from_scratch(engine, full)
    peer.close()
    transfer.stop()


def test_a_peer_that_disappears_mid_transfer(warm_peer, tiny, make_engine, caplog) -> None:
    peer = Peer(warm_peer, cut_after=2)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, warm_from=[peer.url])
    prefix, full = prompts()
    with caplog.at_level(logging.WARNING):
        restored = transfer.restorer.restore(prefix)
    assert restored.from_peers == 2  # the whole blocks before the cut, verified
    stopped = [r.getMessage() for r in caplog.records if "stopped" in r.getMessage()]
    assert len(stopped) == 1 and peer.url in stopped[0]
    chunks = engine.plan(prefix)
    assert [c.key in engine.cache for c in chunks] == [True, True] + [False] * (len(chunks) - 2)
    tokens, cached = answer(engine, full)
    assert cached == chunks[1].end
    assert tokens == from_scratch(engine, full)
    peer.close()
    transfer.stop()


def test_a_peer_with_another_fingerprint_gives_nothing(warm_peer, tiny, make_engine, caplog):
    peer = Peer(warm_peer, fingerprint="0" * 32)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, warm_from=[peer.url])
    with caplog.at_level(logging.WARNING):
        restored = transfer.restorer.restore(prompts()[0])
    assert restored.from_peers == 0
    assert peer.requests == ["/v1/cache/fingerprint"]  # no block was asked for
    assert any("another model or configuration" in r.getMessage() for r in caplog.records)
    peer.close()
    transfer.stop()


def test_an_unreachable_peer_gives_nothing(tiny, make_engine, caplog) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nobody listens once closed
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, warm_from=[url])
    with caplog.at_level(logging.WARNING):
        assert transfer.restorer.restore(prompts()[0]).from_peers == 0
    assert any(url in r.getMessage() for r in caplog.records)
    transfer.stop()
