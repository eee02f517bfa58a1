"""The fingerprint of everything that makes a block's KV valid elsewhere: the weights,
their dtypes and the architecture, the tokenizer, the chat template, the chunk plan,
and the arithmetic (mlx version, device). Blocks only move between equal fingerprints.

Weights are fingerprinted by their shapes, dtypes and a fixed sample of every tensor's
values, not by a full hash: reading 16 GB of an 8B model would cost a restart more
than the prefill it saves, and any fine-tune or re-quantization changes the samples.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from warmfleet_daemon.models.loader import LoadedModel

VERSION = 2  # bump when the chunk plan rule, the block format or prefill arithmetic changes
_SAMPLES = 256  # values per tensor


def model_fingerprint(loaded: LoadedModel, block_size: int, kv_bits: int | None = None) -> str:
    h = hashlib.blake2b(digest_size=16)

    def part(label: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        h.update(f"{label}:{len(raw)}:".encode())
        h.update(raw)

    part("version", str(VERSION))
    part("mlx", str(getattr(mx, "__version__", "?")))
    part("device", "gpu" if loaded.on_gpu else "cpu")
    if loaded.on_gpu and mx.default_device() != mx.gpu:  # the Mac path forced on a CPU
        part("runs on", str(mx.default_device()))
    part("block_size", str(block_size))
    if kv_bits is not None:  # unquantized fingerprints stay what they were
        part("kv_bits", str(kv_bits))
    args = getattr(loaded.model, "args", None)
    part("args", json.dumps(_plain(args), sort_keys=True, default=str))
    for name, weight in tree_flatten(loaded.model.parameters()):
        part("w", f"{name}|{weight.shape}|{weight.dtype}")
        part("v", _sample(weight))
    tokenizer = loaded.tokenizer
    part("tokenizer", _tokenizer_text(tokenizer))
    part("eos", json.dumps(sorted(tokenizer.eos_token_ids)))
    part("template", str(getattr(tokenizer, "chat_template", None) or ""))
    return h.hexdigest()


def _sample(weight: mx.array) -> bytes:
    flat = weight.reshape(-1)
    step = max(1, flat.size // _SAMPLES)
    picked = mx.contiguous(flat[::step][:_SAMPLES])
    mx.eval(picked)
    return bytes(memoryview(picked))  # type: ignore[arg-type]


def _tokenizer_text(tokenizer: Any) -> str:
    backend = getattr(getattr(tokenizer, "_tokenizer", None), "backend_tokenizer", None)
    if backend is not None:
        return str(backend.to_str())  # vocabulary, merges, normalizers, added tokens
    vocab = tokenizer.vocab if hasattr(tokenizer, "vocab") else {}
    return json.dumps(sorted(vocab.items()))


def _plain(args: Any) -> Any:
    if args is None:
        return None
    if hasattr(args, "__dict__"):
        return {k: v for k, v in vars(args).items() if not k.startswith("_")}
    return str(args)
