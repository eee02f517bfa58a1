"""Warm without prefill, from a peer: blocks copied over real HTTP (a stdlib server
that replays the real route's bytes, so a test can cut it off mid-block). Copied
blocks decode like scratch; a peer that disappears mid-transfer leaves the blocks
verified so far and the rest is prefilled; a peer of another model gives nothing; a peer
that never finishes a response is abandoned at a byte cap or the warm-up's deadline."""

from __future__ import annotations

import logging
import struct
import time
from urllib.parse import urlparse

import pytest

from support.kv import BLOCK, Peer, answer, from_scratch, prompts, unreachable_url
from support.processes import HandlerServer, QuietHandler
from warmfleet_daemon.kvtransfer.transfer import KVTransfer


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
    url = unreachable_url()
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, warm_from=[url])
    with caplog.at_level(logging.WARNING):
        assert transfer.restorer.restore(prompts()[0]).from_peers == 0
    assert any(url in r.getMessage() for r in caplog.records)
    transfer.stop()


class HostilePeer(HandlerServer):
    """A peer that never finishes: an endless `/v1/cache/fingerprint`, a
    `/v1/cache/blocks` trickled a byte at a time, or an endless error body there."""

    OFFERED = 256 << 20  # what an endless body sends at most (so a failing test ends)

    def __init__(self, transfer: KVTransfer, mode: str) -> None:
        self.sent = 0
        peer = self

        class Handler(QuietHandler):  # HTTP/1.0: a body ends when the socket does
            def do_GET(self) -> None:
                fingerprint = urlparse(self.path).path == "/v1/cache/fingerprint"
                if fingerprint and mode != "endless-fingerprint":
                    self.send_json(transfer.status())
                    return
                self.send_response(500 if mode == "endless-error-body" else 200)
                self.end_headers()
                piece, pause = (b"x", 0.05) if mode == "trickled-blocks" else (b"a" * 65536, 0.0)
                if mode == "endless-fingerprint":
                    self.wfile.write(b'{"fingerprint": "')
                elif mode == "trickled-blocks":
                    self.wfile.write(struct.pack(">Q", 1 << 20))  # a 1 MiB block, byte by byte
                try:
                    while peer.sent < HostilePeer.OFFERED:
                        self.wfile.write(piece)
                        self.wfile.flush()
                        peer.sent += len(piece)
                        time.sleep(pause)
                except OSError:  # the client went away
                    pass

        super().__init__(Handler)


@pytest.mark.timeout(60)  # a trickle used to keep the copy going for ever
@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        (
            "endless-fingerprint",
            "abandoned (the rest is prefilled): GET /v1/cache/fingerprint sent more than "
            "65536 bytes",
        ),
        ("trickled-blocks", "abandoned (the rest is prefilled): the warm-up's deadline"),
        ("endless-error-body", "stopped: GET /v1/cache/blocks answered 500: aaaa"),
    ],
)
def test_a_peer_that_never_finishes_is_abandoned_and_the_prompt_prefilled(
    warm_peer, tiny, make_engine, caplog, mode, logged
) -> None:
    peer = HostilePeer(warm_peer, mode)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine, warm_from=[peer.url], peer_deadline_s=2.0)
    prefix, full = prompts()
    with caplog.at_level(logging.WARNING):
        restored = transfer.restorer.restore(prefix)
    assert restored.from_peers == 0
    lines = [r.getMessage() for r in caplog.records if peer.url in r.getMessage()]
    assert len(lines) == 1 and logged in lines[0], lines
    assert peer.sent < HostilePeer.OFFERED  # the daemon stopped reading
    tokens, cached = answer(engine, full)
    assert cached == 0
    assert tokens == from_scratch(engine, full)
    peer.close()
    transfer.stop()
