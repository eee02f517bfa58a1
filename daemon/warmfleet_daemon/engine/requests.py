"""What goes in and out of the engine: a request, the events of its response (the last
one with its usage and timings), the engine's configuration and its figures. Plain
values: the API, warm-up, telemetry and diagnostics all speak these."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from warmfleet_common.prompts import RenderedPrompt
from warmfleet_common.tiers import NO_TOKENS, TierTokens
from warmfleet_daemon.engine import prefill_order
from warmfleet_daemon.engine.processors import TokenLogprob
from warmfleet_daemon.engine.sampling import SamplingParams


class EngineError(RuntimeError):
    pass


@dataclass(frozen=True)
class EngineConfig:
    block_size: int
    cache_budget_bytes: int
    max_num_seqs: int = 16
    prefill_aging_picks: int = prefill_order.AGING_PICKS  # 0: shortest-first, no aging
    kv_bits: int | None = None  # quantized KV (mlx-lm's QuantizedKVCache): 8 or 4 bits


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Prompt tokens served from a cache, by the tier each block came from.
    cached: TierTokens = NO_TOKENS

    @property
    def cached_tokens(self) -> int:
        return self.cached.total


@dataclass(frozen=True)
class Timings:
    queued_s: float  # submit -> prefill starts
    ttft_s: float  # submit -> first token
    duration_s: float  # submit -> finish


@dataclass(frozen=True)
class Event:
    """A piece of a response. The last one has `finish_reason` and `usage`."""

    text: str
    token_ids: tuple[int, ...] = ()  # generated since the previous event (text or not)
    finish_reason: str | None = None  # stop | length | abort | error | prefilled
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens since the previous event


@dataclass(frozen=True)
class GenerationRequest:
    prompt: RenderedPrompt
    sampling: SamplingParams
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Warm-up: prefill and store the blocks, generate nothing; finishes with reason
    # "prefilled". With `pin`, the engine pins the prompt's blocks as it finishes (in
    # its own thread, so nothing can evict them in between); if they are not all
    # stored (the cache budget is too small) it finishes with reason "error" instead.
    prefill_only: bool = False
    pin: bool = False
    operation: str = "chat"  # gen_ai.operation.name: chat | text_completion
    user: str | None = None  # the client's end-user id (OpenAI `user`), for the logs
    # The choices of one client request (OpenAI `n`) share a group: together they hold at
    # most `slot_share` sequence slots, so other requests keep being admitted.
    group: str | None = None
    # Idle priority (the next turn's prefix, computed after a response): prefill-only,
    # one chunk per engine step that has nothing else to do (no decode, no prefill).
    idle: bool = False
    # A peer daemon that holds this prompt's blocks (the router named it, the API layer
    # checked it may be asked): what RAM and disk lack is copied from it if faster.
    peer: str | None = None
    peer_grant: str | None = None  # the router's grant to read the peer's blocks
    # Whose request it is (client keys; None: an open daemon's, and the warm-ups of
    # fleet-wide sets): prefill chunks take turns between tenants.
    tenant: str | None = None

    @property
    def group_key(self) -> str:
        return self.group or self.request_id


@dataclass(frozen=True)
class EngineStats:
    running: int  # decoding
    prefilling: int
    waiting: int  # admitted later, once a slot frees
    max_num_seqs: int
    block_size: int
    batched_decode: bool
    requests_total: int
    generated_tokens_total: int
    prefill_tokens_total: int  # tokens actually computed by prefill
    idle_waiting: int = 0  # idle-priority prefills (next turns) not finished yet
    idle_tokens_total: int = 0  # of prefill_tokens_total, computed at idle priority
