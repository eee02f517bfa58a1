"""Routing policies and bounded load with fake backends: exact choices."""

from __future__ import annotations

import pytest

from warmfleet_common.tiers import TierCosts, TierTokens
from warmfleet_router.policy import (
    Candidate,
    bands,
    capacity,
    choose,
    eligible,
    rendezvous,
)


def fleet(*loads: int, cached: tuple[int, ...] = ()) -> list[Candidate]:
    cached = cached or (0,) * len(loads)
    return [
        Candidate(f"d{i}", load, TierTokens(ram=c))
        for i, (load, c) in enumerate(zip(loads, cached))
    ]


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


# -- tiers: the prefill time a backend's cache would save --------------------------------

# Per token: a RAM hit saves 99 us, a disk hit 69 us (read 30 + restore 1).
MAC = TierCosts(
    prefill_us_per_token=100.0,
    hit_us_per_token={"ram": 1.0, "disk": 30.0 + 1.0},
    kv_bytes_per_token=46080,
)


def disk_read(us: float) -> dict[str, object]:
    """MAC's costs with a disk read of `us` per token (then a restore, as from RAM)."""
    return {"hit_us_per_token": {"ram": 1.0, "disk": us + 1.0}}


def tiered(name: str, load: int, ram: int = 0, disk: int = 0, **costs: object) -> Candidate:
    """A backend with MAC's costs (some replaced) and a predicted hit by tier."""
    hit = TierTokens(ram=ram, disk=disk)
    return Candidate(name, load, hit, costs=MAC.model_copy(update=costs))


def test_a_ram_hit_beats_a_disk_hit_beats_a_miss() -> None:
    backends = [tiered("miss", 1), tiered("disk", 1, disk=640), tiered("ram", 1, ram=640)]
    d = choose("prefix", backends)
    assert (d.backend, d.reason, d.predicted) == ("ram", "prefix", 640)
    assert d.fallbacks == ("disk", "miss")
    d = choose("prefix", backends[:2])
    assert (d.backend, d.reason, d.predicted) == ("disk", "prefix", 640)


def test_time_saved_not_tokens_decides() -> None:
    # 640 tokens in RAM save 640 x 99 us; 800 on disk save 800 x 69 us: less.
    d = choose("prefix", [tiered("disk", 0, disk=800), tiered("ram", 0, ram=640)])
    assert (d.backend, d.predicted) == ("ram", 640)
    # 400 in RAM and 400 on disk beat 400 in RAM alone.
    d = choose("prefix", [tiered("ram", 0, ram=400), tiered("both", 0, ram=400, disk=400)])
    assert (d.backend, d.predicted) == ("both", 800)
    # A slow disk (its read costs more than a prefill) loses to a miss.
    slow = tiered("slow-disk", 0, disk=640, **disk_read(150.0))
    d = choose("prefix", [slow, tiered("miss", 0)])
    assert (d.backend, d.reason) == ("miss", "fallback")


def test_the_load_filter_still_wins_over_a_ram_hit() -> None:
    # Mean in-flight with this request: 8/4 = 2, cap ceil(1.25 x 2) = 3: "ram" (3) is full.
    backends = [
        tiered("ram", 3, ram=900),
        tiered("disk", 2, disk=900),
        tiered("small", 1, ram=100),
        tiered("miss", 1),
    ]
    d = choose("prefix", backends)
    assert (d.backend, d.reason, d.predicted) == ("disk", "load-spill", 900)
    assert d.fallbacks == ("small", "miss", "ram")
    assert choose("prefix", backends, epsilon=1.0).backend == "ram"


def test_savings_within_a_fifth_are_equal_and_load_decides_then_the_faster_tier() -> None:
    # Equal machines whose measured costs differ by noise, the same prefix in RAM.
    noisy = [
        tiered("a", 2, ram=512, prefill_us_per_token=104.0),
        tiered("b", 1, ram=512, prefill_us_per_token=97.0),
    ]
    d = choose("prefix", noisy, epsilon=1.0)
    assert (d.backend, d.reason) == ("b", "prefix")  # the less loaded, not the "slower"
    picks = {
        choose("prefix", [tiered(n, 0, ram=512, prefill_us_per_token=p) for n, p in
                          (("a", 104.0), ("b", 97.0), ("c", 100.0))],
               tie_key=bytes([i])).backend
        for i in range(32)
    }  # fmt: skip
    assert picks == {"a", "b", "c"}  # equal work is spread, as with no costs at all
    # A disk read that costs little (a fast SSD): RAM and disk hits save about as much.
    ssd = disk_read(5.0)
    pair = [tiered("disk", 0, disk=640, **ssd), tiered("ram", 1, ram=640, **ssd)]
    assert choose("prefix", pair, epsilon=1.0).backend == "disk"  # less loaded
    pair = [tiered("disk", 1, disk=640, **ssd), tiered("ram", 1, ram=640, **ssd)]
    assert choose("prefix", pair, epsilon=1.0).backend == "ram"  # equal load: RAM


def test_bands_open_at_the_best_value_left() -> None:
    assert bands([100, 95, 89, 85, 0, -5], 0.1) == [0, 0, -1, -1, -2, -3]
    assert bands([], 0.1) == [] and bands([0, 0], 0.1) == [0, 0]


def test_backends_without_costs_score_as_ram_hits_at_the_fleets_typical_saving() -> None:
    old = Candidate("old", 0, TierTokens(ram=640))  # an older daemon: no costs, no tiers
    d = choose("prefix", [old, tiered("disk", 0, disk=640)])
    assert d.backend == "old"  # 640 x 99 us (the median RAM saving) beats 640 x 69 us
    d = choose("prefix", [old, tiered("ram", 0, ram=900)])
    assert d.backend == "ram"
    # None has costs: tokens, exactly, as before tiers.
    a, b = Candidate("a", 0, TierTokens(ram=300)), Candidate("b", 0, TierTokens(disk=301))
    d = choose("prefix", [a, b])
    assert (d.backend, d.predicted) == ("b", 301)


def test_a_disk_hit_on_a_backend_that_cannot_read_its_disk_saves_nothing() -> None:
    # Costs without a disk read (no disk tier at start) and disk tokens: priced at zero.
    blind = tiered("blind", 0, disk=640, hit_us_per_token={"ram": 1.0})
    d = choose("prefix", [blind, tiered("small", 0, ram=32)])
    assert d.backend == "small"
