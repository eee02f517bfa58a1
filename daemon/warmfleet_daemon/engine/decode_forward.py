"""One decode step of every row of the decode batch, for llama-family models on the CPU.

It computes what mlx-lm's module forward computes, up to float32 rounding (the tests
compare the two); mlx-lm's stays the path for prefill, Metal and other architectures.
Written by hand because a CPU decode step of a small batch is spent in small matmuls
and element-wise ops, and four changes make it faster (docs/PERFORMANCE.md):

1. Matmuls as `W @ x^T`, the weight's rows in BLAS's M dimension: OpenBLAS splits them
   over the cores, where `x @ W^T` with 8 rows runs on one. In groups of at most
   `ROW_GROUP` rows, for which OpenBLAS gives a row bitwise the same result whatever
   its neighbours (tests assert solo = batched), so a response never depends on what
   it was batched with.
2. q, k, v and gate, up in one matmul each: their weights are copied into one array
   once and the modules' weights become views of it (no memory is added; prefill reads
   the same values).
3. RoPE of q and k together, as a batched matmul with each row's rotation matrix,
   built once per step for all layers (mx.fast.rope is a chain of ops on the CPU).
4. SwiGLU through exp2 (`activation.swiglu`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import activations

from warmfleet_daemon.engine import activation, attention, decode_batch

# Rows per matmul. OpenBLAS 0.3.21 (Haswell kernels) keeps `W @ x^T` row-independent up
# to 30 rows and `x @ W^T` up to 12 (measured here); the tests check it on every run.
ROW_GROUP = 16

_MODULES = frozenset({"mlx_lm.models.llama", "mlx_lm.models.qwen2"})  # llama, mistral, qwen2


def supports(model: nn.Module) -> bool:
    """True for float32 llama/mistral/qwen2 models of mlx-lm with plain linear layers,
    RMSNorm, nn.RoPE and full attention in every layer."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if type(model).__module__ not in _MODULES or not layers:
        return False
    if not isinstance(getattr(inner, "embed_tokens", None), nn.Embedding):
        return False
    return all(_plain_block(block) for block in layers)


class DecodeForward:
    """Call with the step's input tokens (rows,) and the decode batch's layer views;
    returns the final hidden states (rows, hidden)."""

    def __init__(self, model: nn.Module) -> None:
        assert supports(model), "DecodeForward needs a plain llama-family model"
        inner: Any = model.model
        self._embed = inner.embed_tokens
        self._norm = inner.norm
        self._layers = [_Layer(block) for block in inner.layers]
        self._rotation = _Rotation(inner.layers[0].self_attn.rope, self._layers[0].head_dim)
        mx.eval(model.parameters())

    def __call__(self, tokens: mx.array, views: Sequence[decode_batch.LayerView]) -> mx.array:
        h = self._embed(tokens)
        rotation = self._rotation.matrices(views[0].offset)
        for layer, view in zip(self._layers, views):
            h = layer(h, view, rotation)
        return self._norm(h)  # type: ignore[no-any-return]


class _Layer:
    def __init__(self, block: Any) -> None:
        attn, mlp = block.self_attn, block.mlp
        self.heads, self.kv_heads = attn.n_heads, attn.n_kv_heads
        self.head_dim = attn.q_proj.weight.shape[0] // attn.n_heads
        self.scale = attn.scale
        self.qkv, self.qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up, _ = _fuse([mlp.gate_proj, mlp.up_proj])
        self.o = attn.o_proj.weight
        self.down = mlp.down_proj.weight
        self.norms = (block.input_layernorm, block.post_attention_layernorm)

    def __call__(self, h: mx.array, view: decode_batch.LayerView, rotation: mx.array) -> mx.array:
        rows, dim = h.shape[0], self.head_dim
        pre, post = self.norms
        qkv = _matmul(self.qkv, mx.fast.rms_norm(h, pre.weight, pre.eps).T)  # (out, rows)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias[:, None]
        qkv = qkv.T
        qk_width = (self.heads + self.kv_heads) * dim
        qk = qkv[:, :qk_width].reshape(rows, self.heads + self.kv_heads, dim) @ rotation
        queries = qk[:, : self.heads, None, :]
        keys, values = view.store_and_read(
            qk[:, self.heads :, None, :],
            qkv[:, qk_width:].reshape(rows, self.kv_heads, 1, dim),
        )
        out = attention.rows_attention(queries, keys, values, view, self.scale)
        h = h + _matmul(self.o, out.reshape(rows, -1).T).T
        gate_up = _matmul(self.gate_up, mx.fast.rms_norm(h, post.weight, post.eps).T)
        width = gate_up.shape[0] // 2
        return h + _matmul(self.down, activation.swiglu(gate_up[:width], gate_up[width:])).T


class _Rotation:
    """Per-row RoPE as a matrix: `x @ R[row]` rotates x (heads, head_dim) of a token at
    the row's position, as nn.RoPE(dims, traditional, base, scale) does."""

    def __init__(self, rope: nn.RoPE, head_dim: int) -> None:
        dims, half = rope.dims, rope.dims // 2
        inv = rope.base ** (-mx.arange(0, dims, 2, dtype=mx.float32) / dims)  # per pair
        cols = mx.arange(head_dim)
        pair = cols // 2 if rope.traditional else cols % half
        rotated = cols < dims  # partial rotary: columns past `dims` pass through
        # Column b's frequency (0 past dims: cos 1, sin 0) and the row of its partner.
        self._freqs = mx.where(rotated, inv[mx.minimum(pair, half - 1)], 0.0) * rope.scale
        if rope.traditional:
            partner, sign = cols ^ 1, mx.where(cols % 2 == 0, -1.0, 1.0)
        else:
            partner, sign = (cols + half) % dims, mx.where(cols < half, -1.0, 1.0)
        # partner_sign[a, b]: x[a]'s coefficient (times sin) in out[b]
        hit = (mx.arange(head_dim)[:, None] == partner[None]) & rotated[None]
        self._partner_sign = mx.where(hit, sign[None], 0.0)
        self._eye = mx.eye(head_dim)
        mx.eval(self._freqs, self._partner_sign, self._eye)

    def matrices(self, positions: mx.array) -> mx.array:
        """(rows, head_dim, head_dim) for the rows' positions (rows,)."""
        theta = positions.astype(mx.float32)[:, None] * self._freqs[None]  # (rows, head_dim)
        cos, sin = mx.cos(theta)[:, None, :], mx.sin(theta)[:, None, :]
        return self._eye[None] * cos + self._partner_sign[None] * sin


def _plain_block(block: Any) -> bool:
    attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
    if attn is None or mlp is None or getattr(block, "use_sliding", False):
        return False
    linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(layer) is nn.Linear for layer in linears):
        return False
    if any(layer.weight.dtype != mx.float32 for layer in linears):  # type: ignore[union-attr]
        return False
    if any("bias" in layer for layer in linears[3:]):  # type: ignore[operator]
        return False  # o_proj and the MLP without bias, as in llama and qwen2
    if len({"bias" in layer for layer in linears[:3]}) != 1:  # type: ignore[operator]
        return False
    norms = (
        getattr(block, "input_layernorm", None),
        getattr(block, "post_attention_layernorm", None),
    )
    if not all(type(n) is nn.RMSNorm for n in norms):
        return False
    # mlx-lm's llama and qwen2 MLPs call the module's swiglu; we compute the same.
    module = sys.modules[type(block).__module__]
    uses_swiglu = getattr(module, "swiglu", None) in (
        activation.swiglu,
        activations.swiglu,
    )
    return type(attn.rope) is nn.RoPE and uses_swiglu


def _fuse(linears: list[nn.Linear]) -> tuple[mx.array, mx.array | None]:
    """One (sum of outputs, inputs) weight for several linears reading the same input;
    each linear's weight (and bias) becomes a row-slice view of it."""
    weight = mx.concatenate([layer.weight for layer in linears], axis=0)
    has_bias = "bias" in linears[0]
    bias = mx.concatenate([layer.bias for layer in linears]) if has_bias else None
    mx.eval(weight, *([bias] if bias is not None else []))
    start = 0
    for layer in linears:
        rows = layer.weight.shape[0]
        layer.weight = weight[start : start + rows]
        if bias is not None:
            layer.bias = bias[start : start + rows]
        start += rows
    return weight, bias


def _matmul(weight: mx.array, columns: mx.array) -> mx.array:
    """weight @ columns for columns (in, rows), in groups of at most ROW_GROUP rows."""
    rows = columns.shape[1]
    if rows <= ROW_GROUP:
        return weight @ columns
    parts = [weight @ columns[:, i : i + ROW_GROUP] for i in range(0, rows, ROW_GROUP)]
    return mx.concatenate(parts, axis=1)
