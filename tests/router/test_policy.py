"""Routing policies and bounded load with fake backends: exact choices."""

from __future__ import annotations

import pytest

from warmfleet_router.policy import Candidate, capacity, choose, eligible, rendezvous


def fleet(*loads: int, cached: tuple[int, ...] = ()) -> list[Candidate]:
    cached = cached or (0,) * len(loads)
    return [Candidate(f"d{i}", load, c) for i, (load, c) in enumerate(zip(loads, cached))]


def test_capacity_is_ceil_of_one_plus_epsilon_times_the_mean_with_this_request() -> None:
    assert capacity(0, 4, 0.25) == 1  # ceil(1.25 * 1 / 4)
    assert capacity(7, 4, 0.25) == 3  # ceil(1.25 * 8 / 4) = ceil(2.5)
    assert capacity(11, 4, 0.25) == 4  # ceil(1.25 * 12 / 4) = ceil(3.75)
    assert capacity(7, 4, 0.0) == 2


def test_the_least_loaded_backend_always_fits() -> None:
    for loads in [(0, 0, 0), (5, 0, 9), (3, 3, 3), (1, 2, 3, 4, 100), (0,)]:
        candidates = fleet(*loads)
        fits = eligible(candidates, 0.0)
        assert min(candidates, key=lambda c: c.in_flight) in fits


def test_prefix_picks_the_most_cached_tokens() -> None:
    d = choose("prefix", fleet(1, 1, 1, cached=(0, 640, 128)))
    assert (d.backend, d.reason, d.predicted) == ("d1", "prefix", 640)
    assert d.fallbacks == ("d2", "d0")  # next best by cached tokens


def test_prefix_ties_go_to_the_less_loaded() -> None:
    d = choose("prefix", fleet(2, 1, 2, cached=(512, 512, 0)), epsilon=1.0)
    assert (d.backend, d.reason) == ("d1", "prefix")


def test_bounded_load_spills_to_the_next_best_backend() -> None:
    # Mean in-flight with this request: 8/4 = 2, cap ceil(1.25 * 2) = 3: d0 (3) is full.
    d = choose("prefix", fleet(3, 2, 1, 1, cached=(900, 300, 100, 0)))
    assert (d.backend, d.reason, d.predicted) == ("d1", "load-spill", 300)
    # With more headroom the cached backend takes it.
    d = choose("prefix", fleet(3, 2, 1, 1, cached=(900, 300, 100, 0)), epsilon=1.0)
    assert (d.backend, d.reason) == ("d0", "prefix")


def test_nothing_cached_anywhere_falls_back_to_the_least_loaded() -> None:
    d = choose("prefix", fleet(2, 0, 1))
    assert (d.backend, d.reason, d.predicted) == ("d1", "fallback", 0)


def test_equal_candidates_are_spread_by_a_rendezvous_hash_of_the_request() -> None:
    picks = {choose("prefix", fleet(0, 0, 0), tie_key=bytes([i])).backend for i in range(32)}
    assert picks == {"d0", "d1", "d2"}
    key = b"some-request"
    expected = max(["d0", "d1", "d2"], key=lambda n: rendezvous(key, n))
    assert choose("prefix", fleet(0, 0, 0), tie_key=key).backend == expected


def test_a_session_stays_on_its_backend_while_it_fits() -> None:
    d = choose("prefix", fleet(1, 1, 1, cached=(0, 0, 900)), affinity="s1", session_backend="d0")
    assert (d.backend, d.reason) == ("d0", "session")


def test_an_overloaded_session_backend_spills() -> None:
    d = choose("prefix", fleet(4, 0, 0, cached=(900, 100, 0)), affinity="s1", session_backend="d0")
    assert (d.backend, d.reason) == ("d1", "load-spill")


def test_a_session_whose_backend_is_gone_is_placed_by_prefix() -> None:
    d = choose("prefix", fleet(0, 0, cached=(0, 64)), affinity="s1", session_backend="gone")
    assert (d.backend, d.reason) == ("d1", "prefix")


def test_round_robin_cycles_in_name_order() -> None:
    picks = [choose("round-robin", fleet(5, 0, 0), turn=t).backend for t in range(6)]
    assert picks == ["d0", "d1", "d2", "d0", "d1", "d2"]


def test_least_load_ignores_the_cache() -> None:
    d = choose("least-load", fleet(2, 1, 3, cached=(900, 0, 900)))
    assert (d.backend, d.reason) == ("d1", "least-load")


def test_session_policy_hashes_the_affinity_key_with_bounded_load() -> None:
    names = ["d0", "d1", "d2"]
    first = max(names, key=lambda n: rendezvous(b"user-42", n))
    d = choose("session", fleet(0, 0, 0), affinity="user-42")
    assert (d.backend, d.reason) == (first, "session")
    loads = tuple(5 if n == first else 0 for n in names)
    d = choose("session", fleet(*loads), affinity="user-42")
    assert d.backend != first and d.reason == "load-spill"
    d = choose("session", fleet(1, 0, 1))
    assert (d.backend, d.reason) == ("d1", "fallback")


def test_no_candidates_is_an_error() -> None:
    with pytest.raises(ValueError):
        choose("prefix", [])
