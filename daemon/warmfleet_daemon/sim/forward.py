"""What replaces the model in the simulated engine: time charged from a performance
profile, and deterministic answers.

A simulated daemon stores no KV: a block is its size in bytes as the profile's machine
would hold it (`kv_bytes_per_token`, and the logits row a prompt's last block keeps), so
the prefix cache's budget, eviction and pins behave as they would there. Time is spent by
sleeping the engine thread, divided by `speed` (a day replayed in an hour runs at 24x):
queueing, batching and every timing the daemon reports follow from it (`clock`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from warmfleet_common.perf_profile import PerfProfile
from warmfleet_daemon.engine import kv
from warmfleet_daemon.sim.clock import SimClock

# What every simulated answer says, cycled (its tokens, from the served tokenizer).
ANSWER_TEXT = (
    " This answer comes from a simulated engine: it took as long as the profiled machine"
    " would, and its words are always these, so that replays of a trace compare."
)


@dataclass(frozen=True)
class SimLogits:
    """Stands in for a prompt's last logits row: where its answer starts in the text."""

    offset: int


class SimForward:
    """The profile's costs and the answers' tokens, for the prefiller and the decoder."""

    def __init__(
        self, profile: PerfProfile, clock: SimClock, answer: list[int], answer_tokens: int
    ) -> None:
        if not answer:
            raise ValueError("the simulated answer has no tokens")
        self.profile = profile
        self.clock = clock
        self.answer = answer
        self.answer_tokens = answer_tokens  # an answer ends (EOS) after this many tokens
        # Restores owed by sequences whose prompt was entirely cached, paid in their
        # first decode step (keyed by sequence).
        self.deferred: dict[object, float] = {}

    def prefill(self, start: int, end: int, final: bool, key: bytes) -> SimLogits | None:
        """Computing the prompt tokens [start, end): the time it takes; for the prompt's
        final chunk, where its answer starts (a function of the whole prompt: `key`)."""
        self.clock.spend(self.profile.prefill_seconds(start, end))
        return SimLogits(int.from_bytes(key[:4], "big") % len(self.answer)) if final else None

    def block(self, tokens: int, logits: SimLogits | None) -> kv.BlockPayload:
        """A computed chunk's block, as many bytes as the profiled machine would hold."""
        nbytes = tokens * self.profile.kv_bytes_per_token
        if logits is not None:
            nbytes += self.profile.logits_bytes
        return kv.BlockPayload((), nbytes, cast(Any, logits))

    def decode_step(self, contexts: list[int]) -> None:
        if contexts:
            mean = sum(contexts) / len(contexts)
            self.clock.spend(self.profile.decode_step_seconds(len(contexts), mean))

    def token(self, logits: SimLogits, position: int, eos: int | None) -> int:
        """The answer's token at `position` (0: the first); EOS once it is complete (with
        `eos` None, as `ignore_eos` asks, it goes on)."""
        if eos is not None and position >= self.answer_tokens:
            return eos
        return self.answer[(logits.offset + position) % len(self.answer)]
