"""Multi-head latent attention (MLA: DeepSeek V2.5/V3, Kimi K2, GLM-4.7-Flash) in the
decode batch and in per-sequence batches, at the level of one layer's step: the layer
stores the latent as keys and the rotary key part as values, multiplies the fetched
values itself into rotary scores and hands them to the attention hook as the mask.

The decode batch must give the layer real arrays for that, add the scores, and keep a
row's result bitwise independent of its neighbours (their padding); the per-sequence
batch must cut each sequence's scores back to its own keys. (The model matrix checks
whole models; these pin the arithmetic.)"""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

from warmfleet_daemon.engine import attention
from warmfleet_daemon.engine.decode_batch import KEY_BLOCK, DecodeBatch

HEADS, LATENT, ROTARY = 4, 16, 8
SCALE = 1 / math.sqrt(LATENT + ROTARY)


def prefilled(length: int, seed: int) -> KVCache:
    """One layer's cache after a prefill: latents as keys, rotary parts as values."""
    cache = KVCache()
    latent = mx.random.normal((1, 1, length, LATENT), key=mx.random.key(seed))
    rotary = mx.random.normal((1, 1, length, ROTARY), key=mx.random.key(seed + 50))
    cache.update_and_fetch(latent, rotary)
    return cache


def step_inputs(rows: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Each row's queries (latent and rotary parts) and its new latent and rotary key."""
    keys = [mx.random.key(100 + row) for row in range(rows)]

    def part(width: int, heads: int, salt: int) -> mx.array:
        return mx.concatenate(
            [mx.random.normal((1, heads, 1, width), key=mx.random.split(k, 4)[salt]) for k in keys]
        )

    return part(LATENT, HEADS, 0), part(ROTARY, HEADS, 1), part(LATENT, 1, 2), part(ROTARY, 1, 3)


def rows_step(
    lengths: list[int], streams: int = 1, ranges: list[tuple[int, int]] | None = None
) -> mx.array:
    """One MLA decode step of rows of these lengths, as deepseek_v3's layer runs it on a
    decode batch view: the scores from the fetched values, then the attention hook; with
    `ranges`, the step's rows taken in those ranges, one view each (the engine's row groups)."""
    batch = DecodeBatch(max_rows=8, streams=streams, latent=True)
    for seed, n in enumerate(lengths):
        batch.admit([prefilled(n, seed)])
    q_latent, q_rotary, new_latent, new_rotary = step_inputs(len(lengths))
    hook = attention._make_hook(scaled_dot_product_attention, cpu=True)
    outs = []
    for first, stop in ranges or [(0, len(lengths))]:
        view = batch.step_views(first, stop)[0]
        latents, rotary = view.update_and_fetch(new_latent[first:stop], new_rotary[first:stop])
        width = latents.shape[2]  # the range's key blocks, every row padded to them
        assert latents.shape[:3] == rotary.shape[:3] == (stop - first, 1, width)
        assert width % KEY_BLOCK == 0 and width > max(lengths[first:stop])
        scores = (q_rotary[first:stop] * SCALE) @ rotary.swapaxes(-1, -2)
        outs.append(
            hook(q_latent[first:stop], latents, latents, cache=view, scale=SCALE, mask=scores)
        )
    out = mx.concatenate(outs)
    mx.eval(out)
    return out


def reference(lengths: list[int]) -> list[mx.array]:
    """Plain softmax attention per row over its own keys and this step's."""
    q_latent, q_rotary, new_latent, new_rotary = step_inputs(len(lengths))
    out = []
    for row, n in enumerate(lengths):
        cache = prefilled(n, row)
        latents = mx.concatenate([cache.keys[..., :n, :], new_latent[row : row + 1]], axis=2)
        rotary = mx.concatenate([cache.values[..., :n, :], new_rotary[row : row + 1]], axis=2)
        scores = (q_latent[row : row + 1] @ latents.swapaxes(-1, -2)) * SCALE
        scores = scores + (q_rotary[row : row + 1] * SCALE) @ rotary.swapaxes(-1, -2)
        out.append(mx.softmax(scores, axis=-1) @ latents)
    return out


def test_the_decode_batch_computes_latent_attention_with_its_rotary_scores() -> None:
    lengths = [1, 63, 64, 300]
    out = rows_step(lengths)
    for row, want in enumerate(reference(lengths)):
        assert mx.allclose(out[row : row + 1], want, atol=1e-5).item()


def test_a_latent_rows_result_does_not_depend_on_its_neighbours() -> None:
    alone = rows_step([40])
    for neighbours in ([300], [700, 5], [1100, 256, 9]):
        together = rows_step([40, *neighbours])  # the scores too span up to 18 blocks
        assert mx.array_equal(together[0:1], alone).item()


def test_latent_row_groups_on_their_own_streams_compute_what_one_group_does() -> None:
    lengths = [40, 3000, 700, 5, 1290]  # enough keys to split the rows
    one = rows_step(lengths, streams=1)
    assert mx.array_equal(rows_step(lengths, streams=2), one).item()


@pytest.mark.parametrize("streams", [1, 2])
def test_a_step_taken_in_row_ranges_computes_what_one_range_does(streams: int) -> None:
    lengths = [40, 3000, 700, 5, 1290]  # enough keys to split a range over streams
    whole = rows_step(lengths, streams)
    assert mx.array_equal(rows_step(lengths, streams, ranges=[(0, 2), (2, 5)]), whole).item()
    assert mx.array_equal(rows_step(lengths, streams, ranges=[(0, 1), (1, 5)]), whole).item()


def test_values_narrower_than_keys_keep_their_width_in_the_rows() -> None:
    batch = DecodeBatch(max_rows=4)
    caches = [prefilled(n, seed) for seed, n in enumerate((5, 70))]
    for cache in caches:
        batch.admit([cache])
    for row, cache in enumerate(caches):
        ((keys, values),) = batch.row_kv(row)
        assert mx.array_equal(keys, cache.keys[..., : cache.offset, :]).item()
        assert mx.array_equal(values, cache.values[..., : cache.offset, :]).item()


def test_a_per_sequence_batch_cuts_each_sequences_scores_to_its_keys() -> None:
    lengths = [3, 70, 20]
    caches = [prefilled(n, seed) for seed, n in enumerate(lengths)]
    q_latent, q_rotary, new_latent, new_rotary = step_inputs(len(lengths))
    view = attention.SequenceBatch(caches, latent=True)
    latents, rotary = view.update_and_fetch(new_latent, new_rotary)
    assert isinstance(latents, list) and rotary.shape == (3, 1, max(lengths) + 1, ROTARY)
    scores = (q_rotary * SCALE) @ rotary.swapaxes(-1, -2)
    hook = attention._make_hook(scaled_dot_product_attention, cpu=False)
    out = hook(q_latent, latents, latents, cache=view, scale=SCALE, mask=scores)
    for row, want in enumerate(reference(lengths)):
        assert mx.allclose(out[row : row + 1], want, atol=1e-5).item()


def test_the_decode_batch_refuses_what_it_cannot_apply() -> None:
    """A mask or sinks on a per-head decode batch must fail (the engine then decodes
    per sequence), not be dropped."""
    batch = DecodeBatch(max_rows=2)
    batch.admit([prefilled(10, 0)])
    view = batch.step_views()[0]
    keys, values = view.update_and_fetch(mx.zeros((1, 1, 1, LATENT)), mx.zeros((1, 1, 1, ROTARY)))
    hook = attention._make_hook(scaled_dot_product_attention, cpu=True)
    q = mx.zeros((1, HEADS, 1, LATENT))
    with pytest.raises(NotImplementedError, match="mask"):
        hook(q, keys, values, cache=view, scale=SCALE, mask=mx.zeros((1, HEADS, 1, 64)))
    with pytest.raises(NotImplementedError, match="sinks"):
        hook(q, keys, values, cache=view, scale=SCALE, mask=None, sinks=mx.zeros((HEADS,)))
