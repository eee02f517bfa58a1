"""The tier table every component shares: tokens per tier, what another server's
`cached_tokens_by_tier` is trusted to say, and what a hit in each tier saves."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warmfleet_common.tiers import FASTEST, NO_TOKENS, TIERS, TierCosts, TierTokens


def test_tiers_are_listed_fastest_first() -> None:
    assert TIERS == ("ram", "disk", "peer") and FASTEST == "ram"


def test_tier_tokens_hold_every_tier_in_order_and_compare_by_content() -> None:
    tokens = TierTokens(ram=32, disk=16)
    assert list(tokens) == list(TIERS) and len(tokens) == len(TIERS)
    assert tokens["peer"] == 0 and tokens.total == 48
    assert tokens == TierTokens({"ram": 32, "disk": 16, "peer": 0})
    assert hash(tokens) == hash(TierTokens({"disk": 16, "ram": 32}))
    assert tokens != TierTokens(ram=32) and NO_TOKENS.total == 0
    assert tokens.as_dict() == {"ram": 32, "disk": 16, "peer": 0}
    assert tokens.plus("peer", 8) == TierTokens(ram=32, disk=16, peer=8)
    assert tokens == TierTokens(ram=32, disk=16)  # plus() made a new table
    assert repr(tokens) == "TierTokens(ram=32, disk=16, peer=0)"
    with pytest.raises(KeyError):
        tokens["gpu"]  # type: ignore[index]
    with pytest.raises(ValueError, match="gpu"):
        TierTokens(gpu=1)


def test_parse_takes_known_tiers_that_add_up() -> None:
    assert TierTokens.parse({"ram": 64, "disk": 32}) == TierTokens(ram=64, disk=32)
    assert TierTokens.parse({"ram": 64, "disk": 32}, total=96) == TierTokens(ram=64, disk=32)
    spilled = {"ram": 32, "disk": 32, "peer": 32}
    assert TierTokens.parse(spilled, total=96) == TierTokens(ram=32, disk=32, peer=32)


@pytest.mark.parametrize(
    "document",
    [
        None,
        [],
        {},
        "ram",
        {"ram": 64, "disk": 0},  # does not add up to 96
        {"ram": 64, "disk": -32},
        {"ram": "64", "disk": 32},
        {"ram": 64.0, "disk": 32},
        {"ram": True, "disk": 95},
        {"ram": 64, "disk": 32, "gpu": 0},  # a tier this reader does not know
    ],
)
def test_parse_refuses_what_it_cannot_trust(document: object) -> None:
    assert TierTokens.parse(document, total=96) is None


# A RAM hit costs a restore (2 us a token), a disk hit a read then a restore (20 + 2).
COSTS = TierCosts(
    prefill_us_per_token=100.0,
    hit_us_per_token={"ram": 2.0, "disk": 22.0},
    kv_bytes_per_token=4096,
)


def test_saving_share_is_what_a_hit_saves_of_a_prefill_and_nothing_where_unpriced() -> None:
    assert COSTS.saving_share("ram") == pytest.approx(0.98)
    assert COSTS.saving_share("disk") == pytest.approx(0.78)
    assert COSTS.saving_share("peer") == 0.0  # not priced: saves nothing
    slow = COSTS.model_copy(update={"hit_us_per_token": {"ram": 2.0, "disk": 150.0}})
    assert slow.saving_share("disk") == pytest.approx(-0.5)  # worse than a prefill
    free = COSTS.model_copy(update={"prefill_us_per_token": 0.0})
    assert free.saving_share("ram") < 0  # a zero prefill divides by a tiny number, not zero


def test_costs_read_an_older_daemons_fields() -> None:
    old = {
        "prefill_us_per_token": 100.0,
        "ram_restore_us_per_token": 2.0,
        "disk_read_us_per_token": 20.0,
        "kv_bytes_per_token": 4096,
    }
    assert TierCosts.model_validate(old) == COSTS  # disk: the read, then the restore
    no_disk = TierCosts.model_validate({**old, "disk_read_us_per_token": None})
    assert no_disk.hit_us_per_token == {"ram": 2.0} and no_disk.saving_share("disk") == 0.0
    assert TierCosts.model_validate_json(COSTS.model_dump_json()) == COSTS


@pytest.mark.parametrize(
    "hits",
    [{"ram": -1.0}, {"disk": 5.0}, {"ram": 1.0, "gpu": 1.0}, {"ram": float("nan")}],
)
def test_costs_refuse_negative_unknown_or_missing_fastest_tier(hits: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        TierCosts.model_validate(
            {"prefill_us_per_token": 1.0, "hit_us_per_token": hits, "kv_bytes_per_token": 8}
        )
