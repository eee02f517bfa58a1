"""Tiny random-weight models on the real tokenizer, for tests and experiments.

`tiny-random` is a 3-layer llama (hidden 64): it exercises every engine path (chunked
prefill, batching, the prefix cache) in milliseconds. `tiny-random-lfm2` (short
convolutions + attention: state that cannot be sliced) and `tiny-random-gemma3`
(sliding-window layers: rotating caches) cover caches that cannot be trimmed.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models import gemma3_text, lfm2, llama

ARCHITECTURES = ("llama", "lfm2", "gemma3")


def tiny_random_model(*, vocab_size: int, arch: str = "llama", seed: int = 0) -> nn.Module:
    mx.random.seed(seed)
    model = _build(arch, vocab_size)
    # With mlx's default init, logits are nearly flat and greedy decoding repeats one
    # token; scaling the matrices 3x gives varied, context-dependent continuations.
    model.update(
        tree_map(lambda p: (p * 3.0 if p.ndim == 2 else p).astype(mx.float32), model.parameters())
    )
    mx.eval(model.parameters())
    model.eval()
    return model


def _build(arch: str, vocab_size: int) -> Any:
    if arch == "llama":
        return llama.Model(
            llama.ModelArgs(
                model_type="llama",
                vocab_size=vocab_size,
                hidden_size=64,
                num_hidden_layers=3,
                intermediate_size=128,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-5,
                rope_theta=10000.0,
                max_position_embeddings=8192,
                tie_word_embeddings=True,
            )
        )
    if arch == "lfm2":
        return lfm2.Model(
            lfm2.ModelArgs(
                model_type="lfm2",
                vocab_size=vocab_size,
                hidden_size=64,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=8192,
                norm_eps=1e-5,
                conv_bias=False,
                conv_L_cache=3,
                block_dim=64,
                block_multiple_of=16,
                block_ffn_dim_multiplier=1.0,
                block_auto_adjust_ff_dim=False,
                block_ff_dim=128,
                full_attn_idxs=[1, 3],
            )
        )
    if arch == "gemma3":
        return gemma3_text.Model(
            gemma3_text.ModelArgs(
                model_type="gemma3_text",
                hidden_size=64,
                num_hidden_layers=4,
                intermediate_size=128,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                vocab_size=vocab_size,
                sliding_window=48,
                sliding_window_pattern=2,
                max_position_embeddings=8192,
            )
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; known: {ARCHITECTURES}")
