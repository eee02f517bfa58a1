"""The tier table every component shares: tokens per tier, what another server's
`cached_tokens_by_tier` is trusted to say, and what a hit in each tier saves. The set of
tiers is open: any well-formed name is a tier (a daemon's registry may add one)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warmfleet_common.tiers import (
    FASTEST,
    MAX_TIERS,
    NO_TOKENS,
    TIERS,
    TierCosts,
    TierTokens,
    is_tier,
    tier_label,
)

MALFORMED = ["GPU", "", "9lives", "x" * 33, "a b", "ram\n", "nvme_1"]


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


def test_tier_tokens_count_a_tier_no_list_names_after_the_built_in_ones() -> None:
    tokens = TierTokens({"vault": 8, "ram": 4})
    assert list(tokens) == [*TIERS, "vault"] and tokens.total == 12
    assert tokens.as_dict() == {"ram": 4, "disk": 0, "peer": 0, "vault": 8}
    assert tokens.plus("vault", 2)["vault"] == 10 and tokens.plus("nvme", 1)["nvme"] == 1
    assert tokens["nvme"] == 0 and "nvme" not in tokens  # counted none: reads as 0
    assert TierTokens(vault=0) == NO_TOKENS and hash(TierTokens(vault=0)) == hash(NO_TOKENS)
    assert TierTokens(vault=8, ram=4) == tokens  # by content, not order
    for name in MALFORMED:
        with pytest.raises(KeyError):
            tokens[name]
        with pytest.raises(ValueError, match="not a cache tier name"):
            TierTokens({name: 1})


def test_a_tier_is_a_bounded_name_and_metrics_label_only_the_built_in_ones() -> None:
    assert all(is_tier(t) for t in [*TIERS, "vault", "cxl-pool", "a", "a" * 32])
    assert not any(is_tier(t) for t in [*MALFORMED, None, 3])
    assert [tier_label(t) for t in [*TIERS, "vault", "nvme"]] == [*TIERS, "other", "other"]


def test_parse_takes_tiers_that_add_up() -> None:
    assert TierTokens.parse({"ram": 64, "disk": 32}) == TierTokens(ram=64, disk=32)
    vault = TierTokens.parse({"ram": 64, "vault": 32}, total=96)  # a tier only its daemon has
    assert vault == TierTokens({"ram": 64, "vault": 32})
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
        {"ram": 64, "disk": 32, "GPU": 0},  # not a tier name
        {"ram": 64, "disk": 32, "x" * 33: 0},
        {"ram": 64, "disk": 32, 7: 0},
        {"ram": 96, **{f"t{i}": 0 for i in range(MAX_TIERS)}},  # more tiers than any daemon
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
    vault = TierCosts.model_validate(
        {**COSTS.model_dump(), "hit_us_per_token": {"ram": 2.0, "vault": 12.0}}
    )
    assert vault.saving_share("vault") == pytest.approx(0.88)  # any tier its daemon priced
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
    [
        {"ram": -1.0},
        {"disk": 5.0},
        {"ram": 1.0, "GPU": 1.0},
        {"ram": float("nan")},
        {"ram": 1.0, **{f"t{i}": 1.0 for i in range(MAX_TIERS)}},
    ],
)
def test_costs_refuse_negative_malformed_or_missing_fastest_tier(hits: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        TierCosts.model_validate(
            {"prefill_us_per_token": 1.0, "hit_us_per_token": hits, "kv_bytes_per_token": 8}
        )
