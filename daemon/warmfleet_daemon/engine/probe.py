"""Before serving anything, the engine runs the model as requests will run it and
chooses how decoding sequences share a forward (`choose_decode_path`), and measures what
a block of KV occupies (`block_bytes`).

The probe runs two short prompts as requests run: prefilled in two chunks, stored as
blocks, restored, decoded. An architecture that fails alone is refused here, with its
name and the stage, instead of failing every request; one that fails in a batch (or
decodes differently there) decodes one sequence per forward instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from warmfleet_daemon.engine import attention, decode_batch, decode_forward, head, kv
from warmfleet_daemon.engine.requests import EngineError

log = logging.getLogger(__name__)

# The probe prompts' two chunks (tokens): different lengths, so a batch pads one of them.
_PROBE_CHUNKS = ((3, 2), (4, 5))

NewCaches = Callable[[], list[Any]]


@dataclass
class DecodePath:
    """How a decode step runs: `rows` (the CPU's shared per-layer KV buffers) with the
    hand-written step (`forward`) or mlx-lm's; else mlx-lm's forward with attention per
    sequence (`batched`), or one forward per sequence."""

    batched: bool
    latent: bool  # multi-head latent attention (MLA) in a batch
    rows: decode_batch.DecodeBatch | None
    forward: decode_forward.DecodeForward | None
    description: str


def choose_decode_path(
    model: Any,
    logits: head.Head,
    new_caches: NewCaches,
    *,
    family: str,
    on_gpu: bool,
    kv_bits: int | None,
    max_num_seqs: int,
) -> DecodePath:
    """The decode path for this model; EngineError if it cannot be served at all."""
    layout, why = attention.batch_layout(model)
    if kv_bits is not None and layout == "latent":
        layout, why = None, f"--kv-bits {kv_bits}: quantized latent KV decodes per sequence"
    path = DecodePath(layout is not None, layout == "latent", None, None, "")
    blocks, steps, solo = _probe_alone(model, logits, new_caches, family)
    if path.batched:
        # The decode batch's rows hold float KV: quantized KV decodes in mlx-lm's forward
        # with attention per sequence over each one's quantized cache. On the CPU, decoding
        # sequences share per-layer KV buffers and one attention call per layer; Metal
        # keeps per-sequence mx.fast attention (not yet measured there).
        if not on_gpu and kv_bits is None:
            path.rows = decode_batch.DecodeBatch(max_num_seqs, latent=path.latent)
            if logits.plain and decode_forward.supports(model):
                path.forward = decode_forward.DecodeForward(model)
        try:
            together = _probe_together(logits, new_caches, path, blocks, steps, max_num_seqs)
            failure = None if _close(together, solo) else "its logits differ from one alone"
        except Exception as exc:  # the layers use their caches in a way we cannot batch
            failure = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        if failure is not None:
            log.warning("%s: batched decode failed its check (%s)", family, failure)
            path.batched, path.rows, path.forward = False, None, None
            why = f"batched decode failed its check: {failure}"
    latent = ", latent attention (MLA)" if path.latent and path.batched else ""
    if path.forward is not None:
        path.description = "batched rows, hand-written llama-family step"
    elif path.rows is not None:
        path.description = f"batched rows, mlx-lm forward{latent}"
    elif path.batched:
        path.description = f"mlx-lm forward, attention per sequence{latent}"
    else:
        path.description = f"one mlx-lm forward per sequence ({why})"
    return path


def block_bytes(model: Any, new_caches: NewCaches) -> tuple[float, float]:
    """Bytes per token and per block, from a probe prefill: KV grows with tokens, state
    snapshots (SSM layers, rotating windows) come once per block."""
    caches = new_caches()
    sizes: list[int] = []
    for _ in range(2):
        model(mx.zeros((1, 4), dtype=mx.int32), cache=caches)
        mx.eval(kv.cache_arrays(caches))
        sizes.append(kv.extract_block(caches, 0, len(sizes) * 4 + 4).nbytes)
    per_token = (sizes[1] - sizes[0]) / 4
    return per_token, max(sizes[0] - 4 * per_token, 0.0)


def _close(together: mx.array, alone: mx.array) -> bool:
    """Batched logits equal to solo ones up to rounding: the batch's matmuls have other
    shapes; a dropped mask or a misread cache moves logits far more than this."""
    tolerance = 1e-3 if alone.dtype == mx.float32 else 5e-2
    a, b = together.astype(mx.float32), alone.astype(mx.float32)
    bound = tolerance * mx.maximum(mx.abs(b).max(), 1.0)
    return bool((mx.abs(a - b).max() <= bound).item())


def _probe_alone(
    model: Any, logits: head.Head, new_caches: NewCaches, family: str
) -> tuple[list[list[kv.BlockPayload]], mx.array, mx.array]:
    """Each probe prompt's blocks, the tokens of its decode step, and the logits of that
    step decoded alone from caches restored from the blocks; EngineError, naming the
    architecture and the stage, when any of it fails."""
    blocks, steps, found = [], [], []
    stage = "a prefill in two chunks"
    try:
        for i, (first, second) in enumerate(_PROBE_CHUNKS):
            tokens = mx.array([[1 + (7 * i + 3 * j) % 50 for j in range(first + second)]])
            size = tokens.size
            stage = "a prefill in two chunks"
            caches = new_caches()
            model(tokens[:, :first], cache=caches)
            last = logits(tokens[:, first:], caches)
            mx.eval(last, kv.cache_arrays(caches))
            stage = "storing its caches as prefix-cache blocks"
            prompt = [kv.extract_block(caches, 0, first), kv.extract_block(caches, first, size)]
            stage = "restoring its caches from stored blocks"
            restored = kv.restore(prompt, new_caches(), size)
            stage = "a decode step"
            step = mx.argmax(last, axis=-1)[:, None]
            found.append(logits(step, restored))
            mx.eval(found[-1])
            blocks.append(prompt)
            steps.append(step)
    except Exception as exc:
        raise EngineError(
            f"model architecture {family!r} cannot be served by this engine: "
            f"{stage} failed ({type(exc).__name__}: {exc})"
        ) from exc
    return blocks, mx.concatenate(steps), mx.concatenate(found)


def _probe_together(
    logits: head.Head,
    new_caches: NewCaches,
    path: DecodePath,
    blocks: list[list[kv.BlockPayload]],
    steps: mx.array,
    max_num_seqs: int,
) -> mx.array:
    """The probe prompts' decode step taken together on the path chosen for batches."""
    caches = [kv.restore(b, new_caches(), 64) for b in blocks]
    if path.rows is None:
        layers = [
            attention.SequenceBatch([c[i] for c in caches], latent=path.latent)
            for i in range(len(caches[0]))
        ]
        found = logits(steps, layers)
    else:
        rows = decode_batch.DecodeBatch(max_num_seqs, streams=1, latent=path.latent)
        for c in caches:
            rows.admit(c)
        if path.forward is not None:
            found = logits.project(path.forward(steps[:, 0], rows.step_views()))
        else:
            found = logits(steps, rows.step_views())
    mx.eval(found)
    return found
