"""`warmfleet convert`: write a loaded model as an mlx-lm directory (config.json,
safetensors, tokenizer files), e.g. so `mlx_lm.server` can serve the embedded model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.utils import save_config, save_model

from warmfleet_daemon.models.loader import load_model

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def convert(spec: str, output: str | Path, *, dtype: str = "float32") -> Path:
    loaded = load_model(spec)
    model = loaded.model
    if any(name.endswith(".scales") for name, _ in _flat(model)):
        raise ValueError("convert writes unquantized weights; run it on the CPU build of mlx")
    model.update(tree_map(lambda p: p.astype(_DTYPES[dtype]), model.parameters()))
    config = dataclasses.asdict(model.args)
    config["torch_dtype"] = dtype
    return write_model_dir(output, model, config, loaded.tokenizer)


def write_model_dir(
    output: str | Path, model: nn.Module, config: dict[str, Any], tokenizer: Any
) -> Path:
    """Weights, config.json (with `quantization` for a quantized model) and tokenizer
    files: what `mlx_lm.load` and `warmfleet serve --model DIR` read."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(dict(config), config_path=out / "config.json")
    tokenizer._tokenizer.save_pretrained(str(out))
    return out


def _flat(model: object) -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return list(tree_flatten(model.parameters()))  # type: ignore[attr-defined]
