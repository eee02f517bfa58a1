"""Spill: a request naming a peer copies the blocks this engine lacks from it (over real
HTTP, the warm-up tests' peer) instead of prefilling them, in chain order; the answer is
token-for-token the one computed from scratch, also when the peer goes away mid-copy or
cannot be reached (the rest is prefilled). In `auto`, the copy happens only when the
estimate says it is faster."""

from __future__ import annotations

import logging

import pytest

from support.engine import request, run, tokens_of
from support.kv import BLOCK, Peer, answer, attached, from_scratch, prompts, unreachable_url
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_common.tiers import TierCosts
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import Usage
from warmfleet_daemon.kvtransfer.spill import copy_is_faster
from warmfleet_daemon.kvtransfer.transfer import KVTransfer


def spilled(engine: Engine, prompt: RenderedPrompt, peer: str) -> tuple[list[int], Usage]:
    events = run(engine, request(prompt.tokens, prompt.cuts, peer=peer))[0]
    usage = events[-1].usage
    assert usage is not None
    return tokens_of(events), usage


def test_a_spilled_prompt_copies_the_peers_blocks_and_answers_as_from_scratch(
    warm_peer, tiny, make_engine
) -> None:
    peer = Peer(warm_peer)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = attached(KVTransfer(engine, spill="always"))
    prefix, full = prompts()
    computed_before = engine.stats().prefill_tokens_total
    tokens, usage = spilled(engine, full, peer.url)
    assert usage.cached["peer"] == usage.cached_tokens == len(prefix.tokens)  # what the peer holds
    assert engine.stats().prefill_tokens_total - computed_before == len(full.tokens) - len(
        prefix.tokens
    )
    assert tokens == from_scratch(engine, full)
    stats = transfer.spill.stats()
    assert (stats.copies, stats.blocks, stats.tokens) == (1, len(engine.plan(prefix)), 90)
    assert stats.bytes > 0 and peer.url in stats.peers
    assert (stats.short, stats.failed) == (1, 0)  # the peer lacks only the new question
    peer.close()
    transfer.stop()


def test_a_peer_that_disappears_mid_copy_leaves_the_rest_to_prefill(
    warm_peer, tiny, make_engine, caplog
) -> None:
    peer = Peer(warm_peer, cut_after=2)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = attached(KVTransfer(engine, spill="always"))
    _, full = prompts()
    with caplog.at_level(logging.WARNING):
        tokens, usage = spilled(engine, full, peer.url)
    chunks = engine.plan(full)
    assert usage.cached["peer"] == usage.cached_tokens == chunks[1].end  # the blocks before the cut
    assert any("stopped" in r.getMessage() and peer.url in r.getMessage() for r in caplog.records)
    assert tokens == from_scratch(engine, full)
    assert (transfer.spill.stats().short, transfer.spill.stats().failed) == (0, 1)
    peer.close()
    transfer.stop()


def test_an_unreachable_peer_means_prefill(tiny, make_engine) -> None:
    url = unreachable_url()
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = attached(KVTransfer(engine, spill="always"))
    _, full = prompts()
    tokens, usage = spilled(engine, full, url)
    assert usage.cached["peer"] == usage.cached_tokens == 0
    assert tokens == from_scratch(engine, full)
    transfer.stop()


def test_auto_copies_only_when_the_estimate_says_faster(warm_peer, tiny, make_engine) -> None:
    peer = Peer(warm_peer)
    engine = make_engine(tiny, block_size=BLOCK)
    costs = costs_of(0.001, 1.0, 1)
    transfer = attached(KVTransfer(engine, spill="auto", costs=costs))
    _, full = prompts()
    tokens, usage = spilled(engine, full, peer.url)
    assert usage.cached["peer"] == 0 and peer.requests == []  # prefill was cheaper: not asked
    assert transfer.spill.stats().declined == 1
    assert tokens == from_scratch(engine, full)
    transfer.stop()
    costs = costs_of(5000.0, 1.0, 1)
    transfer = attached(KVTransfer(engine, spill="auto", costs=costs))
    tokens, usage = spilled(engine, full, peer.url)
    assert usage.cached["peer"] == 90
    assert tokens == from_scratch(engine, full)
    peer.close()
    transfer.stop()


def costs_of(prefill_us: float, restore_us: float, kv_bytes: int) -> TierCosts:
    return TierCosts(
        prefill_us_per_token=prefill_us,
        hit_us_per_token={"ram": restore_us},
        kv_bytes_per_token=kv_bytes,
    )


def test_the_estimate() -> None:
    costs = costs_of(4000.0, 20.0, 92160)
    # 4,096 tokens at 50 MB/s: 7.5 s of transfer against 16.4 s of prefill.
    fast = copy_is_faster(4096, 32, costs, 50e6, 0.005)
    assert fast.faster and fast.copy_s == pytest.approx(0.005 * 3 + 4096 * 92160 / 50e6 + 0.08192)
    assert not copy_is_faster(4096, 32, costs, 10e6, 0.005).faster  # a slow link: prefill


def test_a_pulled_chain_serves_the_session_as_from_scratch(warm_peer, tiny, make_engine) -> None:
    """A drain handoff: the chain of a session's blocks, named by key, copied ahead of
    its next request; a second pull finds them held and copies nothing."""
    peer = Peer(warm_peer)
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine)
    prefix, full = prompts()
    chunks = engine.plan(prefix)
    result = transfer.pull(peer.url, chunks, 10.0)
    assert (result.copied_blocks, result.copied_tokens, result.complete) == (len(chunks), 90, True)
    assert transfer.pull(peer.url, chunks, 10.0).present_blocks == len(chunks)
    tokens, cached = answer(engine, full)
    assert cached == 90
    assert tokens == from_scratch(engine, full)
    cut = Peer(warm_peer, cut_after=3)
    engine.clear_prefix_cache()
    partial = transfer.pull(cut.url, chunks, 10.0)
    assert (partial.copied_blocks, partial.complete) == (3, False)
    peer.close()
    cut.close()
    transfer.stop()
