"""Which tenants use which backends (`tenant_share`): who is over its share of the fleet
and how many other tenants each backend has, as requests start and end and the window
passes; with a fake clock."""

from __future__ import annotations

from warmfleet_router.tenant_share import TenantShare


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_is_over_its_share_at_the_fleets_backends_per_active_tenant() -> None:
    share = TenantShare(60.0, Clock())
    for _ in range(3):
        share.started("burst", "a")
    assert not share.over_share("burst", 4)  # alone on the fleet: the whole fleet is its
    share.started("steady", "b")
    assert not share.over_share("burst", 8)  # 3 in flight, 4 backends each
    share.started("burst", "c")
    assert share.over_share("burst", 8)  # 4 in flight: its share
    assert not share.over_share("steady", 8)
    assert not share.over_share(None, 8)  # no key, no tenant: never counted


def test_a_backend_is_another_tenants_while_it_is_in_flight_there_and_for_the_window() -> None:
    clock = Clock()
    share = TenantShare(60.0, clock)
    share.started("steady", "a")
    share.started("burst", "b")
    assert share.others("burst", ["a", "b", "c"]) == {"a": 1, "b": 0, "c": 0}
    assert share.others("steady", ["a", "b", "c"]) == {"a": 0, "b": 1, "c": 0}
    share.finished("steady", "a")
    clock.now += 59
    assert share.others("burst", ["a", "b"]) == {"a": 1, "b": 0}  # steady's, for a minute
    assert share.over_share("burst", 2)  # steady is still active: two tenants
    clock.now += 2
    assert share.others("burst", ["a", "b"]) == {"a": 0, "b": 0}
    assert not share.over_share("burst", 2)  # steady is gone: burst alone


def test_off_counts_nothing_and_an_end_not_started_is_ignored() -> None:
    off = TenantShare(0.0, Clock())
    off.started("burst", "a")
    off.started("steady", "b")
    assert not off.over_share("burst", 1) and off.others("burst", ["b"]) == {}
    share = TenantShare(60.0, Clock())
    share.finished("steady", "a")  # started before the count began: no negative counts
    share.started("burst", "a")
    assert share.others("burst", ["a"]) == {"a": 0}
    assert not share.over_share("burst", 1)


def test_a_backend_with_nothing_in_flight_keeps_no_counter() -> None:
    share = TenantShare(60.0, Clock())
    share.started("burst", "gone")
    share.finished("burst", "gone")
    assert "gone" not in share._in_flight
