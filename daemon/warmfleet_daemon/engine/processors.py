"""Per-sequence logits processing: logit bias and penalties (mlx-lm's processors), the
grammar mask of structured output, and the logprobs OpenAI clients ask for.

Each sequence owns its processors and its token history, so sequences in one batch
never see each other's state, and the result depends only on the tokens (a cache hit
changes nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.sample_utils import (
    make_frequency_penalty,
    make_logits_processors,
    make_presence_penalty,
)

from warmfleet_daemon.engine.grammar import TokenMask
from warmfleet_daemon.engine.sampling import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class SequenceProcessors:
    def __init__(
        self, params: SamplingParams, prompt: tuple[int, ...], mask: TokenMask | None
    ) -> None:
        self._mask = mask
        self._prompt = prompt
        self._generated: list[int] = []
        horizon = params.max_tokens
        # OpenAI's presence/frequency penalties count the completion's tokens; the
        # repetition penalty (vLLM, mlx-lm) counts the prompt's too.
        self._on_completion: list[Any] = []
        if params.presence_penalty:
            self._on_completion.append(make_presence_penalty(params.presence_penalty, horizon))
        if params.frequency_penalty:
            self._on_completion.append(make_frequency_penalty(params.frequency_penalty, horizon))
        self._on_context = make_logits_processors(
            logit_bias=dict(params.logit_bias) or None,
            repetition_penalty=(
                params.repetition_penalty if params.repetition_penalty != 1.0 else None
            ),
            repetition_context_size=len(prompt) + horizon,
        )
        self.top_logprobs = params.logprobs
        self.active = bool(
            mask is not None
            or self._on_completion
            or self._on_context
            or params.logprobs is not None
        )

    def process(self, logits: mx.array) -> mx.array:
        """A (1, vocab) row of logits, processed for this sequence's next token (in
        mlx-lm's order: bias, repetition, presence, frequency)."""
        logits = mx.array(logits)  # some of mlx-lm's processors assign in place
        if self._on_context:
            context = mx.array([*self._prompt, *self._generated])
            for processor in self._on_context:
                logits = processor(context, logits)
        if self._on_completion and self._generated:
            completion = mx.array(self._generated)
            for processor in self._on_completion:
                logits = processor(completion, logits)
        if self._mask is not None:
            logits = self._mask.apply(logits)
        return logits

    def logprob(self, logits: mx.array, token: int) -> TokenLogprob | None:
        """The sampled token's logprob under the processed (vocab,) row, with the top
        alternatives when asked."""
        if self.top_logprobs is None:
            return None
        logprobs = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32))
        top: tuple[tuple[int, float], ...] = ()
        if self.top_logprobs > 0:
            k = min(self.top_logprobs, logprobs.shape[-1])
            ids = mx.argpartition(-logprobs, k - 1)[:k]
            id_list = cast(list[int], ids.tolist())
            value_list = cast(list[float], logprobs[ids].tolist())
            pairs = sorted(zip(id_list, value_list), key=lambda p: -p[1])
            top = tuple((i, v) for i, v in pairs if math.isfinite(v))
        return TokenLogprob(token, cast(float, logprobs[token].item()), top)

    def accept(self, token: int) -> str | None:
        """Record a sampled token; an error message if the grammar refused it."""
        self._generated.append(token)
        if self._mask is not None and not self._mask.accept(token):
            return self._mask.error or f"token {token} is not allowed by the grammar"
        return None
