"""One prefix-cache block as safetensors (through mlx): the same bytes on disk and on
the wire, with the fingerprint, the block's key and span, and a checksum in the header.

Decoding verifies everything before a block can reach the cache: the format, the
fingerprint, the key and span it is expected to be, the checksum over the metadata and
every tensor byte, and each layer's shapes and dtypes against this model's own layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm.models.cache as cache_module
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_daemon.engine import kv

FORMAT = "warmfleet-kv-block/1"


class BlockError(ValueError):
    """A stored or received block that must not be used; the message says why."""


@dataclass(frozen=True)
class LayerLayout:
    cache_type: str
    kv_shape: tuple[int, int, int] | None  # (batch, kv heads, head dim) of a KVCache layer
    dtype: str | None
    itemsize: int = 0
    value_dim: int = 0  # the values' width: MLA stores a latent and a narrower rotary part
    # A quantized KV layer (--kv-bits): (batch, kv heads, width, dtype) of each part of
    # its keys, then of its values (packed, scales, biases); its group size and bits.
    quantized: tuple[tuple[int, int, int, str], ...] = ()
    group_size: int = 0
    bits: int = 0
    token_bytes: int = 0  # of a quantized layer, per token


def probe_layout(
    model: Any, kv_bits: int | None = None, group_size: int = 64
) -> tuple[LayerLayout, ...]:
    """Each layer's cache type and KV shape, from a 2-token forward. Call it before the
    engine thread starts (mlx work on one thread at a time)."""
    caches = kv.new_caches(model, kv_bits, group_size)
    model(mx.zeros((1, 2), dtype=mx.int32), cache=caches)
    payload = kv.extract_block(caches, 0, 2)
    out: list[LayerLayout] = []
    for cache, layer in zip(caches, payload.layers):
        if isinstance(layer, kv.KVSlice):
            b, h, _, d = layer.keys.shape
            out.append(
                LayerLayout(
                    type(cache).__name__,
                    (b, h, d),
                    str(layer.keys.dtype),
                    layer.keys.itemsize,
                    layer.values.shape[-1],
                )
            )
        elif isinstance(layer, kv.QuantizedSlice):
            parts = [*layer.keys, *layer.values]
            out.append(
                LayerLayout(
                    type(cache).__name__,
                    None,
                    None,
                    quantized=tuple(
                        (a.shape[0], a.shape[1], a.shape[3], str(a.dtype)) for a in parts
                    ),
                    group_size=layer.group_size,
                    bits=layer.bits,
                    token_bytes=sum(a.nbytes // a.shape[2] for a in parts),
                )
            )
        else:
            out.append(LayerLayout(type(cache).__name__, None, None))
    return tuple(out)


class BlockCodec:
    def __init__(self, fingerprint: str, layout: tuple[LayerLayout, ...]) -> None:
        self.fingerprint = fingerprint
        self.layout = layout

    def kv_bytes_per_token(self) -> int:
        return sum(
            layer.kv_shape[0]
            * layer.kv_shape[1]
            * (layer.kv_shape[2] + layer.value_dim)
            * layer.itemsize
            for layer in self.layout
            if layer.kv_shape is not None
        ) + sum(layer.token_bytes for layer in self.layout)

    def max_block_bytes(self, tokens: int) -> int:
        """An upper bound on one encoded block: its KV plus room for the logits, state
        snapshots and the header."""
        return self.kv_bytes_per_token() * tokens + (64 << 20)

    # -- encoding -------------------------------------------------------------------

    def encode(
        self, payload: kv.BlockPayload, chunk: Chunk, parent: BlockKey | None = None
    ) -> tuple[dict[str, mx.array], dict[str, str]]:
        """Arrays and metadata; `parent` (the block before it) is recorded for the disk
        tier, whose index is rebuilt from headers alone."""
        arrays: dict[str, mx.array] = {}
        meta = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "key": chunk.key.hex(),
            "start": str(chunk.start),
            "end": str(chunk.end),
            "layers": str(len(payload.layers)),
        }
        if parent is not None:
            meta["parent"] = parent.hex()
        for i, layer in enumerate(payload.layers):
            if isinstance(layer, kv.KVSlice):
                arrays[f"l{i}.keys"] = layer.keys
                arrays[f"l{i}.values"] = layer.values
                meta[f"l{i}.type"] = KVCache.__name__
            elif isinstance(layer, kv.QuantizedSlice):
                for j, part in enumerate([*layer.keys, *layer.values]):
                    arrays[f"l{i}.q{j}"] = part
                meta[f"l{i}.type"] = QuantizedKVCache.__name__
                meta[f"l{i}.quantized"] = f"{layer.group_size}/{layer.bits}"
            else:
                meta[f"l{i}.type"] = layer.cache_type.__name__
                meta[f"l{i}.state"] = json.dumps(_tree_out(layer.state, f"l{i}.s", arrays))
                meta[f"l{i}.meta"] = json.dumps(_tree_out(layer.meta_state, f"l{i}.m", arrays))
        if payload.logits is not None:
            arrays["logits"] = payload.logits
        meta["checksum"] = _checksum(arrays, meta)
        return arrays, meta

    def save(
        self, payload: kv.BlockPayload, chunk: Chunk, path: str, parent: BlockKey | None = None
    ) -> None:
        """Write the block to `path` (a path, not a file object: see _scratch_file)."""
        arrays, meta = self.encode(payload, chunk, parent)
        mx.save_safetensors(path, arrays, meta)

    def to_bytes(self, payload: kv.BlockPayload, chunk: Chunk) -> bytes:
        arrays, meta = self.encode(payload, chunk)
        with _scratch_file() as path:
            mx.save_safetensors(path, arrays, meta)
            return Path(path).read_bytes()

    # -- decoding -------------------------------------------------------------------

    def from_bytes(self, data: bytes, chunk: Chunk) -> kv.BlockPayload:
        with _scratch_file() as path:
            Path(path).write_bytes(data)
            return self.decode(*_load(path), chunk)

    def from_file(self, path: str, chunk: Chunk) -> kv.BlockPayload:
        return self.decode(*_load(path), chunk)

    def decode(
        self, arrays: dict[str, mx.array], meta: dict[str, Any], chunk: Chunk
    ) -> kv.BlockPayload:
        """The verified payload of `chunk`, or BlockError."""
        if meta.get("format") != FORMAT:
            raise BlockError(f"unknown block format {meta.get('format')!r}")
        if meta.get("fingerprint") != self.fingerprint:
            raise BlockError(
                f"fingerprint {meta.get('fingerprint')} is not this model's {self.fingerprint} "
                "(other weights, tokenizer, template, block size or mlx version)"
            )
        try:
            mx.eval(list(arrays.values()))  # a truncated file fails here, not later
        except (RuntimeError, ValueError) as exc:
            raise BlockError(f"unreadable block ({exc})") from exc
        if meta.get("checksum") != _checksum(arrays, meta):
            raise BlockError("checksum mismatch (corrupt block)")
        span = (meta.get("key"), meta.get("start"), meta.get("end"))
        if span != (chunk.key.hex(), str(chunk.start), str(chunk.end)):
            raise BlockError(
                f"block is {span}, expected {chunk.key.hex()} [{chunk.start}:{chunk.end})"
            )
        if meta.get("layers") != str(len(self.layout)):
            raise BlockError(f"{meta.get('layers')} layers; the model has {len(self.layout)}")
        layers: list[kv.LayerState] = []
        for i, expected in enumerate(self.layout):
            if meta.get(f"l{i}.type") != expected.cache_type:
                got = meta.get(f"l{i}.type")
                raise BlockError(f"layer {i} is {got}, not {expected.cache_type}")
            if expected.quantized:
                layers.append(_quantized_layer(i, expected, arrays, meta, chunk.size))
            elif expected.kv_shape is not None:
                keys, values = arrays.get(f"l{i}.keys"), arrays.get(f"l{i}.values")
                b, h, d = expected.kv_shape
                for a, width in ((keys, d), (values, expected.value_dim)):
                    want = (b, h, chunk.size, width)
                    if a is None or tuple(a.shape) != want or str(a.dtype) != expected.dtype:
                        raise BlockError(f"layer {i}: KV is not {want} {expected.dtype}")
                assert keys is not None and values is not None
                layers.append(kv.KVSlice(keys, values))
            else:
                cache_type = getattr(cache_module, expected.cache_type, None)
                if not isinstance(cache_type, type):
                    raise BlockError(f"layer {i}: unknown cache type {expected.cache_type}")
                try:
                    state = _tree_in(json.loads(meta[f"l{i}.state"]), arrays)
                    meta_state = _tree_in(json.loads(meta[f"l{i}.meta"]), arrays)
                except (KeyError, ValueError, TypeError) as exc:
                    raise BlockError(f"layer {i}: unreadable state ({exc})") from exc
                layers.append(kv.Snapshot(cache_type, state, meta_state))
        logits = arrays.get("logits")
        if logits is not None and (logits.ndim != 2 or logits.shape[0] != 1):
            raise BlockError(f"logits of shape {tuple(logits.shape)}, not (1, vocab)")
        everything = list(arrays.values())
        return kv.BlockPayload(tuple(layers), sum(a.nbytes for a in everything), logits)


def _quantized_layer(
    i: int, expected: LayerLayout, arrays: dict[str, mx.array], meta: dict[str, Any], size: int
) -> kv.QuantizedSlice:
    """Layer i of a block of quantized KV, its parts checked against this model's."""
    if meta.get(f"l{i}.quantized") != f"{expected.group_size}/{expected.bits}":
        raise BlockError(f"layer {i}: quantized as {meta.get(f'l{i}.quantized')}")
    parts = []
    for j, (b, h, width, dtype) in enumerate(expected.quantized):
        part = arrays.get(f"l{i}.q{j}")
        if part is None or tuple(part.shape) != (b, h, size, width) or str(part.dtype) != dtype:
            raise BlockError(f"layer {i}: quantized part {j} is not {(b, h, size, width)} {dtype}")
        parts.append(part)
    half = len(parts) // 2
    return kv.QuantizedSlice(
        tuple(parts[:half]), tuple(parts[half:]), expected.group_size, expected.bits
    )


@contextmanager
def _scratch_file() -> Iterator[str]:
    # mlx reads and writes Python file objects through callbacks that deadlock with an
    # engine thread evaluating at the same time (seen here); paths do not.
    fd, path = tempfile.mkstemp(prefix="warmfleet-block-", suffix=".safetensors")
    os.close(fd)
    try:
        yield path
    finally:
        os.unlink(path)


def _load(source: str) -> tuple[dict[str, mx.array], dict[str, Any]]:
    try:
        arrays, meta = mx.load(source, format="safetensors", return_metadata=True)
    except (RuntimeError, ValueError, OSError) as exc:  # truncated or not safetensors
        raise BlockError(f"unreadable block ({exc})") from exc
    if not isinstance(arrays, dict) or not isinstance(meta, dict):
        raise BlockError("not a block file")
    return arrays, meta


def _checksum(arrays: dict[str, mx.array], meta: dict[str, Any]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(meta):
        if name != "checksum":
            h.update(f"{name}={meta[name]}\n".encode())
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}|{a.dtype}|{tuple(a.shape)}\n".encode())
        view = memoryview(a)  # type: ignore[arg-type]
        if not view.c_contiguous:  # not seen (blocks are contiguous copies), but be exact
            dense = mx.contiguous(a)
            mx.eval(dense)
            view = memoryview(dense)  # type: ignore[arg-type]
        h.update(view.cast("B"))
    return h.hexdigest()


def _tree_out(tree: Any, prefix: str, arrays: dict[str, mx.array]) -> Any:
    """A JSON shape of a cache state with its arrays moved into `arrays`."""
    if isinstance(tree, mx.array):
        name = f"{prefix}.{len([k for k in arrays if k.startswith(prefix + '.')])}"
        arrays[name] = tree
        return {"a": name}
    if isinstance(tree, (list, tuple)):
        kind = "t" if isinstance(tree, tuple) else "l"
        return {kind: [_tree_out(t, prefix, arrays) for t in tree]}
    if tree is None or isinstance(tree, (int, float, str, bool)):
        return {"v": tree}
    raise TypeError(f"cannot store a {type(tree).__name__} in a cache state")


def _tree_in(shape: Any, arrays: dict[str, mx.array]) -> Any:
    if "a" in shape:
        return arrays[shape["a"]]
    if "l" in shape:
        return [_tree_in(s, arrays) for s in shape["l"]]
    if "t" in shape:
        return tuple(_tree_in(s, arrays) for s in shape["t"])
    return shape["v"]
