"""The inverted index (`BlockIndex.predict_fleet`: one walk of a request's blocks for the
whole fleet) against the per-backend prediction it replaces on the routing path
(`predict_tiers` of each backend's keying, `on`): for random fleets fed random events,
snapshots, history, warm-set pins, shared sets, clears, forgets and budget trims, both
say the same for every backend and every request."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet_common.tiers import TIERS
from warmfleet_router.index import ENTRY_BYTES, BlockIndex
from warmfleet_router.keys import RequestBlocks

KEYS = [bytes([i]) * 16 for i in range(12)]
SALTED = [bytes([100 + i]) * 16 for i in range(3)]
BACKENDS = ["a", "b", "c", "d", "e"]


def request(keys: list[bytes], unsalted: tuple[bytes, ...] = ()) -> RequestBlocks:
    return RequestBlocks(
        tuple(keys), tuple(range(4, 4 * len(keys) + 1, 4)), 4 * len(keys) + 2, unsalted
    )


REQUESTS = [
    request(KEYS[:4]),
    request([*KEYS[:2], KEYS[4]]),
    request(KEYS[5:7]),
    request(KEYS[:1]),
    request(SALTED, unsalted=tuple(KEYS[:2])),  # a tenant's: shares a run where pinned
    request([*SALTED[:2], KEYS[8]], unsalted=tuple(KEYS[:3])),
]

backend = st.sampled_from(BACKENDS)
key = st.sampled_from(KEYS + SALTED)
tier = st.sampled_from(TIERS)
keys = st.lists(key, max_size=6)
operation = st.one_of(
    st.tuples(
        st.just("snapshot"),
        backend,
        st.lists(st.tuples(key, st.booleans(), st.sets(tier, min_size=1)), max_size=8),
    ),
    st.tuples(st.just("stored"), backend, key, st.booleans(), tier),
    st.tuples(st.just("evicted"), backend, key, tier),
    st.tuples(st.just("cleared"), backend),
    st.tuples(st.just("routed"), backend, st.sampled_from(REQUESTS)),
    st.tuples(st.just("pinned"), backend, keys),
    st.tuples(st.just("shared"), backend, keys),
    st.tuples(st.just("forget"), backend, st.booleans()),
)


def apply(index: BlockIndex, op: tuple[Any, ...]) -> None:
    kind, name, *args = op
    if kind == "snapshot":
        index.load_snapshot(name, args[0])
    elif kind == "stored":
        index.stored(name, *args)
    elif kind == "evicted":
        index.evicted(name, *args)
    elif kind == "cleared":
        index.cleared(name)
    elif kind == "routed":
        index.routed(name, args[0])
    elif kind == "pinned":
        index.set_pinned(name, args[0])
    elif kind == "shared":
        index.set_shared(name, args[0])
    else:
        index.forget(name, keep_pinned=args[0])


def assert_agree(index: BlockIndex) -> None:
    for blocks in REQUESTS:
        fleet = index.predict_fleet(dict.fromkeys(BACKENDS, blocks))
        for name in BACKENDS:
            keyed = index.on(name, blocks)
            assert fleet[name].blocks == keyed, name
            assert fleet[name].hit == index.predict_tiers(name, keyed), (name, blocks)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=40), st.integers(min_value=4, max_value=60))
def test_one_walk_predicts_what_each_backend_would(ops: list[Any], budget: int) -> None:
    index = BlockIndex(history_blocks=6, budget_bytes=budget * ENTRY_BYTES)
    for op in ops:
        apply(index, op)
        assert_agree(index)


@settings(max_examples=100, deadline=None)
@given(st.lists(operation, max_size=30))
def test_forgetting_every_backend_leaves_no_holders(ops: list[Any]) -> None:
    index = BlockIndex(history_blocks=6)
    for op in ops:
        apply(index, op)
    for name in BACKENDS:
        index.forget(name)
    assert index.entries() == 0
    assert not index._holders and not index._slots  # no key or bit outlives its backends
    assert_agree(index)


def test_a_fleet_of_many_backends_is_walked_once() -> None:
    """250 backends hold a warm prefix, one of them a session's history too: every one
    is predicted from one walk (what each holds, and the session's node the most)."""
    index = BlockIndex()
    prefix, session = KEYS[:3], [*KEYS[:3], *KEYS[3:6]]
    names = [f"node-{i}" for i in range(250)]
    for name in names:
        index.load_snapshot(name, [(k, False) for k in prefix])
    for k in session[3:]:
        index.stored("node-7", k, k == session[-1])
    fleet = index.predict_fleet(dict.fromkeys(names, request(session)))
    assert fleet["node-7"].hit.total == 24
    assert {fleet[n].hit.total for n in names if n != "node-7"} == {12}
