"""The engine: one thread that owns the model and runs continuous batching.

Each iteration decodes one token for every running sequence (one batched forward),
then prefills one chunk of one waiting prompt. A long prompt therefore never stalls
the others for more than a chunk, and the next chunk goes to the prompt with the
fewest tokens left, aged by its wait (`prefill_order`): short prompts get their first
token quickly and long ones within a bounded wait.

Idle-priority prefills (the next turn of a conversation, computed once its response
ended) run one chunk at a time in steps with nothing else to do: a request that
arrives meanwhile waits for at most that chunk.

At most `max_num_seqs` sequences prefill or decode at once; the others wait in arrival
order, except that the choices of one request (OpenAI `n`) hold at most half of the
slots: a large `n` cannot keep every other request waiting until one of its choices
ends, and its remaining choices start as its earlier ones finish.

Why not mlx-lm's BatchGenerator: it prefills several prompts in one padded batch and
chunks from wherever the cache hit ended, so whether a prefix was cached would change
the arithmetic (and the output). Here every prompt is prefilled on its own, in the
chunk plan of `chunking`, and each chunk becomes a prefix-cache block.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import mlx.core as mx

from warmfleet_common.chunking import BlockKey, Chunk, plan_chunks, root_key
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.cache.prefix_cache import InsertOutcome, PrefixCache
from warmfleet_daemon.engine import (
    activation,
    attention,
    decode_batch,
    decode_forward,
    head,
    kv,
    prefill_order,
)
from warmfleet_daemon.engine.grammar import GrammarCompiler, GrammarError
from warmfleet_daemon.engine.processors import SequenceProcessors, TokenLogprob
from warmfleet_daemon.engine.sampling import Sampler, SamplingParams
from warmfleet_daemon.engine.stops import StopStringFilter
from warmfleet_daemon.models.loader import LoadedModel, model_family

log = logging.getLogger(__name__)
T = TypeVar("T")

_CLEAR_EVERY = 256  # decode steps between releases of MLX's buffer cache
_MAX_IDLE = 64  # idle-priority prefills kept waiting; beyond, the oldest are dropped


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
    cached_tokens: int
    disk_tokens: int = 0  # of cached_tokens, read back from the disk tier
    peer_tokens: int = 0  # of cached_tokens, copied from a peer daemon


class Prefetching(Protocol):
    """Blocks a lower tier is reading into the prefix cache for one prompt."""

    chunks: list[Chunk]  # the run of the prompt's chunks it reads, in order
    read: set[BlockKey]  # read from the lower tier so far
    cancelled: bool  # set when the prompt is gone: the tier may stop

    def waiting_on(self, key: BlockKey) -> bool: ...

    def take(self, key: BlockKey) -> kv.BlockPayload | None:
        """A block read for this prompt that RAM had no room for."""
        ...


class LowerTier(Protocol):
    """Where blocks evicted from RAM went (the disk): a prefix match continues there."""

    def prefetch(
        self, chunks: Sequence[Chunk], start: int, wake: Callable[[], None]
    ) -> Prefetching | None: ...

    def store(self, chunk: Chunk, parent: BlockKey | None, payload: kv.BlockPayload) -> bool:
        """Keep a block RAM would not take (its parent left RAM meanwhile); no I/O."""
        ...


class PeerTier(Protocol):
    """Copies a prompt's blocks from the peer daemon the router named (spill)."""

    def prefetch(
        self,
        prompt: RenderedPrompt,
        chunks: Sequence[Chunk],
        start: int,
        peer: str,
        wake: Callable[[], None],
        grant: str | None = None,
    ) -> Prefetching | None:
        """None: not worth it (prefill them). `grant`: presented to the peer."""
        ...


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


@dataclass(eq=False)
class _Sequence:
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
    cached_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    next_input: int = -1  # the last sampled token, fed by the next decode step
    started_at: float | None = None
    first_token_at: float | None = None
    skipped: int = 0  # prefill picks that went to others since it was admitted (its age)
    final_logits: mx.array | None = None  # (1, vocab) at the prompt's last token
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent
    pending_tokens: list[int] = field(default_factory=list)  # generated, no text of their own yet
    processing_error: str | None = None
    prefetch: Prefetching | None = None  # blocks being read back from a lower tier
    prefetched: bool = False  # a lower tier was asked
    disk_tokens: int = 0  # cached tokens that came from a lower tier
    peer_fetch: Prefetching | None = None  # blocks being copied from a peer
    peer_tokens: int = 0  # cached tokens copied from a peer
    clears_seen: int = 0  # the prefix cache's clears when it was submitted

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.request.prompt.tokens

    @property
    def remaining_prefill(self) -> int:
        done = self.chunks[self.next_chunk - 1].end if self.next_chunk else 0
        return (self.chunks[-1].end if self.chunks else 0) - done


# The probe prompts' two chunks (tokens): different lengths, so a batch pads one of them.
_PROBE_CHUNKS = ((3, 2), (4, 5))


def _close(together: mx.array, alone: mx.array) -> bool:
    """Batched logits equal to solo ones up to rounding: the batch's matmuls have other
    shapes; a dropped mask or a misread cache moves logits far more than this."""
    tolerance = 1e-3 if alone.dtype == mx.float32 else 5e-2
    a, b = together.astype(mx.float32), alone.astype(mx.float32)
    bound = tolerance * mx.maximum(mx.abs(b).max(), 1.0)
    return bool((mx.abs(a - b).max() <= bound).item())


def wait_until_gone(thread: threading.Thread, timeout: float = 2.0) -> None:
    """Wait for the OS thread itself to end, not just its Python part: MLX's
    thread-local compile cache takes the GIL in its destructor, and if that runs while
    the interpreter is finalizing, the process aborts ("terminate called ...")."""
    if not os.path.isdir("/proc/self/task"):
        time.sleep(0.1)  # no /proc (macOS): give the destructor time to run
        return
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/self/task/{thread.native_id}"):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


def on_a_thread_of_its_own(run: Callable[[], T], name: str) -> T:
    """`run()` on a short-lived thread that is gone when this returns. Running the model
    leaves MLX's thread-local compile cache on the calling thread; on a long-lived one (an
    event loop's, a test's) its destructor would run while the interpreter finalizes and
    abort the process. Exceptions are raised again on the caller's thread."""
    found: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            found.append(run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    wait_until_gone(thread)
    if errors:
        raise errors[0]
    return found[0]


class Engine:
    """Owns the model; call `start()`, then `generate()` from any event loop."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.config = config
        self.model = loaded.model
        self.cache: PrefixCache[kv.BlockPayload] = PrefixCache(config.cache_budget_bytes)
        self._root = root_key(f"{loaded.name}|{loaded.source}")
        self._eos = set(loaded.tokenizer.eos_token_ids)
        attention.install(self.model, cpu=not loaded.on_gpu)
        activation.install(self.model, cpu=not loaded.on_gpu)
        self._logits = head.Head(self.model, cpu=not loaded.on_gpu)
        self.family = model_family(self.model)
        layout, why = attention.batch_layout(self.model)
        self.kv_group_size = 64
        if config.kv_bits is not None:
            group = kv.quantization_group(self.model)
            if group is None:
                raise EngineError(
                    f"--kv-bits {config.kv_bits}: this model's KV widths are not multiples of "
                    "32, which quantization needs"
                )
            self.kv_group_size = group
        if config.kv_bits is not None and layout == "latent":
            layout, why = (
                None,
                f"--kv-bits {config.kv_bits}: quantized latent KV decodes per sequence",
            )
        self._latent = layout == "latent"
        self._batched = layout is not None
        # On the CPU, decoding sequences share per-layer KV buffers and one attention call
        # per layer. Metal keeps per-sequence mx.fast attention (not yet measured there).
        self._rows: decode_batch.DecodeBatch | None = None
        self._decode_forward: decode_forward.DecodeForward | None = None
        self._probe_and_choose(why)
        log.info("decode path for %s: %s", self.family, self.decode_path)
        self._inbox: deque[_Sequence] = deque()
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: list[_Sequence] = []
        self._decoding: list[_Sequence] = []
        self._cancelled: set[str] = set()
        # Idle-priority prefills, oldest first; the first is the one being computed.
        self._idle: deque[_Sequence] = deque()
        self._clears = 0  # DELETE /v1/cache/prefix: idle prefills from before one are dropped
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._arrivals = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._decode_steps = 0
        self._requests_total = 0
        self._generated_total = 0
        self._prefill_total = 0
        self._idle_total = 0
        self._bytes_per_token, self._bytes_per_block = self._measure_block_bytes()
        self.grammars = GrammarCompiler(loaded.tokenizer)
        # The disk tier (assembly attaches it): a prefix match continues there.
        self.tier: LowerTier | None = None
        # Spill copies (assembly attaches it): a request naming a peer continues there.
        self.peers: PeerTier | None = None
        # Called on the engine thread with each finished request (telemetry).
        self.observers: list[Callable[[GenerationRequest, Event], None]] = []

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="warmfleet-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            wait_until_gone(self._thread)
            self._thread = None

    # -- requests -----------------------------------------------------------------

    @property
    def clears(self) -> int:
        """How many times the prefix cache was cleared (DELETE /v1/cache/prefix)."""
        return self._clears

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
        seq = _Sequence(
            request=request,
            sink=sink,
            arrival=next(self._arrivals),
            submitted_at=time.perf_counter(),
            chunks=self.plan(request.prompt),
            sampler=Sampler(request.sampling),
            detokenizer=self.loaded.tokenizer.detokenizer,
            stops=StopStringFilter(request.sampling.stop),
            processors=SequenceProcessors(request.sampling, tokens, mask),
            clears_seen=self._clears if clears_seen is None else clears_seen,
        )
        if request.idle and not request.prefill_only:
            raise EngineError("an idle-priority request only prefills")
        with self._lock:
            self._inbox.append(seq)
            if not request.idle:
                self._requests_total += 1
        self._wake.set()

    def plan(self, prompt: RenderedPrompt) -> list[Chunk]:
        """The chunks (= cache blocks) this prompt is prefilled in."""
        return plan_chunks(
            prompt.tokens, block_size=self.config.block_size, cuts=prompt.cuts, root=self._root
        )

    @property
    def root(self) -> bytes:
        """The parent key of every prompt's first block (peers compute each other's keys)."""
        return self._root

    def block_bytes(self, tokens: int) -> int:
        """What a prompt of `tokens` tokens occupies in the prefix cache (an estimate:
        its blocks' boundaries depend on the prompt)."""
        blocks = -(-tokens // self.config.block_size) + 1
        return int(tokens * self._bytes_per_token + blocks * self._bytes_per_block)

    def _measure_block_bytes(self) -> tuple[float, float]:
        """Bytes per token and per block, from a probe prefill: KV grows with tokens,
        state snapshots (SSM layers, rotating windows) come once per block."""
        caches = self._new_caches()
        sizes: list[int] = []
        for _ in range(2):
            self.model(mx.zeros((1, 4), dtype=mx.int32), cache=caches)
            mx.eval(kv.cache_arrays(caches))
            sizes.append(kv.extract_block(caches, 0, len(sizes) * 4 + 4).nbytes)
        per_token = (sizes[1] - sizes[0]) / 4
        return per_token, max(sizes[0] - 4 * per_token, 0.0)

    def _new_caches(self) -> list[Any]:
        return kv.new_caches(self.model, self.config.kv_bits, self.kv_group_size)

    def _probe_and_choose(self, layout: str) -> None:
        """Run two short prompts as requests run (prefilled in two chunks, stored as blocks,
        restored, decoded) before serving anything: an architecture that fails alone is
        refused here, with its name, instead of failing every request; one that fails in
        a batch (or decodes differently there) decodes one sequence per forward instead."""
        gpu = self.loaded.on_gpu
        blocks, steps, solo = self._probe_alone()
        if self._batched:
            # The decode batch's rows hold float KV: quantized KV decodes in mlx-lm's forward
            # with attention per sequence over each one's quantized cache.
            if not gpu and self.config.kv_bits is None:
                self._rows = decode_batch.DecodeBatch(self.config.max_num_seqs, latent=self._latent)
                if self._logits.plain and decode_forward.supports(self.model):
                    self._decode_forward = decode_forward.DecodeForward(self.model)
            try:
                together = self._probe_together(blocks, steps)
                failure = None if _close(together, solo) else "its logits differ from one alone"
            except Exception as exc:  # the layers use their caches in a way we cannot batch
                failure = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
            if failure is not None:
                log.warning("%s: batched decode failed its check (%s)", self.family, failure)
                self._batched, self._rows, self._decode_forward = False, None, None
                layout = f"batched decode failed its check: {failure}"
        latent = ", latent attention (MLA)" if self._latent and self._batched else ""
        if self._decode_forward is not None:
            self.decode_path = "batched rows, hand-written llama-family step"
        elif self._rows is not None:
            self.decode_path = f"batched rows, mlx-lm forward{latent}"
        elif self._batched:
            self.decode_path = f"mlx-lm forward, attention per sequence{latent}"
        else:
            self.decode_path = f"one mlx-lm forward per sequence ({layout})"

    def _probe_alone(self) -> tuple[list[list[kv.BlockPayload]], mx.array, mx.array]:
        """Each probe prompt's blocks, the tokens of its decode step, and the logits of
        that step decoded alone from caches restored from the blocks; EngineError, naming
        the architecture and the stage, when any of it fails."""
        blocks, steps, logits = [], [], []
        stage = "a prefill in two chunks"
        try:
            for i, (first, second) in enumerate(_PROBE_CHUNKS):
                tokens = mx.array([[1 + (7 * i + 3 * j) % 50 for j in range(first + second)]])
                size = tokens.size
                stage = "a prefill in two chunks"
                caches = self._new_caches()
                self.model(tokens[:, :first], cache=caches)
                last = self._logits(tokens[:, first:], caches)
                mx.eval(last, kv.cache_arrays(caches))
                stage = "storing its caches as prefix-cache blocks"
                prompt = [kv.extract_block(caches, 0, first), kv.extract_block(caches, first, size)]
                stage = "restoring its caches from stored blocks"
                restored = kv.restore(prompt, self._new_caches(), size)
                stage = "a decode step"
                step = mx.argmax(last, axis=-1)[:, None]
                logits.append(self._logits(step, restored))
                mx.eval(logits[-1])
                blocks.append(prompt)
                steps.append(step)
        except Exception as exc:
            raise EngineError(
                f"model architecture {self.family!r} cannot be served by this engine: "
                f"{stage} failed ({type(exc).__name__}: {exc})"
            ) from exc
        return blocks, mx.concatenate(steps), mx.concatenate(logits)

    def _probe_together(self, blocks: list[list[kv.BlockPayload]], steps: mx.array) -> mx.array:
        """The probe prompts' decode step taken together on the path chosen for batches."""
        size = self.config.max_num_seqs
        caches = [kv.restore(b, self._new_caches(), 64) for b in blocks]
        if self._rows is None:
            layers = [
                attention.SequenceBatch([c[i] for c in caches], latent=self._latent)
                for i in range(len(caches[0]))
            ]
            logits = self._logits(steps, layers)
        else:
            rows = decode_batch.DecodeBatch(size, streams=1, latent=self._latent)
            for c in caches:
                rows.admit(c)
            if self._decode_forward is not None:
                logits = self._logits.project(self._decode_forward(steps[:, 0], rows.step_views()))
            else:
                logits = self._logits(steps, rows.step_views())
        mx.eval(logits)
        return logits

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)
        self._wake.set()

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
        with self._lock:
            waiting = sum(not s.request.idle for s in self._inbox) + len(self._waiting)
            idle = len(self._idle) + sum(s.request.idle for s in self._inbox)
        return EngineStats(
            running=len(self._decoding),
            prefilling=len(self._prefilling),
            waiting=waiting,
            max_num_seqs=self.config.max_num_seqs,
            block_size=self.config.block_size,
            batched_decode=self._batched,
            requests_total=self._requests_total,
            generated_tokens_total=self._generated_total,
            prefill_tokens_total=self._prefill_total,
            idle_waiting=idle,
            idle_tokens_total=self._idle_total,
        )

    def clear_prefix_cache(self) -> int:
        """Drop every stored block (pinned ones too). Safe while requests run: a sequence
        mid-prefill keeps its own copy. Idle prefills (next turns) submitted before the
        clear are dropped and store nothing more: a cleared cache holds only what requests
        after the clear computed."""
        with self._lock:
            self._clears += 1
        self._wake.set()
        return self.cache.clear()

    def _from_before_a_clear(self, seq: _Sequence) -> bool:
        return seq.request.idle and seq.clears_seen != self._clears

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
        if self._decoding:
            self._guard(list(self._decoding), self._decode_step)
            worked = True
        budget = self.config.block_size
        for _ in range(2 * self.config.max_num_seqs):  # cached chunks cost nothing: bound it
            seq = self._pick_prefill() if budget > 0 else None
            if seq is None:
                break
            before = self._prefill_total
            self._guard([seq], functools.partial(self._prefill_step, seq))
            budget -= self._prefill_total - before
            worked = True
        if not worked and self._idle:
            # Idle work only in a step with nothing else to do, one chunk: a request that
            # arrives meanwhile waits at most this chunk.
            seq = self._idle[0]
            before = self._prefill_total
            self._guard([seq], functools.partial(self._prefill_step, seq))
            self._idle_total += self._prefill_total - before
            worked = True
        return worked

    def run_until_idle(self) -> None:
        """Step until every submitted request has finished (engine not started)."""
        assert self._thread is None, "the engine thread is running"
        while True:
            if self.step():
                continue
            with self._lock:
                pending = self._inbox or self._waiting or self._prefilling or self._idle
            if not pending:
                return
            self._wake.wait(timeout=0.05)  # a block being read back from a lower tier
            self._wake.clear()

    def _run(self) -> None:
        while not self._stopping:
            if not self.step():
                self._wake.wait(timeout=0.1)
                self._wake.clear()
        for seq in [*self._waiting, *self._prefilling, *self._decoding, *self._inbox, *self._idle]:
            seq.sink(Event("", finish_reason="abort", error="engine stopped"))

    def _guard(self, seqs: list[_Sequence], step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # one bad batch must not take the daemon down
            log.exception("engine step failed; failing %d request(s)", len(seqs))
            for seq in list(seqs):
                self._finish(seq, "error", "", error=f"{type(exc).__name__}: {exc}")

    def _take_inbox(self) -> None:
        with self._lock:
            for seq in self._inbox:
                (self._idle if seq.request.idle else self._waiting).append(seq)
            self._inbox.clear()
            cancelled, self._cancelled = self._cancelled, set()
        for seq in [s for s in self._idle if self._from_before_a_clear(s)]:
            self._finish(seq, "abort", "")
        while len(self._idle) > _MAX_IDLE:  # the oldest conversations' next turns go
            self._finish(self._idle[1], "abort", "")
        if cancelled:
            for seq in [*self._waiting, *self._prefilling, *self._decoding, *self._idle]:
                if seq.request.request_id in cancelled:
                    self._finish(seq, "abort", "")
        free = self.config.max_num_seqs - len(self._prefilling) - len(self._decoding)
        if free <= 0 or not self._waiting:
            return
        # In arrival order, except that a request's choices beyond its share wait for
        # its earlier ones to finish, and later requests go ahead of them.
        held = Counter(s.request.group_key for s in (*self._prefilling, *self._decoding))
        admitted: list[_Sequence] = []
        for seq in self._waiting:
            if len(admitted) == free:
                break
            if held[seq.request.group_key] < self.slot_share:
                held[seq.request.group_key] += 1
                admitted.append(seq)
        if admitted:
            taken = set(admitted)
            self._waiting = deque(s for s in self._waiting if s not in taken)
        now = time.perf_counter()
        for seq in admitted:
            seq.started_at = now
            self._prefilling.append(seq)
            self._start_prefetch(seq)

    @property
    def slot_share(self) -> int:
        """The sequence slots one request's choices may hold at once: half of them."""
        return max(1, self.config.max_num_seqs // 2)

    def _pick_prefill(self) -> _Sequence | None:
        if not self._prefilling:
            return None
        # Two prompts about to compute the same chunk: only the earlier one does; the
        # other finds the block in the cache on its next turn.
        owner: dict[bytes, _Sequence] = {}
        for seq in sorted(self._prefilling, key=lambda s: s.arrival):
            if seq.caches is not None and seq.next_chunk < len(seq.chunks):
                owner.setdefault(seq.chunks[seq.next_chunk].key, seq)
        eligible = [
            s
            for s in self._prefilling
            if s.caches is None
            or s.next_chunk >= len(s.chunks)
            or (owner[s.chunks[s.next_chunk].key] is s and not self._awaiting_tier(s))
        ]
        if not eligible:  # every prompt waits for a block being read back
            return None
        candidates = [
            prefill_order.Candidate(s.remaining_prefill, s.skipped, s.arrival) for s in eligible
        ]
        config = self.config
        choice = eligible[
            prefill_order.pick(candidates, config.block_size, config.prefill_aging_picks)
        ]
        for seq in self._prefilling:
            if seq is not choice:
                seq.skipped += 1
        return choice

    def _prefill_step(self, seq: _Sequence) -> None:
        if seq.caches is None:
            self._start_prefetch(seq)  # idle prefills start here
            payloads = self._usable(seq, self.cache.match(seq.chunks).payloads)
            seq.caches = kv.restore(payloads, self._new_caches(), self._capacity(seq))
            seq.next_chunk = len(payloads)
            seq.cached_tokens = seq.chunks[len(payloads) - 1].end if payloads else 0
            for chunk in seq.chunks[: len(payloads)]:
                self._count_tier(seq, chunk)
        else:
            # Blocks another sequence stored (or a lower tier read back) since our last turn.
            more = self._usable(seq, self.cache.match(seq.chunks, start=seq.next_chunk).payloads)
            for payload in more:
                seq.caches = kv.append_block(seq.caches, payload, self._capacity(seq))
                seq.cached_tokens += seq.chunks[seq.next_chunk].size
                self._count_tier(seq, seq.chunks[seq.next_chunk])
                seq.next_chunk += 1
                seq.final_logits = payload.logits
        while self._take_held(seq):
            pass
        if seq.next_chunk < len(seq.chunks):
            if self._awaiting_tier(seq):
                return  # its next block is being read back: never compute it meanwhile
            self._compute_chunk(seq)
        if seq.next_chunk < len(seq.chunks):
            return
        if seq.request.prefill_only:
            if seq.request.pin and not self.cache.pin(c.key for c in seq.chunks):
                self._finish(seq, "error", "", error="the prompt does not fit in the cache budget")
            else:
                self._finish(seq, "prefilled", "")
            return
        self.cache.record_query(len(seq.tokens), seq.cached_tokens)
        self._prefilling.remove(seq)
        self._decoding.append(seq)
        assert seq.final_logits is not None
        token = self._sample([seq], seq.final_logits)[0]
        seq.final_logits = None
        self._accept(seq, token, time.perf_counter())
        if self._rows is not None and seq in self._decoding:
            assert seq.caches is not None and len(self._rows) == len(self._decoding) - 1
            self._rows.admit(seq.caches)
            seq.caches = None  # its KV lives in the decode batch's row now

    def _start_prefetch(self, seq: _Sequence) -> None:
        """Ask the lower tier for the prompt's blocks after those in RAM, then the peer
        the request names for those after the disk's (read ahead while the engine
        restores or computes the earlier ones)."""
        peer = seq.request.peer if self.peers is not None else None
        if (self.tier is None and peer is None) or seq.prefetched:
            return
        seq.prefetched = True
        start = self.cache.match(seq.chunks).blocks
        if start < len(seq.chunks) and self.tier is not None:
            seq.prefetch = self.tier.prefetch(seq.chunks, start, self._wake.set)
            if seq.prefetch is not None:
                start += len(seq.prefetch.chunks)
        if start < len(seq.chunks) and peer is not None and self.peers is not None:
            seq.peer_fetch = self.peers.prefetch(
                seq.request.prompt,
                seq.chunks,
                start,
                peer,
                self._wake.set,
                grant=seq.request.peer_grant,
            )

    def _take_held(self, seq: _Sequence) -> bool:
        """Take the next block from what the lower tier read for this prompt beyond RAM's
        room (then, from RAM, what others stored meanwhile). False when neither has it."""
        fetches = [f for f in (seq.prefetch, seq.peer_fetch) if f is not None]
        if not fetches or seq.caches is None or seq.next_chunk >= len(seq.chunks):
            return False
        chunk = seq.chunks[seq.next_chunk]
        payload = next((p for f in fetches if (p := f.take(chunk.key)) is not None), None)
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
        seq.cached_tokens += chunk.size
        self._count_tier(seq, chunk)
        seq.next_chunk += 1
        seq.final_logits = payload.logits
        return True

    def _awaiting_tier(self, seq: _Sequence) -> bool:
        key = seq.chunks[seq.next_chunk].key
        return any(f is not None and f.waiting_on(key) for f in (seq.prefetch, seq.peer_fetch))

    @staticmethod
    def _count_tier(seq: _Sequence, chunk: Chunk) -> None:
        """A cached chunk the prompt took: from the disk, a peer, or (neither) RAM."""
        for fetch in (seq.prefetch, seq.peer_fetch):
            if fetch is not None:
                fetch.take(chunk.key)  # taken (maybe from RAM): the tier's copy is not needed
        if seq.prefetch is not None and chunk.key in seq.prefetch.read:
            seq.disk_tokens += chunk.size
        elif seq.peer_fetch is not None and chunk.key in seq.peer_fetch.read:
            seq.peer_tokens += chunk.size

    def _usable(
        self, seq: _Sequence, payloads: tuple[kv.BlockPayload, ...]
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

    def _capacity(self, seq: _Sequence) -> int:
        # Room for the prompt (and for decoding, unless it decodes in the decode batch's
        # rows), so the KV buffers never regrow (and copy themselves) during prefill.
        if self._rows is not None:
            return len(seq.tokens)
        return len(seq.tokens) + min(seq.request.sampling.max_tokens, 256)

    def _compute_chunk(self, seq: _Sequence) -> None:
        assert seq.caches is not None
        chunk = seq.chunks[seq.next_chunk]
        final = seq.next_chunk == len(seq.chunks) - 1 and not seq.request.prefill_only
        inputs = mx.array(seq.tokens[chunk.start : chunk.end])[None]
        if final:
            logits: mx.array | None = self._logits(inputs, seq.caches)
            mx.eval(logits, kv.cache_arrays(seq.caches))
        else:
            logits = None
            self.model(inputs, cache=seq.caches)
            mx.eval(kv.cache_arrays(seq.caches))
        if seq.next_chunk == 0:
            kv.reserve(seq.caches, self._capacity(seq))
        self._prefill_total += chunk.size
        parent = seq.chunks[seq.next_chunk - 1].key if seq.next_chunk else None
        stale = self._from_before_a_clear(seq)  # the cache was cleared during this chunk
        if not stale and chunk.key not in self.cache and self.config.cache_budget_bytes > 0:
            payload = kv.extract_block(seq.caches, chunk.start, chunk.end, logits)
            stored = self.cache.insert(chunk, parent, payload, payload.nbytes)
            if stored is not InsertOutcome.STORED and self.tier is not None:
                # RAM has no room (a session larger than RAM) or its parent went to disk
                # meanwhile (a long prompt, an idle prefill that waited): the chain goes
                # on on disk.
                self.tier.store(chunk, parent, payload)
        seq.final_logits = logits
        seq.next_chunk += 1
        mx.clear_cache()

    def _decode_step(self) -> None:
        seqs = list(self._decoding)
        inputs = mx.array([[s.next_input] for s in seqs])
        if self._rows is not None:
            logits = self._decode_rows(inputs)
        elif len(seqs) == 1:  # the same arithmetic as a batch of one, with fewer ops
            logits = self._logits(inputs, seqs[0].caches)
        elif self._batched:
            logits = self._in_row_groups(
                len(seqs), lambda i, j: self._sequence_batch_logits(inputs[i:j], seqs[i:j])
            )
        else:  # caches that cannot be decoded side by side: one forward each
            logits = mx.concatenate(
                [self._logits(inputs[i : i + 1], s.caches) for i, s in enumerate(seqs)]
            )
        token_ids = self._sample(seqs, logits)
        now = time.perf_counter()
        self._decode_steps += 1
        if self._decode_steps % _CLEAR_EVERY == 0:
            mx.clear_cache()
        for seq, token in zip(seqs, token_ids):
            self._accept(seq, token, now)

    def _in_row_groups(self, count: int, logits_of: Callable[[int, int], mx.array]) -> mx.array:
        """`logits_of(i, j)` for rows [i, j) of one decode step through mlx-lm's forward: on
        the CPU in groups of at most head.ROW_GROUP rows, since past that many OpenBLAS
        changes a row's result with its neighbours, and a batch must not."""
        step = count if self.loaded.on_gpu else head.ROW_GROUP
        parts = [logits_of(i, min(i + step, count)) for i in range(0, count, step)]
        return mx.concatenate(parts) if len(parts) > 1 else parts[0]

    def _sequence_batch_logits(self, inputs: mx.array, seqs: list[_Sequence]) -> mx.array:
        """Logits of one decode step of `seqs`, each attending over its own caches."""
        if len(seqs) == 1:  # the same arithmetic as a batch of one, with fewer ops
            return self._logits(inputs, seqs[0].caches)
        layers = [
            attention.SequenceBatch(
                [s.caches[i] for s in seqs],  # type: ignore[index]
                latent=self._latent,
            )
            for i in range(len(seqs[0].caches or []))
        ]
        return self._logits(inputs, layers)

    def _decode_rows(self, inputs: mx.array) -> mx.array:
        """Logits (rows, vocab) of one decode step of every row of the decode batch."""
        rows = self._rows
        assert rows is not None
        try:
            if self._decode_forward is not None:
                logits = self._logits.project(self._decode_forward(inputs[:, 0], rows.step_views()))
            else:
                logits = self._in_row_groups(
                    len(rows), lambda i, j: self._logits(inputs[i:j], rows.step_views(i, j))
                )
            mx.eval(logits, rows.buffers())
        except Exception:
            rows.reset()  # its buffers may be half-written; every decoding request fails
            raise
        rows.advance()
        return logits

    def _sample(self, seqs: list[_Sequence], logits: mx.array) -> list[int]:
        """One token per sequence from its row of `logits` (batch, vocab), through the
        sequence's own processors when it has any."""
        if not any(s.processors.active for s in seqs):
            if all(s.request.sampling.greedy for s in seqs):  # one op for the whole batch
                return cast(list[int], mx.argmax(logits, axis=-1).tolist())
            sampled = mx.stack([s.sampler.sample(logits[i]) for i, s in enumerate(seqs)])
            return cast(list[int], sampled.tolist())
        rows = [self._process(s, logits[i : i + 1]) for i, s in enumerate(seqs)]
        tokens = cast(
            list[int], mx.stack([s.sampler.sample(r) for s, r in zip(seqs, rows)]).tolist()
        )
        for seq, row, token in zip(seqs, rows, tokens):
            entry = seq.processors.logprob(row, token)
            if entry is not None:
                seq.pending_logprobs.append(entry)
        return tokens

    @staticmethod
    def _process(seq: _Sequence, row: mx.array) -> mx.array:
        """The sequence's processed (vocab,) row; if its processors fail, the raw row,
        and the sequence fails alone (its batch neighbours go on)."""
        if not seq.processors.active or seq.processing_error is not None:
            return row[0]
        try:
            return seq.processors.process(row)[0]
        except Exception as exc:
            log.exception("logits processing failed for request %s", seq.request.request_id)
            seq.processing_error = f"{type(exc).__name__}: {exc}"
            return row[0]

    def _accept(self, seq: _Sequence, token: int, now: float) -> None:
        if seq.processing_error is not None:
            self._finish(seq, "error", "", error=f"logits processing: {seq.processing_error}")
            return
        seq.generated.append(token)
        refused = seq.processors.accept(token) if token not in self._eos else None
        if refused is not None:
            self._finish(seq, "error", "", token, error=f"structured output: {refused}")
            return
        seq.next_input = token
        self._generated_total += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        params = seq.request.sampling
        if token in self._eos and not params.ignore_eos:
            if seq.pending_logprobs and seq.pending_logprobs[-1].token == token:
                seq.pending_logprobs.pop()  # like its text, EOS is not part of the output
            seq.detokenizer.finalize()
            text = seq.detokenizer.last_segment + seq.stops.flush()
            self._finish(seq, "stop", text, token)
            return
        seq.detokenizer.add_token(token)
        text, stopped = seq.stops.feed(seq.detokenizer.last_segment)
        if stopped:
            self._finish(seq, "stop", text, token)
            return
        at_limit = len(seq.generated) >= params.max_tokens
        at_context = len(seq.tokens) + len(seq.generated) >= self.loaded.context_length
        if at_limit or at_context:
            seq.detokenizer.finalize()
            more, _ = seq.stops.feed(seq.detokenizer.last_segment)
            self._finish(seq, "length", text + more + seq.stops.flush(), token)
            return
        seq.pending_tokens.append(token)
        if text:
            seq.sink(Event(text, self._take_tokens(seq), logprobs=self._take_logprobs(seq)))

    def _leave_decoding(self, seq: _Sequence) -> None:
        row = self._decoding.index(seq)
        if self._rows is None or row >= len(self._rows):
            self._decoding.remove(seq)  # not admitted (it finished on its first token)
            return
        moved = self._rows.release(row)
        if moved is not None:  # the last row took its place: mirror that
            self._decoding[row] = self._decoding[moved]
        self._decoding.pop()

    @staticmethod
    def _take_tokens(seq: _Sequence, last: int | None = None) -> tuple[int, ...]:
        taken = (*seq.pending_tokens, *([last] if last is not None else []))
        seq.pending_tokens.clear()
        return taken

    @staticmethod
    def _take_logprobs(seq: _Sequence) -> tuple[TokenLogprob, ...]:
        taken = tuple(seq.pending_logprobs)
        seq.pending_logprobs.clear()
        return taken

    def _finish(
        self,
        seq: _Sequence,
        reason: str,
        text: str,
        token: int | None = None,
        error: str | None = None,
    ) -> None:
        if seq in self._decoding:
            self._leave_decoding(seq)
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        if seq in self._idle:
            self._idle.remove(seq)
        if seq.peer_fetch is not None:
            seq.peer_fetch.cancelled = True  # a copy still running stops at its next block
        now = time.perf_counter()
        start = seq.started_at or now
        first = seq.first_token_at or now
        event = Event(
            text,
            self._take_tokens(seq, token),
            finish_reason=reason,
            usage=Usage(
                len(seq.tokens),
                len(seq.generated),
                seq.cached_tokens,
                seq.disk_tokens,
                seq.peer_tokens,
            ),
            timings=Timings(
                start - seq.submitted_at, first - seq.submitted_at, now - seq.submitted_at
            ),
            error=error,
            logprobs=self._take_logprobs(seq),
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
