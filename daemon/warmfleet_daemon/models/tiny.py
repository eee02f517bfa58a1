"""A tiny random-weight llama on the real tokenizer: exercises every engine path
(chunked prefill, batching, the prefix cache) in milliseconds instead of seconds."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

TINY_CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def tiny_random_model(*, vocab_size: int, seed: int = 0) -> nn.Module:
    args = llama.ModelArgs(
        model_type="llama",
        vocab_size=vocab_size,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        **TINY_CONFIG,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    model.update(_scaled_float32(model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    return model


def _scaled_float32(params: dict) -> dict:  # type: ignore[type-arg]
    # With mlx's default init, logits are nearly flat and greedy decoding repeats one
    # token; scaling the matrices 3x gives varied, context-dependent continuations.
    from mlx.utils import tree_map

    return tree_map(  # type: ignore[no-any-return]
        lambda p: (p * 3.0 if p.ndim == 2 else p).astype(mx.float32), params
    )
