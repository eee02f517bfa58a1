"""The simulated engine: the real engine (scheduler, continuous batching, prefix cache
and its tiers, warm-up, every API above it) with its forward pass replaced.

Its prefiller spends a chunk's time from the profile instead of running the model, and
stores a block of the profiled machine's size; its decoder spends a batch's step time and
emits each sequence's next answer token. Everything the real engine decides (what is
cached, what is computed, who waits, what is evicted) it decides the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import mlx.core as mx

from warmfleet_common.chunking import Chunk
from warmfleet_common.perf_profile import PerfProfile
from warmfleet_common.tiers import TIERS, TierCosts
from warmfleet_daemon.cache.prefix_cache import PrefixCache
from warmfleet_daemon.engine import head, kv
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.decode import Decoder, Finish
from warmfleet_daemon.engine.prefill import Prefiller
from warmfleet_daemon.engine.probe import DecodePath
from warmfleet_daemon.engine.requests import EngineConfig, EngineError
from warmfleet_daemon.engine.sequence import SequenceState
from warmfleet_daemon.engine.tiers import CacheTier
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.sim.clock import SimClock
from warmfleet_daemon.sim.codec import SimCodec
from warmfleet_daemon.sim.forward import ANSWER_TEXT, SimForward, SimLogits
from warmfleet_daemon.sim.loader import vocab_size


class SimEngine(Engine):
    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        profile: PerfProfile,
        *,
        speed: float = 1.0,
        answer_tokens: int = 64,
        clock: SimClock | None = None,
    ) -> None:
        if config.kv_bits is not None:
            raise EngineError("--kv-bits: the simulated engine's blocks are the profile's size")
        self.profile = profile
        # A clock of its own, `speed` times faster (tests inject one, with its speed).
        self.clock = clock if clock is not None else SimClock(speed)
        self._answer_tokens = answer_tokens
        super().__init__(loaded, config)

    def _load_forward(self) -> None:
        tokenizer = self.loaded.tokenizer
        eos = set(tokenizer.eos_token_ids)
        answer = [
            t for t in tokenizer.encode(ANSWER_TEXT, add_special_tokens=False) if t not in eos
        ]
        self.forward = SimForward(self.profile, self.clock, answer, self._answer_tokens)
        self.family = "simulated"
        self.decode_path = (
            f"simulated: profile {self.profile.name} ({self.profile.model} on "
            f"{self.profile.machine}), {self.clock.speed:g}x"
        )
        self.decoder = SimDecoder(
            self.forward,
            self.decode_path,
            eos=eos,
            vocab=vocab_size(),
            context_length=self.loaded.context_length,
            finish=self._finish,
        )
        self.prefiller = SimPrefiller(
            self.forward,
            self.cache,
            self.tiers,
            self.config,
            stale=self.scheduler.from_before_a_clear,
            wake=self.scheduler.wake.set,
        )
        self._bytes_per_token = float(self.profile.kv_bytes_per_token)
        self._bytes_per_block = 0.0

    def step(self) -> bool:
        # Measured against what it charged: how late the simulation runs (`clock`).
        self.clock.step_started()
        worked = False
        try:
            worked = super().step()
        finally:
            self.clock.step_ended(worked)
        return worked

    def _new_caches(self) -> list[object]:
        return []  # no KV is held: blocks are sizes (kv.restore of them gives [] back)

    def codec(self) -> SimCodec:
        """Its blocks on disk and on the wire (the disk tier, snapshots, peer copies)."""
        return SimCodec(self.profile, self.config.block_size, self.clock)

    def tier_costs(self) -> TierCosts:
        """What a token costs the profiled machine, per tier (the router weighs these)."""
        profile, block = self.profile, self.config.block_size
        return TierCosts(
            prefill_us_per_token=profile.prefill_seconds(0, block) * 1e6 / block,
            # A million tokens' seconds are one token's microseconds; RAM is free without
            # a figure, as the simulated restore is; other tiers only with one.
            hit_us_per_token={
                tier: profile.restore_seconds(tier, 1_000_000)
                for tier in TIERS
                if tier == "ram" or profile.restore.get(tier)
            },
            kv_bytes_per_token=profile.kv_bytes_per_token,
        )


class SimPrefiller(Prefiller):
    def __init__(
        self,
        forward: SimForward,
        cache: PrefixCache[kv.BlockPayload],
        tiers: Sequence[CacheTier],
        config: EngineConfig,
        *,
        stale: Callable[[SequenceState], bool],
        wake: Callable[[], None],
    ) -> None:
        no_model: Any = None
        super().__init__(
            no_model,
            cast(head.Head, no_model),
            cache,
            tiers,
            config,
            lambda: [],
            decodes_in_rows=False,
            stale=stale,
            wake=wake,
        )
        self.forward = forward

    def advance(self, seq: SequenceState) -> bool:
        before, computed = seq.cached, self.tokens_total
        done = super().advance(seq)
        # The cached blocks it took this step, restored from RAM into its caches (a block
        # from the disk or a peer was read into RAM first, in that tier's time: SimCodec).
        taken = seq.cached.total - before.total  # in every tier, a registered one's too
        seconds = self.forward.profile.restore_seconds("ram", taken)
        if done and self.tokens_total == computed and not seq.request.prefill_only:
            # Entirely cached: the real engine samples the first token from the logits
            # kept with the last block and restores the KV lazily, in the next decode step.
            self.forward.deferred[seq] = self.forward.deferred.get(seq, 0.0) + seconds
        else:
            self.forward.clock.spend(seconds)
        return done

    def _forward(self, seq: SequenceState, chunk: Chunk, final: bool) -> mx.array | None:
        logits: Any = self.forward.prefill(chunk.start, chunk.end, final, chunk.key)
        return cast(mx.array | None, logits)  # it stands in for the row

    def _block(self, seq: SequenceState, chunk: Chunk, logits: mx.array | None) -> kv.BlockPayload:
        return self.forward.block(chunk.size, cast(Any, logits))


class SimDecoder(Decoder):
    def __init__(
        self,
        forward: SimForward,
        description: str,
        *,
        eos: set[int],
        vocab: int,
        context_length: int,
        finish: Finish,
    ) -> None:
        no_head: Any = None
        path = DecodePath(True, False, None, None, description)
        super().__init__(
            no_head, path, on_gpu=False, eos=eos, context_length=context_length, finish=finish
        )
        self.forward = forward
        self.vocab = vocab
        self.eos_token = min(eos)
        self._answers: dict[SequenceState, SimLogits] = {}

    def start(self, seq: SequenceState) -> None:
        assert isinstance(seq.final_logits, SimLogits)
        self._answers[seq] = seq.final_logits
        super().start(seq)

    def step(self) -> None:
        seqs = list(self.decoding)
        deferred = self.forward.deferred
        self.forward.clock.spend(sum(deferred.pop(s, 0.0) for s in seqs))  # lazy restores
        self.forward.decode_step([len(s.tokens) + len(s.generated) for s in seqs])
        self.take(seqs, self.sample(seqs, cast(Any, None)))

    def leave(self, seq: SequenceState) -> None:
        self._answers.pop(seq, None)
        self.forward.deferred.pop(seq, None)  # no next step: its restore never ran
        super().leave(seq)

    def sample(self, seqs: list[SequenceState], logits: mx.array) -> list[int]:
        """Each sequence's next answer token; through its processors (a grammar, biases,
        logprobs) when it has any, on a row that all but forces that token."""
        chosen = [
            self.forward.token(
                self._answers[s],
                len(s.generated),
                None if s.request.sampling.ignore_eos else self.eos_token,
            )
            for s in seqs
        ]
        if not any(s.processors.active for s in seqs):
            return chosen
        rows = mx.where(
            mx.arange(self.vocab)[None] == mx.array(chosen)[:, None], 0.0, -30.0
        ).astype(mx.float32)
        return super().sample(seqs, rows)
