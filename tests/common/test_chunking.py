from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmfleet_common.chunking import (
    plan_chunks,
    root_key,
    salted_root,
    shared_run,
    unsalted_keys,
)

ROOT = root_key("m")


def bounds(n: int, block: int, cuts: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    chunks = plan_chunks(list(range(n)), block_size=block, cuts=cuts, root=ROOT)
    return [(c.start, c.end) for c in chunks]


def test_blocks_count_from_each_cut() -> None:
    assert bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert bounds(10, 4, cuts=(6,)) == [(0, 4), (4, 6), (6, 10)]
    assert bounds(13, 4, cuts=(2, 5)) == [(0, 2), (2, 5), (5, 9), (9, 13)]
    assert bounds(8, 4) == [(0, 4), (4, 8)]
    assert bounds(1, 4) == [(0, 1)]


def test_cuts_outside_the_prompt_are_ignored() -> None:
    assert bounds(6, 8, cuts=(0, 5, 6, 40)) == [(0, 5), (5, 6)]


@given(
    n=st.integers(0, 600),
    block=st.integers(1, 130),
    cuts=st.lists(st.integers(-5, 700), max_size=6),
)
def test_plans_tile_the_prompt(n: int, block: int, cuts: list[int]) -> None:
    chunks = plan_chunks(list(range(n)), block_size=block, cuts=cuts, root=ROOT)
    assert [c.start for c in chunks[1:]] == [c.end for c in chunks[:-1]]
    assert (chunks[0].start if chunks else 0) == 0
    assert (chunks[-1].end if chunks else 0) == n
    assert all(0 < c.size <= block for c in chunks)
    assert len({c.key for c in chunks}) == len(chunks)


TOKENS = list(range(1000, 1400))
CUTS = (5, 300)


def keys(salt: bytes = b"", shared: frozenset[bytes] = frozenset()) -> list[bytes]:
    chunks = plan_chunks(TOKENS, block_size=64, cuts=CUTS, root=ROOT, salt=salt, shared=shared)
    return [c.key for c in chunks]


def test_a_salt_keys_every_block_apart_with_the_same_boundaries() -> None:
    plain, a, b = keys(), keys(b"tenant-a"), keys(b"tenant-b")
    assert not set(plain) & set(a) and not set(a) & set(b)
    again = plan_chunks(TOKENS, block_size=64, cuts=CUTS, root=ROOT, salt=b"tenant-a")
    assert [c.key for c in again] == a
    assert [(c.start, c.end) for c in again] == bounds(len(TOKENS), 64, CUTS)


def test_a_salted_prompt_shares_only_the_leading_run_of_shared_blocks() -> None:
    plain, salted = keys(), keys(b"tenant-a")
    # A fleet-wide warm prompt's first three blocks (a chain: the leading run).
    shared = frozenset(plain[:3])
    assert keys(b"tenant-a", shared) == plain[:3] + salted[3:]
    # A shared key that does not start the chain is never used.
    assert keys(b"tenant-a", frozenset(plain[1:3])) == salted
    # Unsalted prompts are keyed as ever.
    assert keys(b"", shared) == plain


def test_unsalted_keys_and_the_shared_run() -> None:
    plain = keys()
    ends = [c.end for c in plan_chunks(TOKENS, block_size=64, cuts=CUTS, root=ROOT)]
    cut = unsalted_keys(TOKENS, block_size=64, cuts=CUTS, root=ROOT, up_to=ends[2])
    assert cut == plain[:3]
    assert unsalted_keys(TOKENS, block_size=64, cuts=CUTS, root=ROOT, up_to=0) == []
    assert shared_run(plain, frozenset(plain[:2])) == plain[:2]
    assert salted_root(ROOT, b"") == ROOT != salted_root(ROOT, b"x")
