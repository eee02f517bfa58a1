"""The language-model head, read from a pre-transposed copy on the CPU.

OpenBLAS computes `x @ W.T` for the (vocab, hidden) head matrix of a decode batch about
1.5x slower than `x @ W_t` with W_t stored (hidden, vocab) row-major (measured here for
SmolLM2's 49k x 576 head at 1 and 8 rows), and the head is the largest single matmul of
a decode step. The copy costs the head's size once, so it is only made for heads of at
most `MAX_COPY_BYTES`; Metal and quantized heads use the model's own.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

MAX_COPY_BYTES = 512 << 20
# Rows per head matmul: OpenBLAS 0.3.21 (Haswell kernels) gives a row of `x @ W_t`
# bitwise the same result whatever its neighbours for up to 12 rows, not beyond (measured
# here), and a batch must not change a response; the tests check solo = batched.
ROW_GROUP = 12

# mlx-lm model types whose __call__ is `head(self.model(inputs, cache))`.
_PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class Head:
    """Calling it runs the model and returns the logits of each row's last position."""

    def __init__(self, model: Any, *, cpu: bool) -> None:
        self.model = model
        args = getattr(model, "args", None)
        self.plain = getattr(args, "model_type", None) in _PLAIN_HEAD_TYPES and hasattr(
            model, "model"
        )
        self.transposed: mx.array | None = None
        self._group = ROW_GROUP if cpu else None  # rows per head matmul; None: all
        if self.plain and cpu:
            matrix = _head_matrix(model)
            if matrix is not None and matrix.nbytes <= MAX_COPY_BYTES:
                self.transposed = mx.contiguous(matrix.T)
                mx.eval(self.transposed)

    def __call__(self, inputs: mx.array, cache: Any) -> mx.array:
        """Logits (batch, vocab) of each row's last input position, extending `cache`.
        For plain-head models the other positions skip the head."""
        if not self.plain:
            return self.model(inputs, cache=cache)[:, -1, :]  # type: ignore[no-any-return]
        return self.project(self.model.model(inputs, cache)[:, -1, :])

    def project(self, hidden: mx.array) -> mx.array:
        """Logits (rows, vocab) of final hidden states (rows, hidden) of a plain-head
        model, on the CPU in groups of at most `ROW_GROUP` rows (see there)."""
        step, rows = self._group, hidden.shape[0]
        if step is None or rows <= step:
            return self._project(hidden)
        parts = [self._project(hidden[i : i + step]) for i in range(0, rows, step)]
        return mx.concatenate(parts, axis=0)

    def _project(self, hidden: mx.array) -> mx.array:
        if self.transposed is not None:
            return hidden @ self.transposed
        if getattr(self.model.args, "tie_word_embeddings", False):
            return self.model.model.embed_tokens.as_linear(hidden)  # type: ignore[no-any-return]
        return self.model.lm_head(hidden)  # type: ignore[no-any-return]


def _head_matrix(model: Any) -> mx.array | None:
    """The (vocab, hidden) head matrix, if it is a plain float one."""
    if getattr(model.args, "tie_word_embeddings", False):
        layer = model.model.embed_tokens
        ok = type(layer) is nn.Embedding
    else:
        layer = getattr(model, "lm_head", None)
        ok = isinstance(layer, nn.Linear) and type(layer) is nn.Linear and "bias" not in layer
    if not ok:
        return None
    weight: mx.array = layer.weight
    return weight if weight.dtype == mx.float32 else None
