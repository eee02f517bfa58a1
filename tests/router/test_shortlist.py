"""The shortlist (`warmfleet_router.shortlist`): what the policy scores at fleet scale.

A fleet no larger than a group's sample is scored whole, so the decision is the one the
policy makes over every backend; past it, each group of alike backends (the same run of
the request's blocks) is sampled, the longest runs and the session's backend always
among them."""

from __future__ import annotations

import random

import pytest

from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.index import BlockIndex
from warmfleet_router.keys import RequestBlocks
from warmfleet_router.planning import scored
from warmfleet_router.policy import RoutingRequest, build
from warmfleet_router.shortlist import PER_GROUP, fleet_view, shortlist

BLOCK = 16


def key(*parts: int) -> bytes:
    return b"".join(p.to_bytes(4, "big") for p in parts).ljust(16, b"\0")


def blocks(keys: list[bytes]) -> RequestBlocks:
    ends = tuple(BLOCK * (i + 1) for i in range(len(keys)))
    return RequestBlocks(tuple(keys), ends, ends[-1] + 3)


def fleet(size: int, seed: int) -> tuple[BlockIndex, list[Backend], RequestBlocks]:
    """Backends holding random runs of one request's blocks (by events), random loads."""
    rng = random.Random(seed)
    request = blocks([key(0, i) for i in range(12)])
    index = BlockIndex()
    backends = []
    for i in range(size):
        name = f"node-{i}"
        run = rng.choice([0, 0, 4, 4, 4, 9, 12])
        index.load_snapshot(name, [(k, False) for k in request.keys[:run]])
        backends.append(
            Backend(
                BackendSpec(name, f"http://{name}"),
                health="ready",
                fingerprint="f",
                index_mode="following",
                in_flight=rng.randint(0, 3),
            )
        )
    return index, backends, request


@pytest.mark.parametrize("seed", range(40))
def test_a_fleet_within_one_sample_is_decided_as_over_every_backend(seed: int) -> None:
    index, backends, request = fleet(random.Random(seed).randint(1, PER_GROUP), seed)
    policy = build("prefix")
    view = fleet_view(backends, index, {b.name: "f" for b in backends})
    short = shortlist(view, index, {"f": request}, view.admitted(None), b"tie")
    assert [b.name for b in short.backends] == [b.name for b in backends]
    every = index.predict_fleet({b.name: request for b in backends})
    whole = [scored(b, every[b.name].hit) for b in backends]
    sampled = [scored(b, short.predictions[b.name].hit) for b in short.backends]
    asked = RoutingRequest(tie_key=b"tie")
    assert policy.decide(sampled, asked) == policy.decide(whole, asked)


def test_a_large_fleet_scores_a_sample_of_each_group_and_keeps_the_longest_run() -> None:
    request = blocks([key(0, i) for i in range(12)])
    index = BlockIndex()
    backends = [
        Backend(BackendSpec(f"node-{i}", f"http://node-{i}"), health="ready", fingerprint="f")
        for i in range(100)
    ]
    for b in backends:  # everyone holds the warm head: 4 blocks
        index.load_snapshot(b.name, [(k, False) for k in request.keys[:4]])
    index.load_snapshot("node-57", [(k, False) for k in request.keys[:9]])  # its session
    view = fleet_view(backends, index, {b.name: "f" for b in backends})
    short = shortlist(view, index, {"f": request}, view.admitted(None), b"one", "node-93")
    names = [b.name for b in short.backends]
    assert "node-57" in names and "node-93" in names
    assert len(names) == 1 + PER_GROUP  # the long run, and a sample of the warm head's group
    assert short.predictions["node-57"].hit.total == 9 * BLOCK
    assert short.predictions["node-93"].hit.total == 4 * BLOCK
    again = shortlist(view, index, {"f": request}, view.admitted(None), b"one", "node-93")
    assert [b.name for b in again.backends] == names  # the same request, the same sample
    others = {
        tuple(
            b.name for b in shortlist(view, index, {"f": request}, view.admitted(None), t).backends
        )
        for t in (b"two", b"three", b"four", b"five")
    }
    assert len(others) > 1  # other requests, other samples of the equal backends
    decision = build("prefix").decide(
        [scored(b, short.predictions[b.name].hit) for b in short.backends],
        RoutingRequest(tie_key=b"one"),
    )
    assert decision.backend == "node-57"
    assert short.holders["node-57"] == 9 * BLOCK  # a peer copy may come from it


def test_the_view_follows_a_backend_going_down() -> None:
    index, backends, _ = fleet(3, 0)
    view = fleet_view(backends, index, {b.name: "f" for b in backends})
    before = Backend.revision
    backends[1].set_health("down", "gone")
    assert Backend.revision != before  # what the planner rebuilds its view on
    after = Backend.revision
    backends[0].set_health("ready")  # unchanged: no rebuild
    assert Backend.revision == after
    view = fleet_view(backends, index, {b.name: "f" for b in backends})
    assert [b.name for b in view.admitted(None)[0]] == ["node-0", "node-2"]


def test_a_sample_is_bounded_by_the_fleets_mean_load() -> None:
    from warmfleet_router.policy import Candidate, eligible

    sample = [Candidate("a", 3), Candidate("b", 1), Candidate("c", 2)]
    # Its own mean (2) lets b and c take one more; the fleet's (150 on 100 backends) only b.
    assert [c.name for c in eligible(sample, 0.25)] == ["b", "c"]
    assert [c.name for c in eligible(sample, 0.25, (150, 100))] == ["b"]
    # None of the sample fits the fleet's bound: its least loaded, never nothing.
    assert [c.name for c in eligible(sample, 0.0, (0, 100))] == ["b"]
