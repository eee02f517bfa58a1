"""The wire models of the daemon's routes that the router and the operator read: what
the daemon sends parses, and payloads of the wrong shape are refused naming the field
(never coerced: a sequence number is an integer)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from warmfleet_common.contract import WarmSetList
from warmfleet_common.wire import (
    BlockEvicted,
    BlockStored,
    CacheCleared,
    CacheSnapshot,
    DaemonStatus,
    EventsHeartbeat,
    EventsHello,
    EventsReset,
    ModelList,
    event_line,
    parse_event_line,
)

KEY = "0f" * 16


def stored(seq: str, key: str = KEY) -> str:
    return '{"type": "stored", "seq": ' + seq + ', "key": "' + key + '"}'


def test_every_event_line_round_trips() -> None:
    lines = [
        EventsHello(epoch="e1", seq=3),
        EventsReset(reason="gap"),
        EventsHeartbeat(seq=3),
        BlockStored(seq=4, key=KEY, parent=None, start=0, end=32, logits=True),
        BlockEvicted(seq=5, key=KEY, parent=KEY, start=32, end=64),
        CacheCleared(seq=6),
    ]
    for line in lines:
        raw = event_line(line)
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1
        assert parse_event_line(raw) == line


def test_unknown_fields_are_ignored_missing_ones_are_not() -> None:
    parsed = parse_event_line(json.dumps({"type": "cleared", "seq": 1, "new": "field"}))
    assert parsed == CacheCleared(seq=1)
    with pytest.raises(ValidationError, match="seq"):
        parse_event_line('{"type": "cleared"}')


@pytest.mark.parametrize(
    "line",
    [
        "[]",
        "null",
        '"stored"',
        stored("Infinity"),
        stored("NaN"),
        stored("1.5"),
        stored("true"),
        stored('"1"'),
        stored("-1"),
        '{"type": "stored", "seq": 1, "key": "not hex"}',
        stored("1", "0" * 31),
        '{"type": "stored", "seq": 1}',
        '{"type": "teleported", "seq": 1}',
        '{"type": "hello", "epoch": "", "seq": 0}',
        '{"type": "hello", "epoch": "%s", "seq": 0}' % ("e" * 65),
        "{not json",
    ],
)
def test_malformed_event_lines_are_refused(line: str) -> None:
    with pytest.raises(ValidationError):
        parse_event_line(line)


def test_snapshot() -> None:
    body = {
        "epoch": "e1",
        "seq": 7,
        "fingerprint": "f",
        "blocks": [{"key": KEY, "parent": None, "start": 0, "end": 32, "logits": False}],
    }
    snap = CacheSnapshot.model_validate_json(json.dumps(body))
    assert snap.seq == 7 and snap.blocks[0].key == KEY and not snap.blocks[0].pinned
    for bad in ({**body, "blocks": {}}, {**body, "seq": None}, {**body, "epoch": 5}):
        with pytest.raises(ValidationError):
            CacheSnapshot.model_validate_json(json.dumps(bad))


def test_status_parts_the_router_and_operator_read() -> None:
    status = DaemonStatus.model_validate_json(
        json.dumps(
            {
                "instance_id": "i1",
                "model": {"id": "m", "aliases": ["default", "m"], "context_length": 2048},
                "cache": {"bytes": 1, "budget_bytes": 2, "hit_rate": 0.5, "entry_count": 3},
                "warm_set_counts": {"sets": 0, "prompts": 0, "warm": 0, "failed": 0},
                "engine": {"running": 1},
            }
        )
    )
    assert status.model is not None and status.model.aliases == ["default", "m"]
    assert status.model.context_length == 2048
    assert status.cache is not None and status.cache.model_extra == {"entry_count": 3}
    assert status.warm_sets is None  # counts only: not shown to this caller
    for bad in (
        {"model": {"aliases": 5}},
        {"model": {"aliases": [5]}},
        {"model": "m"},
        {"warm_sets": 3},
        {"cache": {"hit_rate": "high"}},
    ):
        with pytest.raises(ValidationError):
            DaemonStatus.model_validate_json(json.dumps(bad))


def test_model_lists_and_warm_set_lists() -> None:
    listed = ModelList.model_validate_json(
        '{"object": "list", "data": [{"id": "a", "object": "model", "max_model_len": 4096}]}'
    )
    assert [(m.id, m.max_model_len) for m in listed.data] == [("a", 4096)]
    for bad in ("", "{}", '{"data": [{"id": ""}]}', '{"data": {"id": "a"}}'):
        with pytest.raises(ValidationError):
            ModelList.model_validate_json(bad)
    with pytest.raises(ValidationError):
        WarmSetList.model_validate_json('{"sets": [{"name": "x"}]}')


def test_a_stored_blocks_source_is_optional_and_any_value_is_kept() -> None:
    """`source` says where a block's KV came from; a reader takes an older daemon's line
    (no source) and a newer one's (a source it does not know, more fields)."""
    copied = BlockStored(seq=1, key=KEY, start=0, end=32, source="peer")
    assert parse_event_line(event_line(copied)) == copied
    assert parse_event_line(stored("1")) == BlockStored(seq=1, key=KEY)  # no source: None
    newer = json.dumps(
        {"type": "stored", "seq": 2, "key": KEY, "source": "teleport", "lineage": {"x": 1}}
    )
    assert parse_event_line(newer) == BlockStored(seq=2, key=KEY, source="teleport")
    with pytest.raises(ValidationError, match="source"):
        parse_event_line(json.dumps({"type": "stored", "seq": 1, "key": KEY, "source": 5}))
    block = {"key": KEY, "start": 0, "end": 32, "source": "snapshot", "future": True}
    snap = CacheSnapshot.model_validate({"epoch": "e", "seq": 0, "blocks": [block]})
    assert snap.blocks[0].source == "snapshot"
