"""Per-request sampling: greedy, temperature, top-k, top-p, seeded.

mlx-lm's samplers draw from mlx's global random state, so two requests in one batch
would perturb each other's seeded streams; here each request owns its PRNG key and
reuses mlx-lm's top-p filter.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Logits processing (engine.processors): token id -> bias, OpenAI's penalties,
    # vLLM's repetition penalty, logprobs (None: off; k: with the top k), and an
    # llguidance grammar the output must follow (structured output, forced tool calls).
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    grammar: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Sampler:
    params: SamplingParams
    _key: mx.array = field(init=False)

    def __post_init__(self) -> None:
        seed = self.params.seed if self.params.seed is not None else secrets.randbits(63)
        self._key = mx.random.key(seed)

    def sample(self, logits: mx.array) -> mx.array:
        """One token id from a (vocab,) row of logits."""
        if self.params.greedy:
            return mx.argmax(logits, axis=-1)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < self.params.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs[None], self.params.top_k)[0]
        if 0.0 < self.params.top_p < 1.0:
            logprobs = apply_top_p(logprobs[None], self.params.top_p)[0]
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / self.params.temperature), key=sub)
