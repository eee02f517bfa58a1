"""The KV of every decoding sequence in one buffer per layer, for batched decode attention.

Each decoding sequence owns a row of per-layer buffers shaped (rows, kv_heads,
capacity, head_dim); a decode step writes every row's new key and value with one
scatter and runs attention for all rows at once over the first `blocks` key blocks
(`attention.blocked_decode_attention`). Rows stay packed: a sequence that leaves is
replaced by the last row.

Why the key blocks: every sum over keys is taken per block of `KEY_BLOCK` keys and the
blocks are then added in a fixed pairwise tree, so a row's arithmetic is the same
whether the batch pads it to 1 block or to 9 (masked keys add exact zeros). A response
therefore does not depend on what it was batched with, which is what keeps a cached
response token-identical to an uncached one on a busy server.

Keys and values may differ in width (DeepSeek V2's 192-wide keys, 128-wide values).
With `latent` (multi-head latent attention: the latent as keys, the rotary key part as
values), a step hands the layer its keys and values as plain arrays over every row,
padded to the step's key blocks, because the layer multiplies the values itself; the
attention hook then reads the latents in blocks (`LayerView.blocks`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

KEY_BLOCK = 64  # keys per attention block: a row is padded to a multiple of this
_GROW = 256  # capacity grows in these steps (a multiple of KEY_BLOCK): regrowth copies
# Keys (summed over rows) a step must attend before its rows are split over several CPU
# streams: below this, the extra ops cost more than the second core saves (measured
# here: 8 rows of 100 keys 0.76 ms in one group, 0.96 in two; of 1,500 keys 10.8 vs 6.5).
_SPLIT_KEYS = 4096


@dataclass(frozen=True)
class RowGroup:
    """Rows [start, stop) of a step, attended on their own CPU stream, padded to their
    own longest row: the cores share the attention work."""

    start: int
    stop: int
    blocks: int  # key blocks read
    mask: mx.array  # (rows, 1, blocks, 1, KEY_BLOCK): 0 for a row's keys, -inf after
    stream: mx.Stream


class DecodeBatch:
    """Rows of per-layer KV buffers; row i belongs to the i-th admitted, still-running
    sequence (the caller mirrors `release`'s move of the last row)."""

    def __init__(self, max_rows: int, streams: int | None = None, *, latent: bool = False) -> None:
        self.max_rows = max_rows
        self.latent = latent
        self._stream_count = max(streams if streams is not None else min(os.cpu_count() or 1, 4), 1)
        self._streams: dict[int, list[mx.Stream]] = {}  # MLX streams belong to a thread
        self.lengths: list[int] = []  # tokens in each row's KV
        self._keys: list[mx.array] = []  # per layer: (rows, kv_heads, capacity, head_dim)
        self._values: list[mx.array] = []

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self._keys[0].shape[2] if self._keys else 0

    @property
    def allocated_rows(self) -> int:
        return self._keys[0].shape[0] if self._keys else 0

    def admit(self, caches: Sequence[KVCache]) -> int:
        """Copy a prefilled sequence's KV into a new row; returns the row."""
        length = caches[0].offset
        row = len(self.lengths)
        if not self._keys:  # the first sequence gives the layers' shapes and dtypes
            for cache in caches:
                assert cache.keys is not None and cache.values is not None
                _, heads, _, dim = cache.keys.shape
                _, value_heads, _, value_dim = cache.values.shape
                if value_heads != heads:  # one flat index serves keys and values
                    raise NotImplementedError(f"{heads} key heads but {value_heads} value heads")
                self._keys.append(mx.zeros((1, heads, KEY_BLOCK, dim), dtype=cache.keys.dtype))
                self._values.append(
                    mx.zeros((1, heads, KEY_BLOCK, value_dim), dtype=cache.values.dtype)
                )
        self._ensure(rows=row + 1, tokens=length + 1)
        for i, cache in enumerate(caches):
            assert cache.keys is not None and cache.values is not None
            self._keys[i][row, :, :length, :] = cache.keys[0, :, :length, :]
            self._values[i][row, :, :length, :] = cache.values[0, :, :length, :]
        mx.eval(self._keys, self._values)
        self.lengths.append(length)
        return row

    def release(self, row: int) -> int | None:
        """Free `row`; the last row moves into it. Returns the row that moved (now at
        `row`), or None when `row` was the last one."""
        last = len(self.lengths) - 1
        moved: int | None = None
        if row != last:
            n = self.lengths[last]
            # Copied out first, so the buffers are updated in place, not copied whole.
            rows = [
                [mx.contiguous(b[last, :, :n, :]) for b in bs] for bs in (self._keys, self._values)
            ]
            mx.eval(rows)
            for buffers, moving in zip((self._keys, self._values), rows):
                for buf, data in zip(buffers, moving):
                    buf[row, :, :n, :] = data
            self.lengths[row] = n
            moved = last
        self.lengths.pop()
        if self.lengths:
            mx.eval(self._keys, self._values)
        else:
            self.reset()  # an idle engine holds no decode buffers
        return moved

    def reset(self) -> None:
        self.lengths.clear()
        self._keys.clear()
        self._values.clear()

    def step_views(self, first: int = 0, stop: int | None = None) -> list[LayerView]:
        """The per-layer cache views for one decode step of rows [first, stop) (all by
        default; a step may take its rows in several ranges, then `advance` once)."""
        stop = len(self.lengths) if stop is None else stop
        self._ensure(rows=len(self.lengths), tokens=max(self.lengths) + 1)
        positions = mx.array(self.lengths[first:stop])
        capacity = self.capacity
        heads = self._keys[0].shape[1]
        # Flat (rows * heads * capacity) index of each row's and head's next position.
        slots = (mx.arange(first, stop)[:, None] * heads + mx.arange(heads)[None]) * capacity
        flat = (slots + positions[:, None]).reshape(-1)
        groups = [self._group(a, b, stream) for a, b, stream in self._split(first, stop)]
        return [
            LayerView(self, i, flat, groups, positions, first=first, latent=self.latent)
            for i in range(len(self._keys))
        ]

    def advance(self) -> None:
        """Every row gained the token its step wrote."""
        self.lengths = [n + 1 for n in self.lengths]

    def row_kv(self, row: int) -> list[tuple[mx.array, mx.array]]:
        """A row's (keys, values) per layer, each (1, kv_heads, length, dim)."""
        n = self.lengths[row]
        return [
            (k[row : row + 1, :, :n, :], v[row : row + 1, :, :n, :])
            for k, v in zip(self._keys, self._values)
        ]

    def buffers(self) -> list[mx.array]:
        return [*self._keys, *self._values]

    # -- helpers --------------------------------------------------------------------

    def _ensure(self, *, rows: int, tokens: int) -> None:
        if rows <= self.allocated_rows and tokens <= self.capacity:
            return
        new_rows = max(rows, self.allocated_rows)
        if rows > self.allocated_rows:  # double, so admissions rarely copy
            new_rows = min(max(rows, 2 * self.allocated_rows), max(self.max_rows, rows))
        new_capacity = max(self.capacity, _round_up(tokens + _GROW // 2, _GROW))
        self._keys = [_grown(b, new_rows, new_capacity) for b in self._keys]
        self._values = [_grown(b, new_rows, new_capacity) for b in self._values]
        mx.eval(self._keys, self._values)

    def _write(self, layer: int, flat: mx.array, keys: mx.array, values: mx.array) -> None:
        for buffers, new in ((self._keys, keys), (self._values, values)):
            buf = buffers[layer]
            dim = buf.shape[-1]
            view = buf.reshape(-1, dim)
            view[flat] = new.reshape(-1, dim)  # in place: the buffer has no other reader
            buffers[layer] = view.reshape(buf.shape)

    def _read_flat(
        self, layer: int, first: int, stop: int, width: int
    ) -> tuple[mx.array, mx.array]:
        keys, values = self._keys[layer], self._values[layer]
        return keys[first:stop, :, :width], values[first:stop, :, :width]

    def _read(self, layer: int, group: RowGroup) -> tuple[mx.array, mx.array]:
        out = []
        for buf in (self._keys[layer], self._values[layer]):
            r, heads, capacity, dim = buf.shape
            split = buf.reshape(r, heads, capacity // KEY_BLOCK, KEY_BLOCK, dim)
            out.append(split[group.start : group.stop, :, : group.blocks])
        return out[0], out[1]

    def _split(self, first: int, stop: int) -> list[tuple[int, int, mx.Stream]]:
        rows = stop - first
        if sum(self.lengths[first:stop]) < _SPLIT_KEYS or rows == 1:  # the step's own stream
            return [(first, stop, mx.default_stream(mx.cpu))]
        streams = self._streams.get(threading.get_ident())
        if streams is None:
            streams = [mx.new_stream(mx.cpu) for _ in range(self._stream_count)]
            self._streams[threading.get_ident()] = streams
        count = min(len(streams), rows)
        bounds = [first + rows * i // count for i in range(count + 1)]
        return [(bounds[i], bounds[i + 1], streams[i]) for i in range(count)]

    def _group(self, start: int, stop: int, stream: mx.Stream) -> RowGroup:
        lengths = self.lengths[start:stop]
        blocks = -(-(max(lengths) + 1) // KEY_BLOCK)
        keys = mx.arange(blocks * KEY_BLOCK).reshape(1, 1, blocks, 1, KEY_BLOCK)
        own = mx.array(lengths).reshape(-1, 1, 1, 1, 1)
        return RowGroup(start, stop, blocks, mx.where(keys <= own, 0.0, -mx.inf), stream)


class LayerView:
    """What a model layer sees as its cache during a batched decode step."""

    def __init__(
        self,
        batch: DecodeBatch,
        layer: int,
        flat: mx.array,
        groups: list[RowGroup],
        offset: mx.array,
        *,
        first: int = 0,
        latent: bool = False,
    ) -> None:
        self._batch = batch
        self._layer = layer
        self._flat = flat
        self.groups = groups
        self.offset = offset  # each row's position of the token being decoded (RoPE)
        self.first = first  # the batch row of the step's first input row
        self.latent = latent

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        """What a model layer calls: `store_and_read`, or with `latent` every row's keys
        and values as (rows, kv_heads, width, dim), width the step's key blocks."""
        if not self.latent:
            return self.store_and_read(keys, values)
        self._batch._write(self._layer, self._flat, keys, values)
        width = max(g.blocks for g in self.groups) * KEY_BLOCK
        return self._batch._read_flat(self._layer, self.first, self.groups[-1].stop, width)

    def store_and_read(
        self, keys: mx.array, values: mx.array
    ) -> tuple[list[mx.array], list[mx.array]]:
        """Store each row's new key/value; return each group's keys and values, shaped
        (rows, kv_heads, blocks, KEY_BLOCK, dim)."""
        self._batch._write(self._layer, self._flat, keys, values)
        reads = [self._batch._read(self._layer, g) for g in self.groups]
        return [k for k, _ in reads], [v for _, v in reads]

    def blocks(self, group: RowGroup) -> tuple[mx.array, mx.array]:
        """A row group's keys and values in blocks, (rows, kv_heads, blocks, KEY_BLOCK,
        dim), as `update_and_fetch` returns them without `latent`."""
        return self._batch._read(self._layer, group)

    def make_mask(self, *args: Any, **kwargs: Any) -> None:
        return None  # each group has its own (`RowGroup.mask`)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _grown(buf: mx.array, rows: int, capacity: int) -> mx.array:
    r, heads, cap, dim = buf.shape
    out = mx.zeros((rows, heads, capacity, dim), dtype=buf.dtype)
    out[:r, :, :cap, :] = buf
    return out
