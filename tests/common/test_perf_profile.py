"""Performance profiles: the schema, the arithmetic the simulated engine charges with, how
a profile is found by name or path, and the built-in profiles themselves."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from warmfleet_common.perf_profile import (
    FORMAT,
    PerfProfile,
    ProfileError,
    RatePoint,
    builtin_profiles,
    dump_profile,
    load_profile,
    parse_profile,
    pooled,
)


def _document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "format": FORMAT,
        "name": "test-mac",
        "machine": "a test machine",
        "model": "a test model",
        "source": "measured by the test",
        "context_length": 32768,
        "block_size": 512,
        "kv_bytes_per_token": 1000,
        "logits_bytes": 400,
        "memory_budget_bytes": 1 << 30,
        "prefill": [
            {"at": 1000, "tokens_per_s": 1000.0},
            {"at": 3000, "tokens_per_s": 500.0},
        ],
        "decode": [{"at": 1, "tokens_per_s": 100.0}, {"at": 4, "tokens_per_s": 40.0}],
        "decode_reference_context": 1000,
        "decode_by_context": [
            {"at": 1000, "tokens_per_s": 100.0},
            {"at": 9000, "tokens_per_s": 50.0},
        ],
        "restore": {"ram": 100_000.0, "disk": 10_000.0},
    }
    document.update(changes)
    return document


def _profile(**changes: Any) -> PerfProfile:
    return parse_profile(json.dumps(_document(**changes)))


# -- prefill -----------------------------------------------------------------------------


def test_prefill_is_interpolated_linearly_at_the_chunks_middle() -> None:
    profile = _profile()
    # [1500, 2500) has its middle at 2000, halfway between 1000 (1000/s) and 3000 (500/s).
    assert profile.prefill_seconds(1500, 2500) == pytest.approx(1000 / 750)
    # [1000, 1500): middle 1250, an eighth of the way: 937.5/s.
    assert profile.prefill_seconds(1000, 1500) == pytest.approx(500 / 937.5)


def test_prefill_is_held_at_the_nearest_point_outside_the_measured_range() -> None:
    profile = _profile()
    assert profile.prefill_seconds(0, 512) == pytest.approx(512 / 1000)  # before the first
    assert profile.prefill_seconds(20_000, 20_512) == pytest.approx(512 / 500)  # past the last


def test_prefill_of_nothing_costs_nothing() -> None:
    profile = _profile()
    assert profile.prefill_seconds(700, 700) == 0.0
    assert profile.prefill_seconds(900, 700) == 0.0


def test_a_cached_prefix_makes_the_uncached_tail_cost_what_it_costs_at_its_depth() -> None:
    profile = _profile()
    whole = profile.prefill_seconds(0, 4000)
    tail = profile.prefill_seconds(3000, 4000)
    assert tail == pytest.approx(1000 / 500)
    assert tail < whole


def test_a_single_prefill_point_is_one_rate_at_every_depth() -> None:
    profile = _profile(prefill=[{"at": 16_000, "tokens_per_s": 250.0}])
    for start in (0, 8_000, 100_000):
        assert profile.prefill_seconds(start, start + 500) == pytest.approx(2.0)


# -- decode ------------------------------------------------------------------------------


def test_decode_is_interpolated_between_batch_sizes() -> None:
    profile = _profile(decode_by_context=[])
    assert profile.decode_step_seconds(1, 1000) == pytest.approx(1 / 100)
    assert profile.decode_step_seconds(4, 1000) == pytest.approx(1 / 40)
    # batch 2: a third of the way from 100/s to 40/s per sequence.
    assert profile.decode_step_seconds(2, 1000) == pytest.approx(1 / 80)


def test_decode_past_the_widest_batch_keeps_the_batchs_total_rate() -> None:
    profile = _profile(decode_by_context=[])
    total_at_widest = 4 * 40.0
    for batch in (5, 8, 16):
        step = profile.decode_step_seconds(batch, 1000)
        assert batch / step == pytest.approx(total_at_widest)


def test_a_single_decode_point_is_a_machine_saturated_at_batch_one() -> None:
    profile = _profile(decode=[{"at": 1, "tokens_per_s": 50.0}], decode_by_context=[])
    assert profile.decode_step_seconds(1, 100) == pytest.approx(1 / 50)
    assert profile.decode_step_seconds(8, 100) == pytest.approx(8 / 50)


def test_a_deeper_context_slows_every_step_by_the_decode_by_context_ratio() -> None:
    profile = _profile()
    at_reference = profile.decode_step_seconds(4, 1000)
    assert at_reference == pytest.approx(1 / 40)
    # 5000 is halfway from 1000 (100/s) to 9000 (50/s): 75/s, so each step takes 100/75.
    assert profile.decode_step_seconds(4, 5000) == pytest.approx(at_reference * 100 / 75)
    # held past the last point (50/s), and before the first (100/s, the reference's rate)
    assert profile.decode_step_seconds(4, 50_000) == pytest.approx(at_reference * 2)
    assert profile.decode_step_seconds(4, 10) == pytest.approx(at_reference)


def test_decode_ignores_context_without_decode_by_context() -> None:
    profile = _profile(decode_by_context=[])
    assert profile.decode_step_seconds(1, 100) == profile.decode_step_seconds(1, 100_000)


def test_an_empty_batch_takes_no_time() -> None:
    assert _profile().decode_step_seconds(0, 1000) == 0.0


# -- restore -----------------------------------------------------------------------------


def test_restore_divides_tokens_by_the_tiers_rate() -> None:
    profile = _profile()
    assert profile.restore_seconds("ram", 50_000) == pytest.approx(0.5)
    assert profile.restore_seconds("disk", 50_000) == pytest.approx(5.0)


def test_restore_from_a_tier_without_a_figure_is_free() -> None:
    assert _profile().restore_seconds("peer", 50_000) == 0.0


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["prefill", "decode", "decode_by_context"])
def test_points_out_of_order_are_refused(field: str) -> None:
    points = [{"at": 4, "tokens_per_s": 10.0}, {"at": 2, "tokens_per_s": 20.0}]
    with pytest.raises(ProfileError, match=f"{field}: points must be in increasing"):
        _profile(**{field: points})


@pytest.mark.parametrize("field", ["prefill", "decode", "decode_by_context"])
def test_a_point_given_twice_is_refused(field: str) -> None:
    points = [{"at": 2, "tokens_per_s": 10.0}, {"at": 2, "tokens_per_s": 20.0}]
    with pytest.raises(ProfileError, match="each once"):
        _profile(**{field: points})


def test_decode_batch_sizes_start_at_one() -> None:
    with pytest.raises(ProfileError, match="batch sizes start at 1"):
        _profile(decode=[{"at": 0, "tokens_per_s": 10.0}])


def test_unknown_fields_are_refused_at_the_top_and_in_a_point() -> None:
    with pytest.raises(ProfileError, match="cpu_cores"):
        _profile(cpu_cores=12)
    with pytest.raises(ProfileError, match="batch"):
        _profile(decode=[{"at": 1, "tokens_per_s": 10.0, "batch": 1}])


def test_malformed_tier_names_and_non_positive_rates_are_refused() -> None:
    assert _profile(restore={"ram": 1e6, "vault": 10.0}).restore_seconds("vault", 10) == 1.0
    with pytest.raises(ProfileError, match="restore"):
        _profile(restore={"GPU": 10.0})  # a tier is any well-formed name, this is none
    with pytest.raises(ProfileError, match="rates must be positive"):
        _profile(restore={"ram": 0.0})
    with pytest.raises(ProfileError, match="tokens_per_s"):
        _profile(prefill=[{"at": 0, "tokens_per_s": 0.0}])


def test_required_fields_and_a_point_each_for_prefill_and_decode() -> None:
    document = _document()
    del document["source"]
    with pytest.raises(ProfileError, match="source"):
        parse_profile(json.dumps(document))
    with pytest.raises(ProfileError, match="prefill"):
        _profile(prefill=[])
    with pytest.raises(ProfileError, match="decode"):
        _profile(decode=[])


def test_names_are_lowercase_file_names() -> None:
    with pytest.raises(ProfileError, match="name"):
        _profile(name="M2-Ultra")
    with pytest.raises(ProfileError, match="name"):
        _profile(name="../escape")


def test_the_format_is_checked() -> None:
    with pytest.raises(ProfileError, match="format"):
        _profile(format="warmfleet-perf-profile/0")


def test_not_json_says_where() -> None:
    with pytest.raises(ProfileError, match=r"^mine\.json: not JSON"):
        parse_profile("{", where="mine.json")


def test_a_profile_is_frozen() -> None:
    profile = _profile()
    with pytest.raises(ValueError):
        profile.name = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        RatePoint(at=1, tokens_per_s=-1.0)


def test_dump_and_parse_round_trip() -> None:
    profile = _profile()
    assert parse_profile(dump_profile(profile)) == profile


# -- finding one -------------------------------------------------------------------------


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(_document(name="measured")), encoding="utf-8")
    assert load_profile(str(path)).name == "measured"


def test_load_a_path_that_is_not_there_says_so(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(str(tmp_path / "missing.json"))


def test_load_an_invalid_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_document(block_size=4)), encoding="utf-8")
    with pytest.raises(ProfileError, match=r"bad\.json: block_size"):
        load_profile(str(path))


def test_an_unknown_name_lists_the_built_in_profiles() -> None:
    names = builtin_profiles()
    assert names
    with pytest.raises(ProfileError, match="no profile named 'no-such-mac'") as caught:
        load_profile("no-such-mac")
    for name in names:
        assert name in str(caught.value)


def test_load_by_name() -> None:
    name = builtin_profiles()[0]
    assert load_profile(name).name == name


# -- the built-in profiles ---------------------------------------------------------------

_BUILTIN = builtin_profiles()
_URL = re.compile(r"https?://\S+")


def test_there_are_built_in_apple_silicon_profiles() -> None:
    assert sum(1 for name in _BUILTIN if name.startswith(("m1-", "m2-", "m3-", "m4-"))) >= 3


@pytest.mark.parametrize("name", _BUILTIN)
def test_each_built_in_profile_loads_and_names_its_source(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name  # the file name is the profile's name
    file = resources.files("warmfleet_common.perf_profiles").joinpath(f"{name}.json")
    assert json.loads(file.read_text("utf-8"))["name"] == name
    assert profile.source.strip()
    assert _URL.search(profile.source) or "measured by" in profile.source.lower()
    assert profile.machine.strip() and profile.model.strip()


@pytest.mark.parametrize("name", _BUILTIN)
def test_each_built_in_profile_charges_finite_positive_times(name: str) -> None:
    profile = load_profile(name)
    block = profile.block_size
    assert 0 < profile.prefill_seconds(0, block) < 3600
    assert profile.prefill_seconds(profile.context_length - block, profile.context_length) > 0
    for batch in (1, 2, 16):
        assert 0 < profile.decode_step_seconds(batch, profile.decode_reference_context) < 60
    assert profile.memory_budget_bytes > 0 and profile.kv_bytes_per_token > 0


def test_pooled_machines_are_one_with_their_memory_prefill_and_batch_width() -> None:
    """The ideal a fleet is measured against: N machines' cache in one, prefilling N
    times as fast, decoding N times the batch in one machine's step time."""
    one, ten = _profile(), pooled(_profile(), 10)
    assert ten.memory_budget_bytes == 10 * one.memory_budget_bytes
    assert ten.prefill_seconds(0, 512) == pytest.approx(one.prefill_seconds(0, 512) / 10)
    assert ten.decode_step_seconds(40, 1000) == pytest.approx(one.decode_step_seconds(4, 1000))
    assert ten.restore_seconds("disk", 500) == one.restore_seconds("disk", 500)
    assert ten.name == "test-mac-x10" and parse_profile(dump_profile(ten)) == ten
    with pytest.raises(ValueError):
        pooled(one, 0)
