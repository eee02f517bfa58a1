"""The decode batch: rows of shared KV buffers, blocked attention that does not depend
on a row's neighbours, and the engine decoding from it."""

from __future__ import annotations

import math
import random

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from support.engine import greedy, model, request, run, tokens_of
from warmfleet_daemon.engine import decode_batch
from warmfleet_daemon.engine.attention import blocked_decode_attention
from warmfleet_daemon.engine.decode_batch import KEY_BLOCK, DecodeBatch

HEADS, KV_HEADS, DIM, LAYERS = 6, 2, 8, 2


def prefilled(length: int, seed: int) -> list[KVCache]:
    """Caches as a prefill leaves them: random KV of `length` tokens per layer."""
    caches = []
    for layer in range(LAYERS):
        cache = KVCache()
        k = mx.random.normal((1, KV_HEADS, length, DIM), key=mx.random.key(seed * 10 + layer))
        v = mx.random.normal((1, KV_HEADS, length, DIM), key=mx.random.key(seed * 10 + layer + 5))
        cache.update_and_fetch(k, v)
        caches.append(cache)
    return caches


def kv_of(caches: list[KVCache]) -> list[tuple[mx.array, mx.array]]:
    return [(c.keys[..., : c.offset, :], c.values[..., : c.offset, :]) for c in caches]  # type: ignore[index]


def same(a: list[tuple[mx.array, mx.array]], b: list[tuple[mx.array, mx.array]]) -> bool:
    return all(mx.array_equal(x, y).item() for p, q in zip(a, b) for x, y in zip(p, q))


def test_rows_keep_their_kv_and_the_last_row_fills_a_freed_one() -> None:
    batch = DecodeBatch(max_rows=8)
    seqs = [prefilled(n, seed) for seed, n in enumerate((5, 300, 40))]
    assert [batch.admit(s) for s in seqs] == [0, 1, 2]
    assert batch.lengths == [5, 300, 40]
    assert all(same(batch.row_kv(i), kv_of(s)) for i, s in enumerate(seqs))
    assert batch.capacity % KEY_BLOCK == 0 and batch.capacity > 300

    assert batch.release(0) == 2  # the last row (40 tokens) moved into row 0
    assert batch.lengths == [40, 300]
    assert same(batch.row_kv(0), kv_of(seqs[2]))
    assert same(batch.row_kv(1), kv_of(seqs[1]))
    assert batch.release(1) is None
    assert batch.release(0) is None
    assert len(batch) == 0 and batch.allocated_rows == 0  # an idle batch holds no buffers


def test_a_step_writes_each_rows_token_at_its_own_position() -> None:
    batch = DecodeBatch(max_rows=4, streams=1)
    seqs = [prefilled(n, seed) for seed, n in enumerate((3, 260))]
    for s in seqs:
        batch.admit(s)
    views = batch.step_views()
    new_k = mx.random.normal((2, KV_HEADS, 1, DIM), key=mx.random.key(99))
    new_v = new_k + 1
    for view in views:
        (keys,), _ = view.update_and_fetch(new_k, new_v)
        assert keys.shape == (2, KV_HEADS, -(-261 // KEY_BLOCK), KEY_BLOCK, DIM)
    batch.advance()
    assert batch.lengths == [4, 261]
    for row, (s, n) in enumerate(zip(seqs, (3, 260))):
        for (k, v), (old_k, _) in zip(batch.row_kv(row), kv_of(s)):
            assert mx.array_equal(k[..., :n, :], old_k).item()
            assert mx.array_equal(k[..., n, :], new_k[row : row + 1, :, 0, :]).item()
            assert mx.array_equal(v[..., n, :], new_v[row : row + 1, :, 0, :]).item()


def reference_attention(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """Plain softmax attention of one query (1, heads, 1, dim) over (1, kv, n, dim)."""
    k = mx.repeat(k, HEADS // KV_HEADS, axis=1)
    v = mx.repeat(v, HEADS // KV_HEADS, axis=1)
    return mx.softmax((q * scale) @ k.swapaxes(-1, -2), axis=-1) @ v


def queries(rows: int) -> mx.array:
    keys = [mx.random.key(100 + row) for row in range(rows)]
    return mx.concatenate([mx.random.normal((1, HEADS, 1, DIM), key=k) for k in keys])


def attend(lengths: list[int], streams: int = 1) -> mx.array:
    """Decode attention for rows of these lengths (row i seeded by i), as the model's
    attention hook runs it: per row group, each on its own stream."""
    batch = DecodeBatch(max_rows=8, streams=streams)
    for seed, n in enumerate(lengths):
        batch.admit(prefilled(n, seed))
    view = batch.step_views()[0]
    rows = len(lengths)
    q = queries(rows)
    new = mx.zeros((rows, KV_HEADS, 1, DIM))
    keys, values = view.update_and_fetch(new, new)
    outs = []
    for group, k, v in zip(view.groups, keys, values):
        with mx.stream(group.stream):
            q_rows = q[group.start : group.stop]
            outs.append(blocked_decode_attention(q_rows, k, v, 1 / math.sqrt(DIM), group.mask))
    return mx.concatenate(outs)


def test_blocked_attention_is_softmax_attention() -> None:
    lengths = [1, 255, 256, 700]
    out = attend(lengths)
    q = queries(len(lengths))
    for row, n in enumerate(lengths):
        k, v = kv_of(prefilled(n, row))[0]
        zero = mx.zeros((1, KV_HEADS, 1, DIM))
        k, v = mx.concatenate([k, zero], axis=2), mx.concatenate([v, zero], axis=2)
        want = reference_attention(q[row : row + 1], k, v, 1 / math.sqrt(DIM))
        assert mx.allclose(out[row : row + 1], want, atol=1e-5).item()


def test_a_rows_attention_does_not_depend_on_its_neighbours() -> None:
    alone = attend([40])
    for neighbours in ([300], [700, 5], [1100, 256, 9]):
        together = attend([40, *neighbours])  # padded to up to 18 key blocks
        assert mx.array_equal(together[0:1], alone).item()


def test_row_groups_on_their_own_streams_compute_what_one_group_does() -> None:
    lengths = [40, 3000, 700, 5, 1290]  # enough keys to split the rows
    one = attend(lengths, streams=1)
    for streams in (2, 3):
        batch = DecodeBatch(max_rows=8, streams=streams)
        for seed, n in enumerate(lengths):
            batch.admit(prefilled(n, seed))
        assert len(batch.step_views()[0].groups) == streams
        assert mx.array_equal(attend(lengths, streams=streams), one).item()


def test_a_step_with_little_attention_work_stays_in_one_group() -> None:
    batch = DecodeBatch(max_rows=8, streams=2)
    for seed, n in enumerate([40, 300, 700]):
        batch.admit(prefilled(n, seed))
    assert len(batch.step_views()[0].groups) == 1


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 49000) for _ in range(n)]


@pytest.mark.parametrize("spec", ["tiny-random", "default"])
def test_sequences_spanning_several_key_blocks_decode_as_they_do_alone(spec, make_engine) -> None:
    loaded = model(spec)
    rng = random.Random(11)
    prompts = [prompt(rng, n) for n in (7, 250, 530, 90)]
    solo = [
        tokens_of(run(make_engine(loaded), request(p, sampling=greedy(12)))[0]) for p in prompts
    ]
    engine = make_engine(loaded, max_num_seqs=3)  # the fourth joins when a row frees
    together = run(
        engine, *[request(p, sampling=greedy(12 + 4 * i)) for i, p in enumerate(prompts)]
    )
    assert [tokens_of(e)[:12] for e in together] == solo


def test_an_idle_engine_releases_its_decode_buffers(tiny, make_engine) -> None:
    engine = make_engine(tiny)
    run(engine, request(prompt(random.Random(1), 20), sampling=greedy(5)))
    assert engine.decoder.rows is not None and engine.decoder.rows.allocated_rows == 0


def test_the_decode_batch_is_used_on_the_cpu_for_plain_kv_models(tiny, make_engine) -> None:
    assert isinstance(make_engine(tiny).decoder.rows, decode_batch.DecodeBatch)
    assert make_engine(model("tiny-random-gemma3")).decoder.rows is None  # rotating caches
