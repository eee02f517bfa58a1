"""Prefix-cache block payloads: the state a prefill chunk added to a sequence's caches.

KVCache layers store the chunk's own keys/values (blocks along a chain concatenate
back into the full cache). Other layer types (SSM state, rotating windows) cannot be
sliced, so a block stores a snapshot of them as of the block's end; a sequence resumes
from the last matched block's snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache


@dataclass(frozen=True)
class KVSlice:
    keys: mx.array
    values: mx.array


@dataclass(frozen=True)
class Snapshot:
    cache_type: type[Any]
    state: Any
    meta_state: Any


@dataclass(frozen=True)
class QuantizedSlice:
    """A quantized KV layer's tokens: (packed, scales, biases) for keys and for values,
    quantized per group along the head dimension, so tokens slice apart freely."""

    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]
    group_size: int
    bits: int


LayerState = KVSlice | QuantizedSlice | Snapshot


def quantization_group(model: Any) -> int | None:
    """The group size for quantized KV: 64 (mlx-lm's default) or 32, whichever divides
    every KV layer's key and value widths; None if neither does."""
    caches = make_prompt_cache(model)
    model(mx.zeros((1, 1), dtype=mx.int32), cache=caches)
    widths = {a.shape[-1] for c in caches if type(c) is KVCache for a in (c.keys, c.values)}
    return next((g for g in (64, 32) if all(w % g == 0 for w in widths)), None)


def new_caches(model: Any, kv_bits: int | None = None, group_size: int = 64) -> list[Any]:
    """A fresh cache list for the model; with `kv_bits`, its KV layers quantized
    (mlx-lm's QuantizedKVCache: attention then runs on the quantized keys and values)."""
    caches: list[Any] = make_prompt_cache(model)
    if kv_bits is None:
        return caches
    return [QuantizedKVCache(group_size, kv_bits) if type(c) is KVCache else c for c in caches]


@dataclass(frozen=True)
class BlockPayload:
    layers: tuple[LayerState, ...]
    nbytes: int
    logits: mx.array | None = None  # (1, vocab) at the block's last token, if computed


def extract_block(
    caches: Sequence[Any], start: int, end: int, logits: mx.array | None = None
) -> BlockPayload:
    """Copy what tokens [start, end) added to each layer (evaluated, owning its memory)."""
    layers: list[LayerState] = []
    for cache in caches:
        if type(cache) is KVCache:
            layers.append(
                KVSlice(
                    mx.contiguous(cache.keys[..., start:end, :]),
                    mx.contiguous(cache.values[..., start:end, :]),
                )
            )
        elif type(cache) is QuantizedKVCache:
            layers.append(
                QuantizedSlice(
                    tuple(mx.contiguous(x[..., start:end, :]) for x in cache.keys),
                    tuple(mx.contiguous(x[..., start:end, :]) for x in cache.values),
                    cache.group_size,
                    cache.bits,
                )
            )
        else:
            state = _copy_tree(cache.state)
            layers.append(Snapshot(type(cache), state, getattr(cache, "meta_state", None)))
    arrays = [a for layer in layers for a in _arrays(layer)]
    if logits is not None:
        arrays.append(logits)
    mx.eval(arrays)
    return BlockPayload(tuple(layers), sum(a.nbytes for a in arrays), logits)


def restore(blocks: Sequence[BlockPayload], fresh: list[Any], capacity: int) -> list[Any]:
    """Caches equal to those after prefilling the chained `blocks` (root first), with
    KV buffers for `capacity` tokens. `fresh` is a new empty cache list for the model,
    used for its layer types."""
    if not blocks:
        return fresh
    out: list[Any] = []
    for i, template in enumerate(fresh):
        if type(template) is KVCache:
            slices = cast(list[KVSlice], [b.layers[i] for b in blocks])
            assert all(isinstance(s, KVSlice) for s in slices)
            keys = [s.keys for s in slices]
            values = [s.values for s in slices]
            length = sum(k.shape[2] for k in keys)
            cache = KVCache()
            cache.state = (_padded(keys, capacity), _padded(values, capacity), length)
            out.append(cache)
        elif type(template) is QuantizedKVCache:
            parts = [b.layers[i] for b in blocks]
            assert all(isinstance(p, QuantizedSlice) for p in parts)
            quantized = _restore_quantized(cast(list[QuantizedSlice], parts), capacity)
            out.append(quantized)
        else:
            out.append(_from_snapshot(blocks[-1].layers[i]))
    return out


def _restore_quantized(parts: list[QuantizedSlice], capacity: int) -> QuantizedKVCache:
    first = parts[0]
    keys = tuple(_padded([p.keys[j] for p in parts], capacity) for j in range(len(first.keys)))
    values = tuple(
        _padded([p.values[j] for p in parts], capacity) for j in range(len(first.values))
    )
    length = sum(p.keys[0].shape[2] for p in parts)
    cache = QuantizedKVCache(first.group_size, first.bits)
    cache.state = (keys, values, length, first.group_size, first.bits)
    return cache


def reserve(caches: Sequence[Any], capacity: int) -> None:
    """Grow KV buffers to `capacity` tokens in one copy (KVCache grows 256 at a time,
    copying the whole buffer each time)."""
    for cache in caches:
        if type(cache) is KVCache and cache.keys is not None and cache.keys.shape[2] < capacity:
            length = cache.offset
            cache.keys = _padded([cache.keys[..., :length, :]], capacity)
            cache.values = _padded([cache.values[..., :length, :]], capacity)
        elif type(cache) is QuantizedKVCache and cache.keys is not None:
            _grow_quantized(cache, capacity)


def _grow_quantized(cache: QuantizedKVCache, capacity: int) -> None:
    if cache.keys[0].shape[2] >= capacity:
        return
    length = cache.offset
    cache.keys = tuple(_padded([x[..., :length, :]], capacity) for x in cache.keys)
    cache.values = tuple(_padded([x[..., :length, :]], capacity) for x in cache.values)


def _padded(parts: list[mx.array], capacity: int) -> mx.array:
    length = sum(p.shape[2] for p in parts)
    step = KVCache.step
    room = -(-max(capacity, length) // step) * step - length
    if room:
        b, h, _, d = parts[0].shape
        parts = [*parts, mx.zeros((b, h, room, d), dtype=parts[0].dtype)]
    # Always a new array: caches write into theirs in place, payloads must stay intact.
    return mx.concatenate(parts, axis=2) if len(parts) > 1 else mx.contiguous(parts[0])


def append_block(caches: list[Any], block: BlockPayload, capacity: int = 0) -> list[Any]:
    """Extend in-progress caches with a block another sequence computed meanwhile (or a
    lower tier read back), with KV buffers for `capacity` tokens: blocks appended one by
    one then never regrow (and copy) the buffers."""
    out: list[Any] = []
    for cache, layer in zip(caches, block.layers):
        if isinstance(layer, KVSlice):
            size = layer.keys.shape[2]
            if cache.keys is None:
                cache.state = (
                    _padded([layer.keys], capacity),
                    _padded([layer.values], capacity),
                    size,
                )
            else:
                reserve([cache], max(capacity, cache.offset + size))
                cache.update_and_fetch(layer.keys, layer.values)
            out.append(cache)
        elif isinstance(layer, QuantizedSlice):
            # Already quantized: written in place (update_and_fetch would quantize again).
            start, size = cache.offset, layer.keys[0].shape[2]
            if cache.keys is None:  # nothing restored before it
                cache.keys = tuple(_padded([p], capacity) for p in layer.keys)
                cache.values = tuple(_padded([p], capacity) for p in layer.values)
            else:
                _grow_quantized(cache, max(capacity, start + size))
                for mine, theirs in ((cache.keys, layer.keys), (cache.values, layer.values)):
                    for part, new in zip(mine, theirs):
                        part[..., start : start + size, :] = new
            cache.offset = start + size
            out.append(cache)
        else:
            out.append(_from_snapshot(layer))
    return out


def cache_arrays(caches: Sequence[Any]) -> list[mx.array]:
    """Every array the caches hold, for mx.eval."""
    out: list[mx.array] = []
    for cache in caches:
        out.extend(_flatten(cache.state))
    return out


def _from_snapshot(layer: LayerState) -> Any:
    assert isinstance(layer, Snapshot)
    cache = object.__new__(layer.cache_type)  # like _BaseCache.from_state: no __init__
    cache.state = _copy_tree(layer.state)
    if layer.meta_state is not None:
        cache.meta_state = layer.meta_state
    return cache


def _arrays(layer: LayerState) -> list[mx.array]:
    if isinstance(layer, KVSlice):
        return [layer.keys, layer.values]
    if isinstance(layer, QuantizedSlice):
        return [*layer.keys, *layer.values]
    return _flatten(layer.state)


def _flatten(tree: Any) -> list[mx.array]:
    if isinstance(tree, mx.array):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [a for item in tree for a in _flatten(item)]
    return []


def _copy_tree(tree: Any) -> Any:
    # A snapshot must own its arrays: caches update theirs in place.
    if isinstance(tree, mx.array):
        return mx.contiguous(tree[...]) if tree.ndim else mx.array(tree.item())
    if isinstance(tree, list):
        return [_copy_tree(t) for t in tree]
    if isinstance(tree, tuple):
        return tuple(_copy_tree(t) for t in tree)
    return tree
