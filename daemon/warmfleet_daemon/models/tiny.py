"""Tiny random-weight models on the real tokenizer, for tests and experiments.

Each family is a config.json-style dict for mlx-lm's own model class of that
`model_type` (what `mlx_lm.load` would build from a real checkpoint's config), with
tiny dimensions: a forward of a few dozen tokens takes milliseconds. `tiny-random`
is the 3-layer llama every engine test uses; `tiny-random-<family>` any other
(`tiny-random-lfm2`: short convolutions + attention, state that cannot be sliced;
`tiny-random-gemma3`: sliding-window layers, rotating caches; `tiny-random-deepseek_v3`:
multi-head latent attention).
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.utils import MODEL_REMAPPING

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 8192,
}
_MOE: dict[str, Any] = {"moe_intermediate_size": 32, "num_experts_per_tok": 2}
# Multi-head latent attention (DeepSeek V2/V3, Kimi K2, GLM-4.7-Flash): a 32-wide latent
# and 8 rotary dims per head; 32-wide inputs so 4-bit quantizes the per-head matrices too.
_MLA: dict[str, Any] = {
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "num_key_value_heads": 4,
}
_YARN: dict[str, Any] = {  # DeepSeek V2/V3's rope scaling (their real configs)
    "type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

# Keyed by mlx-lm model_type (what a checkpoint's config.json says).
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "num_hidden_layers": 3, "tie_word_embeddings": True},
    "qwen2": {**_COMMON, "tie_word_embeddings": False},
    "qwen3": {**_COMMON, "head_dim": 16, "tie_word_embeddings": True},
    "qwen3_moe": {
        **_COMMON,
        **_MOE,
        "head_dim": 16,
        "num_experts": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "mistral3": {  # Ministral 3 inside the Mistral 3 wrapper, with its YaRN rope
        "text_config": {
            **_COMMON,
            "model_type": "ministral3",
            "head_dim": 16,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 16.0,
                "original_max_position_embeddings": 512,
                "llama_4_scaling_beta": 0.1,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        }
    },
    "gemma2": {**_COMMON, "head_dim": 16, "query_pre_attn_scalar": 16.0},
    "gemma3_text": {  # every second layer slides over 48 tokens (prompts are longer)
        **_COMMON,
        "num_hidden_layers": 4,
        "head_dim": 16,
        "sliding_window": 48,
        "sliding_window_pattern": 2,
    },
    "phi3": {**_COMMON, "partial_rotary_factor": 0.5},
    "olmo2": {**_COMMON},
    "granite": {
        **_COMMON,
        "logits_scaling": 2.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 4.0,
        "residual_multiplier": 0.5,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "gpt_oss": {  # sliding and full layers, attention sinks, MoE
        **_COMMON,
        "intermediate_size": 64,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "qwen3_next": {  # gated delta-net layers + full attention every second layer
        **_COMMON,
        **_MOE,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [],
        "partial_rotary_factor": 0.5,
        "full_attention_interval": 2,
    },
    "deepseek_v3": {**_COMMON, **_MOE, **_MLA, "rope_scaling": _YARN},
    "deepseek_v2": {
        **_COMMON,
        **_MOE,
        **_MLA,
        "rope_scaling": _YARN,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
    },
    "glm4_moe_lite": {**_COMMON, **_MOE, **_MLA},
    "kimi_k2": {**_COMMON, **_MOE, **_MLA, "rope_scaling": _YARN},  # mlx-lm runs it as deepseek_v3
    "lfm2": {
        **_COMMON,
        "num_hidden_layers": 4,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "block_ff_dim": 128,
        "full_attn_idxs": [1, 3],
    },
    "mamba2": {  # a pure state-space model: no attention, no KV
        "num_heads": 4,
        "head_dim": 32,
        "hidden_size": 64,
        "intermediate_size": 128,
        "state_size": 16,
        "num_hidden_layers": 2,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
        "time_step_limit": (0.0, float("inf")),
        "time_step_rank": "auto",
    },
    # DeepSeek V4's compressed sliding-window attention: its per-layer cache cannot be
    # rebuilt from a stored state (no `state` setter), so the engine refuses it at start.
    "deepseek_v41": {
        **_COMMON,
        **_MOE,
        "num_attention_heads": 4,
        "head_dim": 32,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "o_groups": 2,
        "o_lora_rank": 32,
        "n_routed_experts": 4,
        "sliding_window": 16,
        "compress_ratios": [1, 4],
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 8,
        "hc_mult": 2,
    },
}
_ALIASES = {"gemma3": "gemma3_text"}
ARCHITECTURES = tuple(CONFIGS) + tuple(_ALIASES)


def tiny_config(arch: str, vocab_size: int) -> dict[str, Any]:
    """The config.json of a tiny `arch` model (`model_type` and `vocab_size` set)."""
    family = _ALIASES.get(arch, arch)
    if family not in CONFIGS:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    config = copy.deepcopy(CONFIGS[family])
    config["model_type"] = family
    config["vocab_size"] = vocab_size
    if "text_config" in config:
        config["text_config"]["vocab_size"] = vocab_size
    return config


def build(config: dict[str, Any]) -> Any:
    """mlx-lm's model for a config.json dict, as `mlx_lm.load` builds it (no weights)."""
    model_type = MODEL_REMAPPING.get(config["model_type"], config["model_type"])
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    return module.Model(module.ModelArgs.from_dict(config))


def tiny_random_model(
    *, vocab_size: int, arch: str = "llama", seed: int = 0, **overrides: Any
) -> nn.Module:
    """Random weights for the tiny `arch` config (with `overrides` of its entries)."""
    mx.random.seed(seed)
    model = build({**tiny_config(arch, vocab_size), **overrides})
    # With mlx's default init, logits are nearly flat and greedy decoding repeats one
    # token; scaling the matrices 3x gives varied, context-dependent continuations.
    model.update(
        tree_map(lambda p: (p * 3.0 if p.ndim >= 2 else p).astype(mx.float32), model.parameters())
    )
    mx.eval(model.parameters())
    model.eval()
    return model
