"""Attention hooks for mlx-lm model modules.

mlx-lm's attention layers call their module's `scaled_dot_product_attention`; we
rebind that name (in every module the model's layers come from) to `attention` below,
which adds three things and otherwise defers:

1. Per-sequence decode. A `SequenceBatch` cache view lets B sequences with their own
   KVCache (no padding, no merged batch cache) decode in one forward: projections and
   MLPs run batched, attention runs per sequence. A sequence's arithmetic then does not
   depend on its neighbours' lengths, and joining or leaving the batch copies nothing.
   (mlx-lm's BatchKVCache left-pads every sequence to the longest one instead.)
2. The CPU decode batch (`decode_batch.LayerView`): every row's attention in one call.
3. On the CPU, softmax via exp2. mlx's CPU fallback for fused attention spends most of
   its time in a scalar `exp` (about 110M/s here); `power(2, x)` runs about 3x faster,
   which halves prefill time for long prompts. Metal keeps `mx.fast`'s kernels.
4. On the CPU, a quantized KV cache's prefill chunk attends over its keys and values
   dequantized (then 3.), not through mlx's quantized matmul. Metal keeps mlx-lm's.

Multi-head latent attention (MLA: DeepSeek V2.5/V3, Kimi K2, GLM-4.7-Flash, ...) uses
its cache differently: the compressed latent is stored as the keys and the rotary key
part as the values; a decode step computes the rotary scores itself from the fetched
"values" and passes them to the hook as the `mask`, with the latent as both keys and
values. The views hand such models real arrays where they need them (`latent`) and the
hook adds the scores.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base
from mlx_lm.models.cache import KVCache

from warmfleet_daemon.engine import decode_batch

_LOG2E = math.log2(math.e)
_HOOK_NAME = "scaled_dot_product_attention"


class SequenceBatch:
    """One layer's view of B independent KVCaches being decoded together. With
    `latent` (MLA), the values (the rotary key parts) come back as one zero-padded
    array, since the model multiplies them itself; the hook cuts each sequence's
    scores back to its own length."""

    def __init__(self, caches: Sequence[KVCache], *, latent: bool = False) -> None:
        self.caches = list(caches)
        self.latent = latent
        self.offset = mx.array([c.offset for c in self.caches])
        self.lengths = [c.offset + 1 for c in self.caches]  # after this step's token

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[list[mx.array], list[mx.array] | mx.array]:
        ks, vs = [], []
        for i, cache in enumerate(self.caches):
            k, v = cache.update_and_fetch(keys[i : i + 1], values[i : i + 1])
            ks.append(k)
            vs.append(v)
        if self.latent:
            return ks, _padded_stack(vs)
        return ks, vs

    def mask_of(self, mask: Any, i: int) -> Any:
        """Sequence i's part of the mask a layer passed (MLA's rotary scores)."""
        if mask is None:
            return None
        if not self.latent or not isinstance(mask, mx.array):
            raise NotImplementedError("an attention mask in a per-sequence decode batch")
        return mask[i : i + 1, ..., : self.lengths[i]]

    def make_mask(self, *args: Any, **kwargs: Any) -> None:
        return None  # one new token per sequence attends to all of its own keys


def _padded_stack(parts: list[mx.array]) -> mx.array:
    width = max(p.shape[2] for p in parts)
    padded = [
        mx.concatenate([p, mx.zeros((*p.shape[:2], width - p.shape[2], p.shape[3]), p.dtype)], 2)
        if p.shape[2] < width
        else p
        for p in parts
    ]
    return mx.concatenate(padded, axis=0)


def hook_modules(model: nn.Module) -> list[ModuleType]:
    """The Python modules of the model's layers that define mlx-lm's attention function
    (a wrapper such as mistral3's keeps its layers in another module)."""
    seen: dict[str, ModuleType] = {}
    for layer in layers(model):
        name = type(layer).__module__
        module = sys.modules.get(name)
        if name == base.__name__:  # where mlx-lm defines it: never rebound
            continue
        if module is not None and callable(getattr(module, _HOOK_NAME, None)):
            seen.setdefault(name, module)
    return list(seen.values())


def is_latent(model: nn.Module) -> bool:
    """Multi-head latent attention: layers with mlx-lm's per-head latent projections."""
    return any(hasattr(m, "embed_q") and hasattr(m, "unembed_out") for m in layers(model))


def layers(model: Any) -> list[Any]:
    """The model and its submodules (a model that is not an nn.Module: itself)."""
    modules = getattr(model, "modules", None)
    return [model, *modules()] if callable(modules) else [model]


def batch_layout(model: nn.Module) -> tuple[str | None, str]:
    """How decoding sequences can share a forward: ("heads", why) for per-head KV through
    the hook (most models), ("latent", why) for MLA, (None, why not) otherwise."""
    from mlx_lm.models.cache import make_prompt_cache

    kinds = sorted({type(c).__name__ for c in make_prompt_cache(model) if type(c) is not KVCache})
    if kinds:
        return None, f"{', '.join(kinds)} layers"
    if not hook_modules(model):
        return None, "attention outside mlx-lm's attention function"
    if is_latent(model):
        return "latent", "latent attention (MLA)"
    return "heads", "per-head KV"


def install(model: nn.Module, *, cpu: bool) -> bool:
    """Rebind the attention function of the model's modules to `attention`. Idempotent."""
    modules = hook_modules(model)
    for module in modules:
        current = getattr(module, _HOOK_NAME)
        original = getattr(current, "__wrapped_sdpa__", current)
        setattr(module, _HOOK_NAME, _make_hook(original, cpu))
    return bool(modules)


def _make_hook(original: Callable[..., mx.array], cpu: bool) -> Callable[..., mx.array]:
    def attention(
        queries: mx.array,
        keys: Any,
        values: Any,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> mx.array:
        if isinstance(cache, decode_batch.LayerView):
            # What the decode batch cannot apply must fail (the engine then decodes per
            # sequence), never be dropped.
            if sinks is not None:
                raise NotImplementedError("attention sinks in the decode batch")
            if cache.latent:
                if values is not keys:
                    raise NotImplementedError("latent attention with values besides the latent")
                return latent_rows_attention(queries, cache, scale, mask)
            if mask is not None:
                raise NotImplementedError("an attention mask in the decode batch")
            return rows_attention(queries, keys, values, cache, scale)
        if isinstance(cache, SequenceBatch):
            outs = [
                _one(
                    queries[i : i + 1],
                    k,
                    v,
                    scale,
                    cache.mask_of(mask, i),
                    original,
                    cpu,
                    sinks,
                    cache=cache.caches[i],  # a quantized cache's bits and group size
                )
                for i, (k, v) in enumerate(zip(keys, values))
            ]
            return mx.concatenate(outs, axis=0)
        return _one(queries, keys, values, scale, mask, original, cpu, sinks, cache=cache)

    attention.__wrapped_sdpa__ = original  # type: ignore[attr-defined]
    return attention


def rows_attention(
    queries: mx.array,
    keys: list[mx.array],
    values: list[mx.array],
    view: decode_batch.LayerView,
    scale: float,
) -> mx.array:
    """Decode attention for every row of the decode batch, each row group on its
    group's CPU stream (`LayerView.update_and_fetch` gave each group's keys and values)."""
    outs = []
    for group, k, v in zip(view.groups, keys, values):
        with mx.stream(group.stream):
            q = queries[group.start - view.first : group.stop - view.first]
            outs.append(blocked_decode_attention(q, k, v, scale, group.mask))
    return mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]


def latent_rows_attention(
    queries: mx.array, view: decode_batch.LayerView, scale: float, rotary: mx.array | None
) -> mx.array:
    """MLA decode attention for every row of the decode batch: queries (rows, heads, 1,
    latent) over each row's latents (keys and values at once), plus the rotary scores
    (rows, heads, 1, width) the layer computed from the padded values `update_and_fetch`
    gave it, sliced per row group as the keys are."""
    if rotary is None:
        raise NotImplementedError("latent attention without its rotary scores")
    outs = []
    heads = queries.shape[1]
    for group in view.groups:
        with mx.stream(group.stream):
            latents, _ = view.blocks(group)
            rows, start = group.stop - group.start, group.start - view.first
            extra = rotary[start : start + rows, :, :, : group.blocks * decode_batch.KEY_BLOCK]
            extra = extra.reshape(rows, 1, heads, group.blocks, decode_batch.KEY_BLOCK)
            extra = extra.transpose(0, 1, 3, 2, 4)  # as the scores: (rows, 1, blocks, heads, key)
            q = queries[start : start + rows]
            outs.append(blocked_decode_attention(q, latents, latents, scale, group.mask, extra))
    return mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]


def _one(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: Any,
    original: Callable[..., mx.array],
    cpu: bool,
    sinks: Any,
    cache: Any = None,
) -> mx.array:
    causal = isinstance(mask, str) and mask == "causal"
    plain = sinks is None and (mask is None or causal)
    if cpu and plain and hasattr(cache, "bits") and isinstance(k, tuple) and q.shape[2] > 1:
        # mlx's quantized matmul has no fast CPU kernel (a 512-token chunk over 9k quantized
        # keys: 3.1 s, dequantized then exp2: 0.56 s); one decoding query keeps it.
        return dequantized_attention(q, k, v, cache.group_size, cache.bits, scale, causal=causal)
    if cpu and plain and not hasattr(cache, "bits") and isinstance(k, mx.array):
        return exp2_attention(q, k, v, scale, causal=causal)
    return original(q, k, v, cache=cache, scale=scale, mask=mask, sinks=sinks)


def exp2_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, *, causal: bool
) -> mx.array:
    """softmax(q k^T * scale) v with grouped KV heads, computed with exp2. The query
    heads that share a KV head are stacked as rows: fewer, larger matmuls."""
    batch, heads, length, dim = q.shape
    kv_heads, keys_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    q = (q * (scale * _LOG2E)).reshape(batch, kv_heads, group * length, dim)
    scores = q @ k.swapaxes(-1, -2)
    if causal and length > 1:
        rows = mx.arange(keys_len - length, keys_len)[:, None]
        mask = mx.where(rows >= mx.arange(keys_len)[None], 0.0, -mx.inf)
        shape = scores.shape
        scores = (scores.reshape(batch, kv_heads, group, length, keys_len) + mask).reshape(shape)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores)
    out = (weights @ v) / weights.sum(axis=-1, keepdims=True)
    return out.reshape(batch, heads, length, -1)


def dequantized_attention(
    q: mx.array,
    k: tuple[mx.array, mx.array, mx.array],
    v: tuple[mx.array, mx.array, mx.array],
    group_size: int,
    bits: int,
    scale: float,
    *,
    causal: bool,
) -> mx.array:
    """`exp2_attention` over a quantized cache's keys and values (mlx's (packed, scales,
    biases) triples), dequantized first: what mlx-lm's quantized attention computes."""
    keys = mx.dequantize(k[0], k[1], k[2], group_size=group_size, bits=bits)
    values = mx.dequantize(v[0], v[1], v[2], group_size=group_size, bits=bits)
    return exp2_attention(q, keys, values, scale, causal=causal)


def blocked_decode_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: mx.array,
    extra: mx.array | None = None,
) -> mx.array:
    """One query per row over its keys split in blocks: q (rows, heads, 1, dim), k and v
    (rows, kv_heads, blocks, KEY_BLOCK, dim and value dim), mask (rows, 1, blocks, 1,
    KEY_BLOCK) additive, `extra` scores to add (already scaled; MLA's rotary part) shaped
    as the scores (rows, kv_heads, blocks, heads // kv_heads, KEY_BLOCK). Every sum over
    keys is per block, then a fixed pairwise tree over blocks, so the padding a row gets
    from its neighbours (masked: exact zeros) never changes its result. Softmax via
    exp2, as in `exp2_attention`."""
    rows, heads, _, dim = q.shape
    kv_heads = k.shape[1]
    q = (q * (scale * _LOG2E)).reshape(rows, kv_heads, 1, heads // kv_heads, dim)
    scores = q @ k.swapaxes(-1, -2) + mask  # (rows, kv_heads, blocks, group, KEY_BLOCK)
    if extra is not None:
        scores = scores + extra * _LOG2E
    weights = mx.power(2.0, scores - scores.max(axis=(2, 4), keepdims=True))
    out = _pairwise_sum(weights @ v, axis=2)
    total = _pairwise_sum(weights.sum(axis=-1, keepdims=True), axis=2)
    return (out / total).reshape(rows, heads, 1, -1)


def _pairwise_sum(x: mx.array, axis: int) -> mx.array:
    """Sum over `axis` as a tree of pairs (0+1, 2+3, ...; an odd last one carried up):
    trailing zeros leave the result bit-identical, whatever their count."""
    while x.shape[axis] > 1:
        n = x.shape[axis]
        index: list[slice] = [slice(None)] * x.ndim
        even, odd, last = list(index), list(index), list(index)
        even[axis], odd[axis], last[axis] = slice(0, n - 1, 2), slice(1, n, 2), slice(n - 1, n)
        paired = x[tuple(even)] + x[tuple(odd)]
        x = mx.concatenate([paired, x[tuple(last)]], axis=axis) if n % 2 else paired
    return x
