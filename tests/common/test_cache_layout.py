"""The layout document: its costs travel with it but stay out of its fingerprint."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warmfleet_common.cache_layout import CacheLayout, fingerprint_of
from warmfleet_common.tiers import TierCosts

FIELDS = {
    "model": "m",
    "root": "00",
    "block_size": 4,
    "chat_template_kwargs": {},
    "custom_renderer": False,
    "tokenizer_files": {},
}
COSTS = TierCosts(
    prefill_us_per_token=100.0,
    hit_us_per_token={"ram": 1.0, "disk": 5.0 + 1.0},
    kv_bytes_per_token=4096,
)


def test_costs_round_trip_and_stay_out_of_the_fingerprint() -> None:
    fingerprint = fingerprint_of(**FIELDS)  # type: ignore[arg-type]
    layout = CacheLayout(fingerprint=fingerprint, costs=COSTS, **FIELDS)  # type: ignore[arg-type]
    again = CacheLayout.model_validate_json(layout.model_dump_json())
    assert again.costs == COSTS and again.fingerprint == fingerprint


def test_an_older_daemons_layout_has_no_costs() -> None:
    layout = CacheLayout.model_validate({"fingerprint": "f", **FIELDS})
    assert layout.costs is None


def test_no_disk_tier_leaves_disk_unpriced_and_negative_costs_are_refused() -> None:
    costs = TierCosts.model_validate(
        {
            "prefill_us_per_token": 1.0,
            "hit_us_per_token": {"ram": 0.1},
            "kv_bytes_per_token": 8,
        }
    )
    assert "disk" not in costs.hit_us_per_token
    with pytest.raises(ValidationError):
        TierCosts.model_validate({**costs.model_dump(), "prefill_us_per_token": -1.0})
