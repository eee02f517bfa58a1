"""The pieces the policies are composed of, one by one, and a policy composed of new
pieces: filters narrow, scorers rank (ties to the next scorer), pickers pick."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import get_args

import pytest

from warmfleet_common.tiers import TierTokens
from warmfleet_router import cli
from warmfleet_router.errors import routing_error
from warmfleet_router.policy import (
    POLICIES,
    REGISTRY,
    AffinityHash,
    BestPicker,
    BoundedLoad,
    CachedTokens,
    Candidate,
    LeastLoad,
    ModelNotFound,
    NoBackendReady,
    Pieces,
    Policy,
    PolicyName,
    Ready,
    RingPicker,
    RoundRobin,
    RoutingRequest,
    ServesModel,
    SessionPin,
    TenantShare,
    TieHash,
    admit,
    build,
    policy_table,
    registry,
    rendezvous,
)

REQUEST = RoutingRequest()


def names(candidates: Sequence[Candidate]) -> list[str]:
    return [c.name for c in candidates]


def test_ready_keeps_the_backends_that_take_requests() -> None:
    fleet = [Candidate("a", 0, ready=False), Candidate("b", 0)]
    assert names(Ready()(fleet, REQUEST)) == ["b"]


def test_serves_model_prefers_those_that_said_so_then_those_that_did_not_say() -> None:
    fleet = [
        Candidate("llama", 0, models=frozenset({"llama-3", "default"})),
        Candidate("opaque", 0),
        Candidate("qwen", 0, models=frozenset({"qwen-2"})),
    ]
    serves = ServesModel()
    assert names(serves(fleet, RoutingRequest(model="default"))) == ["llama"]
    assert names(serves(fleet, RoutingRequest(model="mistral"))) == ["opaque"]
    assert names(serves(fleet, RoutingRequest())) == ["llama", "opaque", "qwen"]  # no model


def test_serves_model_says_why_nothing_is_left() -> None:
    down = Candidate("qwen", 0, ready=False, models=frozenset({"qwen-2"}))
    up = Candidate("llama", 0, models=frozenset({"llama-3"}))
    request = RoutingRequest(model="qwen-2", fleet=[down, up])
    with pytest.raises(NoBackendReady) as refused:
        admit([down, up], request)
    assert str(refused.value) == "no backend serving `qwen-2` is ready"
    with pytest.raises(ModelNotFound) as missing:
        admit([down, up], RoutingRequest(model="gpt-9", fleet=[down, up]))
    assert str(missing.value) == "The model `gpt-9` does not exist."
    with pytest.raises(NoBackendReady) as none:
        admit([down], RoutingRequest(model="gpt-9", fleet=[down]))
    assert str(none.value) == "no backend is ready"


def test_domain_errors_become_http_answers_at_the_http_layer() -> None:
    missing = routing_error(ModelNotFound("gpt-9"))
    assert missing.status_code == 404
    assert missing.body == (
        b'{"error":{"message":"The model `gpt-9` does not exist.","type":"not_found_error",'
        b'"param":"model","code":"model_not_found"}}'
    )
    down = routing_error(NoBackendReady())
    assert down.status_code == 503 and b'"code":"no_backend"' in down.body


def test_bounded_load_never_empties_the_candidates() -> None:
    fleet = [Candidate("a", 9), Candidate("b", 0), Candidate("c", 1)]
    assert names(BoundedLoad(0.0)(fleet, REQUEST)) == ["b", "c"]
    assert names(BoundedLoad(10.0)(fleet, REQUEST)) == ["a", "b", "c"]
    assert BoundedLoad(0.25)([], REQUEST) == []


def test_tenant_share_narrows_only_a_tenant_over_its_share_to_the_least_shared() -> None:
    fleet = [Candidate("a", 3, other_tenants=1), Candidate("b", 0), Candidate("c", 1)]
    share = TenantShare()
    over = RoutingRequest(over_share=True)
    assert names(share(fleet, REQUEST)) == ["a", "b", "c"]  # under its share: anywhere
    assert names(share(fleet, over)) == ["b", "c"]
    everyone = [Candidate("a", 0, other_tenants=2), Candidate("b", 0, other_tenants=1)]
    assert names(share(everyone, over)) == ["b"]  # none free: the least shared
    assert share([], over) == []


def test_a_tenant_over_its_share_leaves_the_other_tenants_backend_to_it() -> None:
    # `steady`'s session is on a (its cache, its pin); `burst` is over its share and its
    # best-cached backend is a too: it goes to the best of the others instead.
    fleet = [
        Candidate("a", 1, TierTokens(ram=900), other_tenants=1),
        Candidate("b", 2, TierTokens(ram=100)),
        Candidate("c", 2),
    ]
    burst = build("prefix").decide(fleet, RoutingRequest(over_share=True))
    assert (burst.backend, burst.reason) == ("b", "load-spill")
    assert build("prefix").decide(fleet, REQUEST).backend == "a"  # under its share


def test_session_pin_narrows_to_the_sessions_backend_only_when_it_is_there() -> None:
    fleet = [Candidate("a", 0), Candidate("b", 0)]
    pin = SessionPin()
    assert names(pin(fleet, RoutingRequest(session_backend="b"))) == ["b"]
    assert names(pin(fleet, RoutingRequest(session_backend="gone"))) == ["a", "b"]
    assert names(pin(fleet, REQUEST)) == ["a", "b"]


def test_scorers() -> None:
    fleet = [Candidate("a", 3, TierTokens(ram=100)), Candidate("b", 1)]
    assert CachedTokens().scores(fleet, REQUEST) == [100, 0]
    assert LeastLoad().scores(fleet, REQUEST) == [-3, -1]
    key = RoutingRequest(tie_key=b"k", affinity="user-1")
    assert TieHash().scores(fleet, key) == [rendezvous(b"k", "a"), rendezvous(b"k", "b")]
    assert AffinityHash().scores(fleet, key) == [
        rendezvous(b"user-1", "a"),
        rendezvous(b"user-1", "b"),
    ]
    assert AffinityHash().scores(fleet, REQUEST) == [0, 0]  # no key: no preference
    three = [Candidate("c", 0), Candidate("a", 0), Candidate("b", 0)]
    assert RoundRobin().scores(three, RoutingRequest(turn=1)) == [-1, -2, 0]  # b, c, a


def test_later_scorers_break_the_ties_of_earlier_ones() -> None:
    policy = Policy("test", (CachedTokens(), LeastLoad()))
    fleet = [
        Candidate("a", 2, TierTokens(ram=64)),
        Candidate("b", 1, TierTokens(ram=64)),
        Candidate("c", 0),
    ]
    assert names(policy.rank(fleet, REQUEST)) == ["b", "a", "c"]
    # Full ties keep the candidates' order: deterministic.
    assert names(Policy("test", (LeastLoad(),)).rank(fleet[::-1], REQUEST)) == ["c", "b", "a"]


def test_best_picker_orders_fallbacks_by_how_many_filters_they_passed() -> None:
    ranked = [Candidate(n, 0) for n in "abcd"]
    stages = [ranked, ranked[1:], ranked[2:3]]  # a failed the first, b the second filter
    pick, rest = BestPicker()(ranked, stages)
    assert (pick.name, names(rest)) == ("c", ["b", "d", "a"])


def test_ring_picker_walks_the_ring_past_what_the_filters_refused() -> None:
    ranked = [Candidate(n, 0) for n in "abcd"]
    pick, rest = RingPicker()(ranked, [ranked, ranked[2:]])
    assert (pick.name, names(rest)) == ("c", ["a", "b", "d"])


def test_the_first_scorer_names_the_decision() -> None:
    fleet = [Candidate("a", 0, TierTokens(ram=64)), Candidate("b", 0)]
    assert build("prefix").decide(fleet, REQUEST).reason == "prefix"
    cold = [Candidate("a", 0), Candidate("b", 0)]
    assert build("prefix").decide(cold, REQUEST).reason == "fallback"
    assert build("least-load").decide(cold, REQUEST).reason == "least-load"
    assert build("round-robin").decide(cold, REQUEST).reason == "round-robin"
    assert build("session").decide(cold, REQUEST).reason == "fallback"  # no session key
    assert build("session").decide(cold, RoutingRequest(affinity="u")).reason == "session"


class FewestTokens:
    """A scorer written for this test: what a new routing idea looks like."""

    label = "fewest tokens"
    reason = "fallback"
    needs_cache = False

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        return [-len(c.name) for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return True


def test_a_new_piece_composes_without_touching_the_others() -> None:
    policy = Policy("short-names", (FewestTokens(), TieHash()), (BoundedLoad(0.0),))
    fleet = [Candidate("long-name", 0), Candidate("mid", 0), Candidate("x", 5)]
    decision = policy.decide(fleet, REQUEST)
    assert decision.backend == "mid" and decision.reason == "load-spill"  # x is full
    assert decision.fallbacks == ("long-name", "x")
    assert not policy.needs_cache and build("prefix").needs_cache


def test_one_registry_names_the_policies() -> None:
    assert set(get_args(PolicyName)) == set(REGISTRY) and tuple(REGISTRY) == POLICIES
    assert all(build(name).name == name for name in POLICIES)
    with pytest.raises(ValueError, match="unknown policy"):
        build("fastest")  # type: ignore[arg-type]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "policy")
    assert list(choices or ()) == list(REGISTRY)  # `warmfleet router --policy`


def test_the_documented_policy_table_is_the_registrys() -> None:
    assert policy_table() in (registry.__doc__ or "")
    assert build("prefix").describe() == Pieces(
        ("tenant share", "bounded load", "session pin"),
        ("time saved", "load", "faster tier", "request hash"),
        "best",
    )
