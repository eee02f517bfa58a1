"""One request inside the engine, from its submission to its last event: its chunk
plan, the tiers reading its blocks, its caches while it prefills, what it generated and
what is still to be sent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from warmfleet_common.chunking import Chunk
from warmfleet_common.tiers import NO_TOKENS, Tier, TierTokens
from warmfleet_daemon.engine.processors import SequenceProcessors, TokenLogprob
from warmfleet_daemon.engine.requests import Event, GenerationRequest
from warmfleet_daemon.engine.sampling import Sampler
from warmfleet_daemon.engine.stops import StopStringFilter
from warmfleet_daemon.engine.tiers import Prefetching


@dataclass(eq=False)
class SequenceState:
    request: GenerationRequest
    sink: Callable[[Event], None]
    arrival: int
    submitted_at: float
    chunks: list[Chunk]
    sampler: Sampler
    detokenizer: Any
    stops: StopStringFilter
    processors: SequenceProcessors
    caches: list[Any] | None = None
    next_chunk: int = 0
    cached: TierTokens = NO_TOKENS  # cached prompt tokens taken so far, by tier
    generated: list[int] = field(default_factory=list)
    next_input: int = -1  # the last sampled token, fed by the next decode step
    started_at: float | None = None
    first_token_at: float | None = None
    skipped: int = 0  # prefill picks that went to others since it was admitted (its age)
    final_logits: mx.array | None = None  # (1, vocab) at the prompt's last token
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent
    pending_tokens: list[int] = field(default_factory=list)  # generated, no text of their own yet
    processing_error: str | None = None
    # The tiers reading its blocks, fastest first, each from where the one before stopped.
    fetches: list[tuple[Tier, Prefetching]] = field(default_factory=list)
    prefetched: bool = False  # the tiers were asked
    clears_seen: int = 0  # the prefix cache's clears when it was submitted

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.request.prompt.tokens

    @property
    def cached_tokens(self) -> int:
        return self.cached.total

    @property
    def remaining_prefill(self) -> int:
        done = self.chunks[self.next_chunk - 1].end if self.next_chunk else 0
        return (self.chunks[-1].end if self.chunks else 0) - done

    def take_tokens(self, last: int | None = None) -> tuple[int, ...]:
        """The generated tokens not sent yet (and `last`), now sent."""
        taken = (*self.pending_tokens, *([last] if last is not None else []))
        self.pending_tokens.clear()
        return taken

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        taken = tuple(self.pending_logprobs)
        self.pending_logprobs.clear()
        return taken
