"""The prefill scheduler's order: shortest remaining first, aged by the wait. A small
simulation of the engine's picks (one chunk of block_size tokens per pick)."""

from __future__ import annotations

from collections.abc import Callable

from warmfleet_daemon.engine import prefill_order as po
from warmfleet_daemon.settings import DaemonSettings

Arrivals = Callable[[int], list[tuple[str, int]]]


def simulate(
    block: int,
    first: list[tuple[str, int]],
    arrivals: Arrivals,
    picks: int,
    aging: bool = True,
    rate: int = 4,  # aging_picks: exact orders below are for 4; the default is checked too
) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """(the name chosen at each pick, the pick each prompt finished at, when each came)."""
    jobs: list[list] = []  # name, remaining, waited, arrival
    order: list[str] = []
    done: dict[str, int] = {}
    came: dict[str, int] = {}
    for name, tokens in first:
        jobs.append([name, tokens, 0, len(came)])
        came[name] = 0
    for p in range(picks):
        for name, tokens in arrivals(p):
            jobs.append([name, tokens, 0, len(came)])
            came[name] = p
        if not jobs:
            break
        cands = [po.Candidate(j[1], j[2] if aging else 0, j[3]) for j in jobs]
        chosen = jobs[po.pick(cands, block, rate)]
        order.append(chosen[0])
        chosen[1] -= min(block, chosen[1])
        for j in jobs:
            if j is not chosen:
                j[2] += 1
        if chosen[1] == 0:
            done[chosen[0]] = p
            jobs.remove(chosen)
    return order, done, came


def test_prompts_of_equal_age_go_shortest_first() -> None:
    order, _, _ = simulate(100, [("a", 300), ("b", 50), ("c", 120)], lambda p: [], 10)
    assert order == ["b", "c", "c", "a", "a", "a"]


def test_a_short_prompt_overtakes_a_long_one_that_started_first() -> None:
    # The no-head-of-line-blocking result: a long prompt has had 3 chunks; a short one
    # arriving now is prefilled next, whole.
    order, _, _ = simulate(128, [("long", 1600)], lambda p: [("short", 150)] if p == 3 else [], 20)
    assert order[:6] == ["long", "long", "long", "short", "short", "long"]


def test_under_overload_a_long_prompt_is_served_in_bounded_time() -> None:
    # A fresh 150-token prompt every other pick saturates the prefill (2 chunks each).
    def shorts(p: int) -> list[tuple[str, int]]:
        return [(f"s{p}", 150)] if p % 2 == 0 else []

    order, done, came = simulate(128, [("long", 2400)], shorts, 200, aging=False)
    assert "long" not in order  # without aging it starves for good

    order, done, came = simulate(128, [("long", 2400)], shorts, 200)
    bound = 2400 / 128 * 4  # the documented bound on its first chunk
    assert order.index("long") == 72 and order.index("long") <= bound
    assert done["long"] == 90  # once it is served, its 19 chunks run back to back
    waits = [done[n] - came[n] for n in done if n != "long"]
    assert max(waits) <= 19 + 2  # a short prompt waits at most for the aged one's chunks
    before = [done[n] - came[n] for n in done if n != "long" and came[n] < 70]
    assert set(before) == {1}  # before the long one ages, shorts go straight through


def test_at_the_default_rate_a_long_prompt_is_served_within_the_bound() -> None:
    def shorts(p: int) -> list[tuple[str, int]]:
        return [(f"s{p}", 150)] if p % 2 == 0 else []

    bound = 2400 / 128 * po.AGING_PICKS
    order, done, _ = simulate(128, [("long", 2400)], shorts, int(bound) + 40, rate=po.AGING_PICKS)
    assert order.index("long") <= bound and "long" in done


def test_the_daemons_default_rate_is_the_engines() -> None:
    assert DaemonSettings.model_fields["prefill_aging_picks"].default == po.AGING_PICKS


def test_the_next_chunk_goes_to_the_tenant_served_longest_ago() -> None:
    assert po.next_tenant(["a", "b"], {"a": 7, "b": 3}) == "b"
    assert po.next_tenant(["a", "b"], {"a": 3, "b": 7}) == "a"
    # Not served since it arrived: first, whatever the others' order.
    assert po.next_tenant(["a", "b", "c"], {"a": 1, "b": 2}) == "c"
    # Neither served yet: the one whose prompt came first.
    assert po.next_tenant(["b", "a"], {}) == "b"
