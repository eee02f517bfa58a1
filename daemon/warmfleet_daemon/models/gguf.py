"""Build an mlx-lm llama model and a tokenizer from a GGUF file, with no network.

`mx.load` reads GGUF tensors and metadata; Q4_0/Q4_1/Q8_0 tensors arrive already
MLX-quantized (group size 32). GGUF stores q/k projections in the rotary layout that
mlx-lm calls `rope_traditional`, so the weights load unpermuted. mlx-lm has no GGUF
reader of its own (only an exporter), hence this module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

GROUP_SIZE = 32  # what mx.load produces for GGUF block quantization

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

# GGUF `tokenizer.ggml.pre` -> pre-tokenizer steps (llama.cpp's table, byte-level BPE).
_DIGITS_THEN_GPT2 = ("digits", "bytelevel")
_PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "gpt2": ("bytelevel",),
    "default": ("bytelevel",),
}


class GGUFError(ValueError):
    """The file is not a GGUF model this loader supports; the message says why."""


def load_gguf(path: Path, *, keep_quantized: bool) -> tuple[nn.Module, TokenizerWrapper, int]:
    """Return (model, tokenizer, context_length) for a llama-architecture GGUF file."""
    tensors, meta = _read(path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(
            f"{path.name}: architecture {arch!r} is not supported from GGUF (only llama); "
            "convert the model with mlx-lm (mlx_lm.convert) and pass the directory instead"
        )
    args = _model_args(meta)
    model = llama.Model(args)
    weights = _remap(tensors)
    quantized = {name.rsplit(".", 1)[0] for name in weights if name.endswith(".scales")}
    if keep_quantized and quantized:
        bits = {p: _bits(weights, p) for p in quantized}
        nn.quantize(
            model,
            class_predicate=lambda p, m: (
                {"group_size": GROUP_SIZE, "bits": bits[p]} if p in bits else False
            ),
        )
    elif quantized:
        weights = _dequantize(weights, quantized)
    if not keep_quantized:
        weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.eval()
    tokenizer = _tokenizer(meta, path)
    return model, tokenizer, int(args.max_position_embeddings or 4096)


def _model_args(meta: dict[str, Any]) -> llama.ModelArgs:
    def num(key: str) -> Any:
        if key not in meta:
            raise GGUFError(f"GGUF metadata lacks {key}")
        return meta[key].item()

    hidden = int(num("llama.embedding_length"))
    heads = int(num("llama.attention.head_count"))
    vocab = len(meta["tokenizer.ggml.tokens"])
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=int(num("llama.block_count")),
        intermediate_size=int(num("llama.feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(num("llama.attention.head_count_kv")),
        head_dim=int(meta["llama.rope.dimension_count"].item())
        if "llama.rope.dimension_count" in meta
        else hidden // heads,
        rms_norm_eps=float(num("llama.attention.layer_norm_rms_epsilon")),
        vocab_size=vocab,
        rope_theta=float(meta["llama.rope.freq_base"].item())
        if "llama.rope.freq_base" in meta
        else 10000.0,
        rope_traditional=True,  # GGUF's q/k layout
        max_position_embeddings=int(num("llama.context_length")),
        tie_word_embeddings=True,  # replaced below when the file has output.weight
    )


def _remap(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for name, value in tensors.items():
        base, _, kind = name.rpartition(".")
        if base == "token_embd":
            new = "model.embed_tokens"
        elif base == "output_norm":
            new = "model.norm"
        elif base == "output":
            new = "lm_head"
        elif base.startswith("blk."):
            _, layer, part = base.split(".", 2)
            if part not in _LAYER_NAMES:
                raise GGUFError(f"unexpected GGUF tensor {name}")
            new = f"model.layers.{layer}.{_LAYER_NAMES[part]}"
        elif base == "rope_freqs":
            continue  # llama3 rope scaling factors: not supported below
        else:
            raise GGUFError(f"unexpected GGUF tensor {name}")
        out[f"{new}.{kind}"] = value
    if "lm_head.weight" in out:
        raise GGUFError("GGUF files with an untied output projection are not supported yet")
    return out


def _bits(weights: dict[str, mx.array], prefix: str) -> int:
    packed = weights[f"{prefix}.weight"].shape[-1]
    groups = weights[f"{prefix}.scales"].shape[-1]
    return int(packed * 32 // (groups * GROUP_SIZE))


def _dequantize(weights: dict[str, mx.array], quantized: set[str]) -> dict[str, mx.array]:
    out = {k: v for k, v in weights.items() if k.rsplit(".", 1)[0] not in quantized}
    for prefix in quantized:
        out[f"{prefix}.weight"] = mx.dequantize(
            weights[f"{prefix}.weight"],
            weights[f"{prefix}.scales"].astype(mx.float32),
            weights[f"{prefix}.biases"].astype(mx.float32),
            group_size=GROUP_SIZE,
            bits=_bits(weights, prefix),
        )
    return out


def _tokenizer(meta: dict[str, Any], path: Path) -> TokenizerWrapper:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{path.name}: tokenizer model {kind!r} is not supported (only gpt2 BPE)")
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in _PRE_TOKENIZERS:
        raise GGUFError(
            f"{path.name}: pre-tokenizer {pre!r} is not supported; known: {sorted(_PRE_TOKENIZERS)}"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tok = Tokenizer(bpe)
    steps: list[Any] = []
    for step in _PRE_TOKENIZERS[pre]:
        if step == "digits":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        else:
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    # GGUF token type 3 = control token (chat markers, EOS): never split, skipped on decode.
    types = meta["tokenizer.ggml.token_type"].tolist()
    tok.add_special_tokens(
        [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t == 3
        ]
    )

    def special(key: str) -> str | None:
        return tokens[int(meta[key].item())] if key in meta else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special("tokenizer.ggml.bos_token_id"),
        eos_token=special("tokenizer.ggml.eos_token_id"),
        unk_token=special("tokenizer.ggml.unknown_token_id"),
        pad_token=special("tokenizer.ggml.padding_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    return TokenizerWrapper(hf, detokenizer_class=ContinuingBPEDetokenizer)


class ContinuingBPEDetokenizer(BPEStreamingDetokenizer):  # type: ignore[misc]
    """mlx-lm's BPE detokenizer drops the first generated token's leading space; a
    completion continues its prompt ("The sky is" + " blue"), so the space is text."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def load_gguf_tokenizer(path: Path) -> TokenizerWrapper:
    """Only the tokenizer and chat template of a GGUF file."""
    return _tokenizer(_read(path)[1], path)


def _read(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    try:
        loaded = mx.load(str(path), return_metadata=True)
    except Exception as exc:  # mx.load raises bare RuntimeError/ValueError on bad files
        raise GGUFError(f"cannot read GGUF file {path}: {exc}") from exc
    return cast(tuple[dict[str, mx.array], dict[str, Any]], loaded)
