"""Prefill: a prompt's chunks, each taken from a cache tier when one holds it, else
computed; every computed chunk becomes a prefix-cache block.

A prompt restores the run RAM holds at once, then takes each next block as it is there:
stored in RAM by another prompt meanwhile, or read by a slower tier (the disk, a peer)
for this prompt. A block a tier is still reading is never computed meanwhile (the
prompt waits, others run); a block no tier holds is computed, one chunk per step, in
the chunk plan of `chunking`, so whether a prefix was cached never changes the
arithmetic (cached = uncached, bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from warmfleet_common.chunking import Chunk
from warmfleet_common.tiers import FASTEST
from warmfleet_daemon.cache.prefix_cache import PrefixCache
from warmfleet_daemon.engine import head, kv
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.engine.sequence import SequenceState
from warmfleet_daemon.engine.tiers import CacheTier

NewCaches = Callable[[], list[Any]]


class Prefiller:
    def __init__(
        self,
        model: Any,
        logits: head.Head,
        cache: PrefixCache[kv.BlockPayload],
        tiers: Sequence[CacheTier],
        config: EngineConfig,
        new_caches: NewCaches,
        *,
        decodes_in_rows: bool,
        stale: Callable[[SequenceState], bool],
        wake: Callable[[], None],
    ) -> None:
        """`tiers`: RAM first (the engine's list: tiers attached later are seen);
        `stale(seq)`: the cache was cleared since `seq` was derived (store nothing of it)."""
        self.model = model
        self.logits = logits
        self.cache = cache
        self.tiers = tiers
        self.config = config
        self.new_caches = new_caches
        self.decodes_in_rows = decodes_in_rows
        self.stale = stale
        self.wake = wake
        self.tokens_total = 0  # prefill tokens actually computed

    def start_prefetch(self, seq: SequenceState) -> None:
        """Ask each tier, fastest first, for the prompt's blocks after the run of the tier
        before it (the slower ones read ahead while the engine restores or computes the
        earlier ones)."""
        if seq.prefetched:
            return
        seq.prefetched = True
        start = 0
        for tier in self.tiers:
            if start >= len(seq.chunks):
                break
            fetch = tier.prefetch(seq.request, seq.chunks, start, self.wake)
            if fetch is not None:
                seq.fetches.append((tier.name, fetch))
                start += len(fetch.chunks)

    def advance(self, seq: SequenceState) -> bool:
        """One step of the prompt's prefill: what the tiers hold, then at most one computed
        chunk. True once every chunk is in its caches."""
        if seq.caches is None:
            self.start_prefetch(seq)  # idle prefills start here
            payloads = self._usable(seq, self.cache.match(seq.chunks).payloads)
            seq.caches = kv.restore(payloads, self.new_caches(), self._capacity(seq))
            seq.next_chunk = len(payloads)
            for chunk in seq.chunks[: len(payloads)]:
                self._count_tier(seq, chunk)
        else:
            # Blocks another sequence stored (or a tier read back) since our last turn.
            more = self._usable(seq, self.cache.match(seq.chunks, start=seq.next_chunk).payloads)
            for payload in more:
                seq.caches = kv.append_block(seq.caches, payload, self._capacity(seq))
                self._count_tier(seq, seq.chunks[seq.next_chunk])
                seq.next_chunk += 1
                seq.final_logits = payload.logits
        while self._take_held(seq):
            pass
        if seq.next_chunk < len(seq.chunks):
            if self.awaiting_tier(seq):
                return False  # its next block is being read back: never compute it meanwhile
            self._compute_chunk(seq)
        return seq.next_chunk >= len(seq.chunks)

    def awaiting_tier(self, seq: SequenceState) -> bool:
        key = seq.chunks[seq.next_chunk].key
        return any(fetch.waiting_on(key) for _, fetch in seq.fetches)

    def _take_held(self, seq: SequenceState) -> bool:
        """Take the next block from what a tier read for this prompt beyond RAM's room
        (then, from RAM, what others stored meanwhile). False when neither has it."""
        if not seq.fetches or seq.caches is None or seq.next_chunk >= len(seq.chunks):
            return False
        chunk = seq.chunks[seq.next_chunk]
        payload = next((p for _, f in seq.fetches if (p := f.take(chunk.key)) is not None), None)
        final = seq.next_chunk == len(seq.chunks) - 1
        if payload is None:
            usable = self._usable(
                seq, self.cache.match(seq.chunks, start=seq.next_chunk).payloads[:1]
            )
            if not usable:
                return False
            payload = usable[0]
        elif final and payload.logits is None and not seq.request.prefill_only:
            return False  # the final block: its logits make the first token
        seq.caches = kv.append_block(seq.caches, payload, self._capacity(seq))
        self._count_tier(seq, chunk)
        seq.next_chunk += 1
        seq.final_logits = payload.logits
        return True

    @staticmethod
    def _count_tier(seq: SequenceState, chunk: Chunk) -> None:
        """A cached chunk the prompt took, counted in the tier that read it for this
        prompt (RAM when none did: another prompt stored it meanwhile)."""
        for _, fetch in seq.fetches:
            fetch.take(chunk.key)  # taken (maybe from RAM): the tier's copy is not needed
        tier = next((name for name, f in seq.fetches if chunk.key in f.read), FASTEST)
        seq.cached = seq.cached.plus(tier, chunk.size)

    def _usable(
        self, seq: SequenceState, payloads: tuple[kv.BlockPayload, ...]
    ) -> list[kv.BlockPayload]:
        """Matched blocks a sequence can take: the prompt's final block only with the
        logits its first token is sampled from."""
        out = list(payloads)
        final = len(out) and seq.next_chunk + len(out) == len(seq.chunks)
        if final and not seq.request.prefill_only and out[-1].logits is None:
            out.pop()
        if out and out[-1].logits is not None:
            seq.final_logits = out[-1].logits
        return out

    def _capacity(self, seq: SequenceState) -> int:
        # Room for the prompt (and for decoding, unless it decodes in the decode batch's
        # rows), so the KV buffers never regrow (and copy themselves) during prefill.
        if self.decodes_in_rows:
            return len(seq.tokens)
        return len(seq.tokens) + min(seq.request.sampling.max_tokens, 256)

    def _compute_chunk(self, seq: SequenceState) -> None:
        assert seq.caches is not None
        chunk = seq.chunks[seq.next_chunk]
        final = seq.next_chunk == len(seq.chunks) - 1 and not seq.request.prefill_only
        logits = self._forward(seq, chunk, final)
        self.tokens_total += chunk.size
        parent = seq.chunks[seq.next_chunk - 1].key if seq.next_chunk else None
        stale = self.stale(seq)  # the cache was cleared during this chunk
        if not stale and chunk.key not in self.cache and self.config.cache_budget_bytes > 0:
            payload = self._block(seq, chunk, logits)
            # RAM first; when it has no room (a session larger than RAM) or the parent left
            # it meanwhile (a long prompt, an idle prefill that waited), the chain goes on
            # in the next tier that keeps blocks (the disk).
            for tier in self.tiers:
                if tier.store(chunk, parent, payload):
                    break
        seq.final_logits = logits
        seq.next_chunk += 1
        mx.clear_cache()

    def _forward(self, seq: SequenceState, chunk: Chunk, final: bool) -> mx.array | None:
        """The chunk through the model into the sequence's caches; its last logits when
        it is the prompt's final chunk (its first token is sampled from them)."""
        assert seq.caches is not None
        inputs = mx.array(seq.tokens[chunk.start : chunk.end])[None]
        if final:
            logits: mx.array | None = self.logits(inputs, seq.caches)
            mx.eval(logits, kv.cache_arrays(seq.caches))
        else:
            logits = None
            self.model(inputs, cache=seq.caches)
            mx.eval(kv.cache_arrays(seq.caches))
        if seq.next_chunk == 0:
            kv.reserve(seq.caches, self._capacity(seq))
        return logits

    def _block(self, seq: SequenceState, chunk: Chunk, logits: mx.array | None) -> kv.BlockPayload:
        """The block the chunk becomes in the cache."""
        assert seq.caches is not None
        return kv.extract_block(seq.caches, chunk.start, chunk.end, logits)
