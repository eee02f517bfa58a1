"""Prefix-cache block payloads: the state a prefill chunk added to a sequence's caches.

KVCache layers store the chunk's own keys/values (blocks along a chain concatenate
back into the full cache). Other layer types (SSM state, rotating windows) cannot be
sliced, so a block stores a snapshot of them as of the block's end; a sequence resumes
from the last matched block's snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache


@dataclass(frozen=True)
class KVSlice:
    keys: mx.array
    values: mx.array


@dataclass(frozen=True)
class Snapshot:
    cache_type: type[Any]
    state: Any
    meta_state: Any


LayerState = KVSlice | Snapshot


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
            slices = [b.layers[i] for b in blocks]
            assert all(isinstance(s, KVSlice) for s in slices)
            keys = [s.keys for s in slices]  # type: ignore[union-attr]
            values = [s.values for s in slices]  # type: ignore[union-attr]
            length = sum(k.shape[2] for k in keys)
            cache = KVCache()
            cache.state = (_padded(keys, capacity), _padded(values, capacity), length)
            out.append(cache)
        else:
            out.append(_from_snapshot(blocks[-1].layers[i]))
    return out


def reserve(caches: Sequence[Any], capacity: int) -> None:
    """Grow KV buffers to `capacity` tokens in one copy (KVCache grows 256 at a time,
    copying the whole buffer each time)."""
    for cache in caches:
        if type(cache) is KVCache and cache.keys is not None and cache.keys.shape[2] < capacity:
            length = cache.offset
            cache.keys = _padded([cache.keys[..., :length, :]], capacity)
            cache.values = _padded([cache.values[..., :length, :]], capacity)


def _padded(parts: list[mx.array], capacity: int) -> mx.array:
    length = sum(p.shape[2] for p in parts)
    step = KVCache.step
    room = -(-max(capacity, length) // step) * step - length
    if room:
        b, h, _, d = parts[0].shape
        parts = [*parts, mx.zeros((b, h, room, d), dtype=parts[0].dtype)]
    # Always a new array: caches write into theirs in place, payloads must stay intact.
    return mx.concatenate(parts, axis=2) if len(parts) > 1 else mx.contiguous(parts[0])


def append_block(caches: list[Any], block: BlockPayload) -> list[Any]:
    """Extend in-progress caches with a block another sequence computed meanwhile."""
    out: list[Any] = []
    for cache, layer in zip(caches, block.layers):
        if isinstance(layer, KVSlice):
            cache.update_and_fetch(layer.keys, layer.values)
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
