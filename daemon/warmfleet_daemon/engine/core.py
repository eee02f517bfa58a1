"""The engine: one thread that owns the model and runs continuous batching.

Each iteration decodes one token for every running sequence (one batched forward,
`decode`), then prefills up to a block's worth of tokens (`prefill`): one chunk of a
long prompt, or several short prompts, the next chunk going to the prompt with the
fewest tokens left, aged by its wait (`scheduler`). A long prompt therefore never stalls
the others for more than a chunk, short prompts get their first token quickly and long
ones within a bounded wait.

Idle-priority prefills (the next turn of a conversation, computed once its response
ended) run one chunk at a time in steps with nothing else to do: a request that
arrives meanwhile waits for at most that chunk.

A prompt's cached blocks come from the cache tiers (`tiers`): RAM, and those the
assembly attaches (the disk, a peer); what none holds is computed and stored.

Why not mlx-lm's BatchGenerator: it prefills several prompts in one padded batch and
chunks from wherever the cache hit ended, so whether a prefix was cached would change
the arithmetic (and the output). Here every prompt is prefilled on its own, in the
chunk plan of `chunking`, and each chunk becomes a prefix-cache block.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable

from warmfleet_common.chunking import BlockKey, Chunk, plan_chunks, root_key
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_common.tiers import is_tier
from warmfleet_daemon.cache.prefix_cache import PrefixCache
from warmfleet_daemon.engine import activation, attention, head, kv, probe
from warmfleet_daemon.engine.decode import Decoder
from warmfleet_daemon.engine.grammar import GrammarCompiler, GrammarError
from warmfleet_daemon.engine.prefill import Prefiller
from warmfleet_daemon.engine.processors import SequenceProcessors
from warmfleet_daemon.engine.requests import (
    EngineConfig,
    EngineError,
    EngineStats,
    Event,
    GenerationRequest,
    Timings,
    Usage,
)
from warmfleet_daemon.engine.sampling import Sampler
from warmfleet_daemon.engine.scheduler import Scheduler
from warmfleet_daemon.engine.sequence import SequenceState
from warmfleet_daemon.engine.stops import StopStringFilter
from warmfleet_daemon.engine.threads import wait_until_gone
from warmfleet_daemon.engine.tiers import CacheTier, RamTier
from warmfleet_daemon.models.loader import LoadedModel, model_family

log = logging.getLogger(__name__)


class Engine:
    """Owns the model; call `start()`, then `generate()` from any event loop."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.config = config
        self.model = loaded.model
        self.cache: PrefixCache[kv.BlockPayload] = PrefixCache(config.cache_budget_bytes)
        # The cache tiers, fastest first: RAM, then those the assembly attaches.
        self.tiers: list[CacheTier] = [RamTier(self.cache)]
        self._root = root_key(f"{loaded.name}|{loaded.source}")
        # Unsalted keys of the fleet-wide warm prompts' blocks (the warm manager sets it):
        # a tenant's prompt uses them for the run it shares with one (`chunking`).
        self.shared: frozenset[BlockKey] = frozenset()
        self.scheduler = Scheduler(config)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._idle_total = 0
        self.grammars = GrammarCompiler(loaded.tokenizer)
        # Called on the engine thread with each finished request (telemetry).
        self.observers: list[Callable[[GenerationRequest, Event], None]] = []
        self.kv_group_size = 64
        self._load_forward()

    def _load_forward(self) -> None:
        """The model's forward: its decode path (probed), the decoder and the prefiller
        that run it, and what its KV occupies. The simulated engine replaces this."""
        loaded, config = self.loaded, self.config
        attention.install(self.model, cpu=not loaded.on_gpu)
        activation.install(self.model, cpu=not loaded.on_gpu)
        self._logits = head.Head(self.model, cpu=not loaded.on_gpu)
        self.family = model_family(self.model)
        if config.kv_bits is not None:
            group = kv.quantization_group(self.model)
            if group is None:
                raise EngineError(
                    f"--kv-bits {config.kv_bits}: this model's KV widths are not multiples of "
                    "32, which quantization needs"
                )
            self.kv_group_size = group
        path = probe.choose_decode_path(
            self.model,
            self._logits,
            self._new_caches,
            family=self.family,
            on_gpu=loaded.on_gpu,
            kv_bits=config.kv_bits,
            max_num_seqs=config.max_num_seqs,
        )
        self.decode_path = path.description
        log.info("decode path for %s: %s", self.family, self.decode_path)
        self.decoder = Decoder(
            self._logits,
            path,
            on_gpu=loaded.on_gpu,
            eos=set(loaded.tokenizer.eos_token_ids),
            context_length=loaded.context_length,
            finish=self._finish,
        )
        self.prefiller = Prefiller(
            self.model,
            self._logits,
            self.cache,
            self.tiers,
            config,
            self._new_caches,
            decodes_in_rows=path.rows is not None,
            stale=self.scheduler.from_before_a_clear,
            wake=self.scheduler.wake.set,
        )
        self._bytes_per_token, self._bytes_per_block = probe.block_bytes(
            self.model, self._new_caches
        )

    def attach_tier(self, tier: CacheTier) -> None:
        """A tier beyond RAM (the assembly attaches the registry's, fastest first, before
        `start()`): prompts' matches continue through the tiers in the order attached.
        It replaces a tier of the same name in its place (one whose owner stopped); RAM
        is the engine's own. Its name is any tier name (`warmfleet_common.tiers.Tier`):
        the events, the snapshot, the status and the usage carry it as it is."""
        if not is_tier(tier.name):
            raise ValueError(f"not a cache tier name: {tier.name!r} (see TIER_PATTERN)")
        if tier.name == self.tiers[0].name:
            raise ValueError(f"the {tier.name} tier is the engine's own")
        names = [t.name for t in self.tiers]
        # In place: the prefiller reads this very list.
        if tier.name in names:
            self.tiers[names.index(tier.name)] = tier
        else:
            self.tiers.append(tier)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="warmfleet-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self.scheduler.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            wait_until_gone(self._thread)
            self._thread = None

    # -- requests -----------------------------------------------------------------

    @property
    def clears(self) -> int:
        """How many times the prefix cache was cleared (DELETE /v1/cache/prefix)."""
        return self.scheduler.clears

    def submit(
        self,
        request: GenerationRequest,
        sink: Callable[[Event], None],
        *,
        clears_seen: int | None = None,
    ) -> None:
        """Queue a request; `sink` receives its events on the engine thread. An idle
        request derived from an earlier state passes the `clears` it saw then: if the cache
        was cleared since, it is dropped."""
        tokens = request.prompt.tokens
        if not tokens:
            raise EngineError("empty prompt")
        if len(tokens) >= self.loaded.context_length:
            raise EngineError(
                f"prompt has {len(tokens)} tokens; the context is {self.loaded.context_length}"
            )
        grammar = request.sampling.grammar
        try:
            mask = self.grammars.mask(grammar) if grammar is not None else None
        except GrammarError as exc:
            raise EngineError(f"invalid grammar: {exc}") from exc
        seq = SequenceState(
            request=request,
            sink=sink,
            arrival=self.scheduler.next_arrival(),
            submitted_at=time.perf_counter(),
            chunks=self.plan(request.prompt),
            sampler=Sampler(request.sampling),
            detokenizer=self.loaded.tokenizer.detokenizer,
            stops=StopStringFilter(request.sampling.stop),
            processors=SequenceProcessors(request.sampling, tokens, mask),
            clears_seen=self.scheduler.clears if clears_seen is None else clears_seen,
        )
        if request.idle and not request.prefill_only:
            raise EngineError("an idle-priority request only prefills")
        self.scheduler.enqueue(seq)

    def plan(self, prompt: RenderedPrompt) -> list[Chunk]:
        """The chunks (= cache blocks) this prompt is prefilled in, keyed in its salt's
        namespace but for a run shared with a fleet-wide warm prompt."""
        return plan_chunks(
            prompt.tokens,
            block_size=self.config.block_size,
            cuts=prompt.cuts,
            root=self._root,
            salt=prompt.salt,
            shared=self.shared,
        )

    @property
    def root(self) -> bytes:
        """The parent key of every prompt's first block (peers compute each other's keys)."""
        return self._root

    @property
    def slot_share(self) -> int:
        """The sequence slots one request's choices may hold at once."""
        return self.scheduler.slot_share

    def block_bytes(self, tokens: int) -> int:
        """What a prompt of `tokens` tokens occupies in the prefix cache (an estimate:
        its blocks' boundaries depend on the prompt)."""
        blocks = -(-tokens // self.config.block_size) + 1
        return int(tokens * self._bytes_per_token + blocks * self._bytes_per_block)

    def _new_caches(self) -> list[object]:
        return kv.new_caches(self.model, self.config.kv_bits, self.kv_group_size)

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Stream a request's events; closing the iterator early cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def deliver(event: Event) -> None:  # runs on the engine thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        self.submit(request, deliver)
        finished = False
        try:
            while True:
                event = await events.get()
                finished = event.finish_reason is not None
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.cancel(request.request_id)

    def generate_blocking(self, request: GenerationRequest, timeout: float = 600) -> list[Event]:
        """Run a request to completion from a plain thread (tests, scripts)."""
        events: queue.Queue[Event] = queue.Queue()
        self.submit(request, events.put)
        out = []
        while True:
            event = events.get(timeout=timeout)
            out.append(event)
            if event.finish_reason is not None:
                return out

    def stats(self) -> EngineStats:
        waiting, idle = self.scheduler.counts()
        return EngineStats(
            running=len(self.decoder.decoding),
            prefilling=len(self.scheduler.prefilling),
            waiting=waiting,
            max_num_seqs=self.config.max_num_seqs,
            block_size=self.config.block_size,
            batched_decode=self.decoder.path.batched,
            requests_total=self.scheduler.requests_total,
            generated_tokens_total=self.decoder.generated_total,
            prefill_tokens_total=self.prefiller.tokens_total,
            idle_waiting=idle,
            idle_tokens_total=self._idle_total,
        )

    def clear_prefix_cache(self) -> int:
        """Drop every stored block (pinned ones too). Safe while requests run: a sequence
        mid-prefill keeps its own copy. Idle prefills (next turns) submitted before the
        clear are dropped and store nothing more: a cleared cache holds only what requests
        after the clear computed."""
        self.scheduler.note_clear()
        return self.cache.clear()

    # -- the loop -----------------------------------------------------------------

    def step(self) -> bool:
        """One iteration: a decode step for the running batch, then prefill chunks until
        a block's worth of tokens was computed (one long chunk, or several short prompts:
        eight short requests arriving together then all start in one step, while a
        running stream never waits for more than a chunk of prefill between tokens).
        Returns False when there was nothing to do. The engine thread calls this in a
        loop; tests may call it directly on an engine that was not started."""
        self._take_inbox()
        worked = False
        if self.decoder.decoding:
            self._guard(list(self.decoder.decoding), self.decoder.step)
            worked = True
        budget = self.config.block_size
        for _ in range(2 * self.config.max_num_seqs):  # cached chunks cost nothing: bound it
            seq = self.scheduler.pick_prefill(self.prefiller.awaiting_tier) if budget > 0 else None
            if seq is None:
                break
            before = self.prefiller.tokens_total
            self._guard([seq], functools.partial(self._prefill_step, seq))
            budget -= self.prefiller.tokens_total - before
            worked = True
        if not worked and self.scheduler.idle:
            # Idle work only in a step with nothing else to do, one chunk: a request that
            # arrives meanwhile waits at most this chunk.
            seq = self.scheduler.idle[0]
            before = self.prefiller.tokens_total
            self._guard([seq], functools.partial(self._prefill_step, seq))
            self._idle_total += self.prefiller.tokens_total - before
            worked = True
        return worked

    def run_until_idle(self) -> None:
        """Step until every submitted request has finished (engine not started)."""
        assert self._thread is None, "the engine thread is running"
        while True:
            if self.step():
                continue
            if not self.scheduler.pending():
                return
            self.scheduler.wake.wait(timeout=0.05)  # a block being read back from a tier
            self.scheduler.wake.clear()

    def _run(self) -> None:
        wake = self.scheduler.wake
        while not self._stopping:
            if not self.step():
                wake.wait(timeout=0.1)
                wake.clear()
        for seq in [*self.scheduler.everything(), *self.decoder.decoding]:
            seq.sink(Event("", finish_reason="abort", error="engine stopped"))

    def _guard(self, seqs: list[SequenceState], step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # one bad batch must not take the daemon down
            log.exception("engine step failed; failing %d request(s)", len(seqs))
            for seq in list(seqs):
                self._finish(seq, "error", "", error=f"{type(exc).__name__}: {exc}")

    def _take_inbox(self) -> None:
        self.scheduler.admit(
            self.decoder.decoding,
            abort=lambda seq: self._finish(seq, "abort", ""),
            started=self.prefiller.start_prefetch,
        )

    def _prefill_step(self, seq: SequenceState) -> None:
        if not self.prefiller.advance(seq):
            return
        if seq.request.prefill_only:
            if seq.request.pin and not self.cache.pin(c.key for c in seq.chunks):
                self._finish(seq, "error", "", error="the prompt does not fit in the cache budget")
            else:
                self._finish(seq, "prefilled", "")
            return
        self.cache.record_query(len(seq.tokens), seq.cached_tokens)
        self.scheduler.prefilling.remove(seq)
        self.decoder.start(seq)

    def _finish(
        self,
        seq: SequenceState,
        reason: str,
        text: str,
        token: int | None = None,
        error: str | None = None,
    ) -> None:
        if seq in self.decoder.decoding:
            self.decoder.leave(seq)
        self.scheduler.forget(seq)
        for _, fetch in seq.fetches:
            fetch.abandon()  # a copy still running stops at its next block
        now = time.perf_counter()
        start = seq.started_at or now
        first = seq.first_token_at or now
        event = Event(
            text,
            seq.take_tokens(token),
            finish_reason=reason,
            usage=Usage(len(seq.tokens), len(seq.generated), seq.cached),
            timings=Timings(
                start - seq.submitted_at, first - seq.submitted_at, now - seq.submitted_at
            ),
            error=error,
            logprobs=seq.take_logprobs(),
        )
        if error is not None:
            log.warning(
                "request %s (user %r) failed: %s", seq.request.request_id, seq.request.user, error
            )
        else:
            log.debug(
                "request %s (user %r) finished: %s, %d tokens",
                seq.request.request_id,
                seq.request.user,
                reason,
                len(seq.generated),
            )
        seq.sink(event)
        for observe in self.observers:
            try:
                observe(seq.request, event)
            except Exception:  # telemetry must never break serving
                log.exception("request observer failed")
