"""`warmfleet bench-serve --profile-out`: measure a warmfleet daemon into a performance
profile (`warmfleet_common.perf_profile`), over HTTP only.

Each repetition clears the prefix cache and sends token-id prompts of random tokens
(a fresh random stream per run, so nothing is cached by accident), one request at a
time, each after the daemon is idle:

- two cold prompts of one and two blocks: the growth of the cache's bytes gives the KV
  bytes per token and the logits row stored with a prompt's last block;
- per context position p, a chunk [a, b) of a few blocks around p: the prompt's first a
  tokens are cached, then the prompt [0, b) is sent (it restores a tokens and computes
  b - a) and then sent again, three times (entirely cached: its first token comes from
  the logits stored with its last block, before anything is restored; the least TTFT
  of the three counts). So the marginal prefill rate at p is
  (b - a) / (TTFT_extend - TTFT_cached - a / ram). The first cached repeat decodes
  `decode_tokens` tokens: one sequence's decode rate at context b, from its second
  token on;
- RAM restore: the daemon restores a cached prompt's caches (lazily, MLX) in the step
  that makes its second token, so the cached repeats' first gap less a decode step,
  against their lengths (and a cached block's), a straight line's slope: seconds per
  restored token;
- decode per batch size: that many identical, fully cached requests at once, each
  decoding `decode_tokens`; every sequence's rate from its second token, the median;
- disk restore, if the daemon has a disk tier: two chat prompts of similar length are
  warmed as a warm set (every block is written to disk too); one is asked, followed by
  a short user message (restored from RAM, the message computed); the set is deleted
  (its blocks leave RAM, not the disk: the asked prompt's blocks stay, extended by the
  request); the other is asked the same way (restored from disk): the TTFT difference
  plus the RAM restore of as many tokens is the disk restore.

Positions the same stream of tokens can serve in order share it (the next chunk
extends the previous prompt), so a run computes about as many tokens as its deepest
position. `profile_build` turns the samples into the profile.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from warmfleet_cli.bench_serve.profile_http import Server, Timed
from warmfleet_cli.bench_serve.serve import BenchError, _describe, base_url, client_headers
from warmfleet_common import __version__
from warmfleet_common.tls import TlsOptions, client_verify

DEFAULT_CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
CHUNK_TOKENS = 256  # at least this many tokens computed per prefill sample
DISK_TOKENS = 1024  # each disk-restore prompt's length, about
_TOKEN_IDS = (1000, 30000)  # ordinary tokens in every common vocabulary, no special ones
_NEXT_MESSAGE = "Go on."
_WORD_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "pe", "du", "ga", "zo")


class Notes(Protocol):
    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class ProfileOptions:
    url: str
    contexts: Sequence[int] = DEFAULT_CONTEXTS
    batches: Sequence[int] = DEFAULT_BATCHES
    repetitions: int = 3
    decode_tokens: int = 32
    model: str | None = None
    admin_token: str | None = None
    timeout_s: float = 600.0
    disk_tokens: int = DISK_TOKENS
    api_key: str | None = None
    tls_ca: str | None = None

    def __post_init__(self) -> None:
        if not self.contexts or any(c < 1 for c in self.contexts):
            raise BenchError("--profile-contexts needs positive integers, e.g. 512,1024,2048")
        if not self.batches or any(b < 1 for b in self.batches):
            raise BenchError("--concurrency needs positive integers, e.g. 1,2,4,8,16")
        if self.repetitions < 1:
            raise BenchError("--repetitions must be >= 1")
        if self.decode_tokens < 4:
            raise BenchError("--max-tokens must be >= 4 to measure decoding")


@dataclass(frozen=True)
class ServerFacts:
    """What the daemon says about itself (GET /v1/models, /v1/status)."""

    url: str
    model: str
    version: str | None
    context_length: int
    block_size: int
    max_num_seqs: int | None
    budget_bytes: int
    kv_bytes_per_token: int | None  # as the daemon reports it (tier costs), if it does
    disk_tier: bool


@dataclass(frozen=True)
class Chunk:
    position: int  # the chunk's middle: where its marginal rate is recorded
    start: int  # tokens already cached
    end: int  # the prompt's length


@dataclass(frozen=True)
class PositionSample:
    chunk: Chunk
    extend_ttft_s: float  # [0, start) cached, [start, end) computed
    cached_ttft_s: float  # [0, end) all cached
    restore_gap_s: float | None  # the cached repeat's restore (`Timed.restore_gap_s`)
    decode_tokens_per_s: float | None  # batch 1 at context `decode_context`
    decode_context: int


@dataclass(frozen=True)
class DiskSample:
    ram_ttft_s: float  # a warm prompt restored from RAM
    disk_ttft_s: float  # one as long restored from disk
    ram_tokens: int  # the first's cached tokens from RAM
    disk_ram_tokens: int  # the second's cached tokens from RAM (a shared start)
    disk_tokens: int  # the second's cached tokens from disk


@dataclass
class RunSample:
    tiny_tokens: int = 0
    tiny_restore_gap_s: float | None = None  # a cached block's
    kv_bytes_per_token: float | None = None
    logits_bytes: int | None = None
    positions: list[PositionSample] = field(default_factory=list)
    decode: dict[int, float] = field(default_factory=dict)  # batch -> tokens/s/sequence
    decode_context: int = 0
    disk: DiskSample | None = None


@dataclass
class Measurements:
    facts: ServerFacts
    options: ProfileOptions
    chunks: list[Chunk]
    batches: list[int]
    runs: list[RunSample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def version(self) -> str:
        return __version__


def plan_chunks(
    contexts: Sequence[int], block_size: int, context_length: int, decode_tokens: int
) -> tuple[list[Chunk], list[int]]:
    """The chunks measured for the positions asked, block-aligned, centred on each
    position and kept where the prompt and its decode fit the context; and the
    positions left out (beyond the context)."""
    size = block_size * max(2, -(-CHUNK_TOKENS // block_size))
    limit = (context_length - decode_tokens - 1) // block_size * block_size
    chunks: list[Chunk] = []
    dropped: list[int] = []
    for p in sorted(set(contexts)):
        start = max(0, (p - size // 2) // block_size * block_size)
        end = start + size
        if end > limit:
            end, start = limit, limit - size
        if p > context_length or start < 0:
            dropped.append(p)
            continue
        chunk = Chunk((start + end) // 2, start, end)
        if chunk not in chunks:
            chunks.append(chunk)
    return chunks, dropped


def run_profile(options: ProfileOptions, notes: Notes) -> Measurements:
    return asyncio.run(_run(options, notes))


async def _run(options: ProfileOptions, notes: Notes) -> Measurements:
    url = base_url(options.url)
    timeout = httpx.Timeout(options.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=max(options.batches) + 4)
    async with httpx.AsyncClient(
        base_url=url,
        timeout=timeout,
        limits=limits,
        headers=client_headers(options.api_key),
        verify=client_verify(TlsOptions(ca=options.tls_ca)),
    ) as client:
        probe = Server(client, options.model or "", options.admin_token, options.timeout_s)
        facts = await _facts(probe, url, options)
        server = Server(client, facts.model, options.admin_token, options.timeout_s)
        chunks, dropped = plan_chunks(
            options.contexts, facts.block_size, facts.context_length, options.decode_tokens
        )
        if not chunks:
            raise BenchError(
                f"no --profile-contexts position fits the daemon's context "
                f"({facts.context_length} tokens)"
            )
        batches = sorted({b for b in options.batches if b <= (facts.max_num_seqs or b)})
        measured = Measurements(facts, options, chunks, batches)
        if dropped:
            measured.notes.append(
                f"positions {', '.join(map(str, dropped))} exceed the daemon's context "
                f"({facts.context_length} tokens): not measured"
            )
        if len(batches) < len(set(options.batches)):
            measured.notes.append(f"batch sizes above max_num_seqs={facts.max_num_seqs} left out")
        notes.note(
            f"profiling {facts.model} at {url}: context {facts.context_length}, block "
            f"{facts.block_size}; chunks at {', '.join(str(c.position) for c in chunks)}; "
            f"batches {', '.join(map(str, batches))}; {options.repetitions} run(s)"
        )
        nonce = uuid.uuid4().hex[:8]
        loads = [_load()]
        for rep in range(options.repetitions):
            label = f"run {rep + 1}/{options.repetitions}"
            measured.runs.append(await _one_run(server, measured, f"{nonce}-{rep}", label, notes))
            loads.append(_load())
        if is_local(url) and None not in loads:
            # Whatever else ran on the machine slowed every figure: say how busy it was.
            measured.notes.append(
                "this machine's 1-minute load average at the start and after each run: "
                + ", ".join(f"{load:.2f}" for load in loads)
            )
        if await server.clear() is None:  # leave no benchmark blocks behind
            await server.wait_idle()
        return measured


async def _facts(server: Server, url: str, options: ProfileOptions) -> ServerFacts:
    try:
        listing = await server.client.get("/v1/models", timeout=30)
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {url}: {_describe(exc)}. Is the server running?") from exc
    cards = listing.json().get("data", []) if listing.status_code == 200 else []
    card = next((c for c in cards if options.model in (None, c.get("id"))), None)
    status = await server.status()
    engine = status.get("engine") or {}
    model = options.model or (card or {}).get("id")
    context = (card or {}).get("max_model_len") or (status.get("model") or {}).get("context_length")
    block = engine.get("block_size") or (status.get("kv_transfer") or {}).get("block_size")
    cache = status.get("cache") or {}
    if not model or not context or not block or "bytes" not in cache:
        raise BenchError(
            f"{url} does not say its model, context length, block size and cache bytes "
            "(GET /v1/models, /v1/status): --profile-out measures warmfleet daemons"
        )
    costs = status.get("tier_costs") or {}
    kv = costs.get("kv_bytes_per_token") or (status.get("kv_transfer") or {}).get(
        "kv_bytes_per_token"
    )
    disk = status.get("disk_tier") or {}
    return ServerFacts(
        url=url,
        model=str(model),
        version=status.get("version"),
        context_length=int(context),
        block_size=int(block),
        max_num_seqs=_opt_int(engine.get("max_num_seqs")),
        budget_bytes=int(cache.get("budget_bytes") or 0),
        kv_bytes_per_token=_opt_int(kv),
        disk_tier=disk.get("state") == "on",
    )


class _Tokens:
    """A stream of random token ids, grown on demand: prompts are its prefixes."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(seed)
        self._ids: list[int] = []

    def prefix(self, n: int) -> list[int]:
        while len(self._ids) < n:
            self._ids.append(self._rng.randrange(*_TOKEN_IDS))
        return self._ids[:n]


async def _one_run(
    server: Server, measured: Measurements, seed: str, label: str, notes: Notes
) -> RunSample:
    opts, block = measured.options, measured.facts.block_size
    sample = RunSample()
    why = await server.clear()
    if why and not measured.runs:
        measured.notes.append(f"{why}: measured without clearing the cache first")
    await server.wait_idle()

    # The cache's growth by a cold prompt of one block, then of two.
    grown = []
    for blocks in (1, 2):
        before = int((await server.status()).get("cache", {}).get("bytes", 0))
        await _timed(server, _Tokens(f"{seed}-tiny{blocks}").prefix(blocks * block), 1)
        await server.wait_idle()
        grown.append(int((await server.status()).get("cache", {}).get("bytes", 0)) - before)
    sample.kv_bytes_per_token = (grown[1] - grown[0]) / block
    sample.logits_bytes = 2 * grown[0] - grown[1]
    tiny = _Tokens(f"{seed}-tiny1").prefix(block)
    repeats = [await _timed(server, tiny, 6, cached=block) for _ in range(3)]
    gaps = [g for t in repeats if (g := t.restore_gap_s) is not None]
    sample.tiny_tokens = block
    sample.tiny_restore_gap_s = statistics.median(gaps) if gaps else None
    notes.note(
        f"{label}: cache grew {grown[0]} and {grown[1]} bytes by prompts of 1 and 2 blocks; "
        f"a cached block's TTFT {statistics.median(t.ttft_s for t in repeats) * 1000:.1f} ms"
    )

    stream, cached, streams = _Tokens(f"{seed}-s0"), 0, 0
    reference: list[int] | None = None
    for chunk in measured.chunks:
        if chunk.start < cached:  # this chunk's start is past: a new stream of tokens
            streams += 1
            stream, cached = _Tokens(f"{seed}-s{streams}"), 0
        if chunk.start > cached:
            await _timed(server, stream.prefix(chunk.start), 1)
        prompt = stream.prefix(chunk.end)
        extend = await _timed(server, prompt, 1, cached=chunk.start)
        repeat = await _timed(server, prompt, opts.decode_tokens, cached=chunk.end)
        # A cached prompt's TTFT is a few ms: any hiccup dwarfs it, so the least of three.
        quick = [await _timed(server, prompt, 1, cached=chunk.end) for _ in range(2)]
        cached_ttft = min(t.ttft_s for t in (repeat, *quick))
        cached = chunk.end
        reference = reference or prompt
        decode_context = chunk.end + opts.decode_tokens // 2
        sample.positions.append(
            PositionSample(
                chunk,
                extend.ttft_s,
                cached_ttft,
                repeat.restore_gap_s,
                repeat.decode_tokens_per_s,
                decode_context,
            )
        )
        rate = repeat.decode_tokens_per_s
        notes.note(
            f"{label}: prefill at {chunk.position}: {chunk.end - chunk.start} tokens after "
            f"{chunk.start} cached in {extend.ttft_s:.3f}s, all {chunk.end} cached "
            f"{cached_ttft:.3f}s; decode there "
            + (f"{rate:.2f} tokens/s" if rate else "not measured")
        )

    assert reference is not None  # plan_chunks gave at least one chunk
    sample.decode_context = len(reference) + opts.decode_tokens // 2
    for batch in measured.batches:
        await server.wait_idle()
        together = await asyncio.gather(
            *(server.complete(reference, opts.decode_tokens) for _ in range(batch))
        )
        rates = [r for t in together if (r := t.decode_tokens_per_s) is not None]
        if rates:
            sample.decode[batch] = statistics.median(rates)
            notes.note(
                f"{label}: decode, {batch} at once at context {len(reference)}: "
                f"{sample.decode[batch]:.2f} tokens/s per sequence"
            )

    if measured.facts.disk_tier:
        sample.disk = await _disk(server, measured, seed, label, notes)
    return sample


async def _disk(
    server: Server, measured: Measurements, seed: str, label: str, notes: Notes
) -> DiskSample | None:
    target = min(measured.options.disk_tokens, measured.facts.context_length // 2)
    rng = random.Random(f"{seed}-disk")
    # Made-up words: about three tokens each, and no two prompts share a block.
    texts = [
        " ".join(
            "".join(rng.choice(_WORD_SYLLABLES) for _ in range(rng.randint(2, 4)))
            for _ in range(target // 3)
        )
        for _ in range(2)
    ]
    name = f"profile-{seed}"
    why = await server.warm(name, texts)
    if why is not None:
        if not measured.runs:
            measured.notes.append(f"disk restore not measured: {why}")
        return None
    await server.wait_idle()
    # A message after the warm one: the whole warm prompt is its cached start (the same
    # message alone ends in another chunk), and both compute the same few tokens.
    from_ram = await server.chat([texts[0], _NEXT_MESSAGE], 1)
    await server.wait_idle()
    await server.delete_warm_set(name)  # RAM drops the other prompt's blocks; disk keeps them
    await server.wait_idle()
    from_disk = await server.chat([texts[1], _NEXT_MESSAGE], 1)
    await server.wait_idle()
    disk_tokens = from_disk.by_tier.get("disk", 0)
    if disk_tokens <= 0:
        if not measured.runs:
            measured.notes.append(
                "disk restore not measured: a prompt whose blocks left RAM was not read from "
                f"disk (cached tokens by tier {from_disk.by_tier})"
            )
        return None
    notes.note(
        f"{label}: disk restore: {disk_tokens} tokens from disk in TTFT "
        f"{from_disk.ttft_s:.3f}s, {from_ram.by_tier.get('ram', 0)} from RAM in "
        f"{from_ram.ttft_s:.3f}s"
    )
    return DiskSample(
        ram_ttft_s=from_ram.ttft_s,
        disk_ttft_s=from_disk.ttft_s,
        ram_tokens=from_ram.by_tier.get("ram", 0),
        disk_ram_tokens=from_disk.by_tier.get("ram", 0),
        disk_tokens=disk_tokens,
    )


async def _timed(
    server: Server, prompt: list[int], max_tokens: int, *, cached: int | None = None
) -> Timed:
    """One completion once the daemon is idle; with `cached`, checks the daemon found
    exactly that many of its tokens cached (when it says)."""
    await server.wait_idle()
    timed = await server.complete(prompt, max_tokens)
    if cached is not None and timed.cached_tokens is not None and timed.cached_tokens != cached:
        raise BenchError(
            f"a prompt of {len(prompt)} tokens found {timed.cached_tokens} cached, expected "
            f"{cached}: something else cleared or evicted the cache (another client?), or "
            "the cache budget is too small for the positions asked"
        )
    return timed


def is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None
