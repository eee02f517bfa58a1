from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmfleet_common.chunking import plan_chunks, root_key

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
