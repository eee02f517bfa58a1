"""Spill: a request the router sent away from the daemon that holds its blocks names that
daemon as a peer; the blocks this daemon lacks are copied from it instead of prefilled,
when the copy is estimated faster.

The copy goes over the peer path warm-up uses (`PeerClient`: the router's peer grant
or this daemon's admin token, fingerprint
check, a byte cap per response) within a deadline, and feeds the prompt's match the way
the disk tier's reader does: blocks arrive in chain order, each is inserted into the
RAM cache (or held for the prompt when RAM will not take it) and wakes the engine, which
restores the first ones while the rest arrive. A peer that goes away or misbehaves ends
the copy there; the engine prefills the rest (`Prefetch.failed`).

The estimate (`copy_is_faster`) weighs the daemon's own costs, measured at start
(`TierCosts`: prefill and RAM restore per token, KV bytes per token), against the
transfer rate it has observed from that peer; before the first copy from a peer it
assumes `FIRST_GUESS_BYTES_PER_S`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_common.tiers import Tier, TierCosts
from warmfleet_daemon.cache.events import HeldBlock, TierListener
from warmfleet_daemon.cache.prefix_cache import BlockSource, PrefixCache
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.requests import GenerationRequest
from warmfleet_daemon.engine.threads import wait_until_gone
from warmfleet_daemon.engine.tiers import Prefetch
from warmfleet_daemon.kvtransfer.context import SpillMode, TierContext
from warmfleet_daemon.kvtransfer.peers import BATCH, PeerClient

log = logging.getLogger(__name__)


# Before any copy from a peer: 50 MB/s and 5 ms per request, what a loaded gigabit link
# or a good Wi-Fi gives; Thunderbolt and 10GbE do several times better, and the observed
# rate replaces this after the first copy.
FIRST_GUESS_BYTES_PER_S = 50e6
FIRST_GUESS_LATENCY_S = 0.005
_WEIGHT = 0.5  # of the newest copy in the observed rate (a moving average)
_SLACK_S = 0.5  # added to the deadline: connecting, the fingerprint, scheduling


@dataclass(frozen=True)
class Estimate:
    copy_s: float
    prefill_s: float

    @property
    def faster(self) -> bool:
        return self.copy_s < self.prefill_s


def copy_is_faster(
    tokens: int, blocks: int, costs: TierCosts, bytes_per_s: float, latency_s: float
) -> Estimate:
    """The decision: copying `tokens` (in `blocks` blocks) from a peer that sends
    `bytes_per_s` with `latency_s` per request, then restoring them from RAM, against
    prefilling them here."""
    requests = 1 + math.ceil(blocks / BATCH)  # the fingerprint, then batches of blocks
    transfer = tokens * costs.kv_bytes_per_token / max(bytes_per_s, 1.0)
    restore = tokens * costs.hit_us_per_token["ram"] / 1e6
    return Estimate(
        requests * latency_s + transfer + restore, tokens * costs.prefill_us_per_token / 1e6
    )


@dataclass
class _Rate:
    bytes_per_s: float
    latency_s: float
    copies: int = 0


@dataclass(frozen=True)
class SpillStats:
    mode: SpillMode
    copies: int  # copies started
    declined: int  # estimated slower than prefill (or every copy slot busy)
    short: int  # ended where the peer's blocks end (a new turn's own tokens: prefilled)
    failed: int  # ended early: the peer refused, went away, misbehaved or was too slow
    blocks: int  # copied and verified
    tokens: int
    bytes: int
    seconds: float  # spent copying (throughput: bytes/this)
    peers: dict[str, dict[str, float]]  # per peer URL: the observed rate and latency


class PeerSpill:
    def __init__(
        self,
        client: PeerClient,
        cache: PrefixCache[kv.BlockPayload],
        costs: TierCosts | None = None,
        *,
        mode: SpillMode = "auto",
        max_copies: int = 2,
        deadline_s: float = 120.0,
    ) -> None:
        """`costs` (set once the daemon has measured them at start; None: no copy in
        `auto`); `deadline_s` bounds a copy whose estimate is unknown (`always`)."""
        self.client = client
        self.cache = cache
        self.costs = costs
        self.mode = mode
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._rates: dict[str, _Rate] = {}
        self._free = max_copies
        self._copies = self._declined = self._short = self._failed = 0
        self._blocks = self._tokens = self._bytes = 0
        self._seconds = 0.0
        self._running: dict[threading.Thread, Prefetch] = {}
        self._stopping = False
        self.listeners: list[TierListener] = []  # it holds nothing of its own to tell

    name: Tier = "peer"

    def prefetch(
        self,
        request: GenerationRequest,
        chunks: Sequence[Chunk],
        start: int,
        wake: Callable[[], None],
    ) -> Prefetch | None:
        """Start copying `chunks[start:]` from the peer the request names (presenting its
        grant, if any) on a thread of its own, if that is estimated faster than
        prefilling them. None: prefill them (or the request names no peer)."""
        peer, grant, prompt = request.peer, request.peer_grant, request.prompt
        if peer is None or self.mode == "off" or start >= len(chunks):
            return None
        wanted = list(chunks[start:])
        tokens = sum(c.size for c in wanted)
        deadline_s = self.deadline_s
        costs = self.costs
        if self.mode == "auto":
            if costs is None:
                return None
            rate = self._rate(peer)
            estimate = copy_is_faster(tokens, len(wanted), costs, rate.bytes_per_s, rate.latency_s)
            if not estimate.faster:
                with self._lock:
                    self._declined += 1
                log.debug("spill from %s: prefill is faster (%s)", peer, estimate)
                return None
            # Past the time prefill would have taken, the copy has lost: prefill the rest.
            deadline_s = min(deadline_s, estimate.prefill_s + _SLACK_S)
        with self._lock:
            if self._stopping or self._free == 0:
                self._declined += 1
                return None
            self._free -= 1
            self._copies += 1
        job = Prefetch(wanted, chunks[start - 1].key if start else None, outlives_prompt=False)
        thread = threading.Thread(
            target=self._copy,
            args=(
                job,
                prompt,
                list(chunks),
                start,
                peer,
                time.monotonic() + deadline_s,
                wake,
                grant,
            ),
            name="warmfleet-peer-spill",
            daemon=True,
        )
        with self._lock:
            self._running[thread] = job
        thread.start()
        return job

    def store(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: kv.BlockPayload,
        source: BlockSource = "prefill",
    ) -> bool:
        return False  # a peer keeps its own blocks, not ours

    def read_seconds(self, payload: kv.BlockPayload, chunk: Chunk, budget_s: float) -> float | None:
        return None  # a copy's cost is the link's to each peer: `copy_is_faster` weighs it

    def held(self) -> Sequence[HeldBlock]:
        return ()  # the peers' blocks are in their own snapshots

    def _copy(
        self,
        job: Prefetch,
        prompt: RenderedPrompt,
        chunks: list[Chunk],
        start: int,
        peer: str,
        deadline: float,
        wake: Callable[[], None],
        grant: str | None,
    ) -> None:
        started = time.monotonic()
        nbytes = 0
        parent = job.parent
        ended: list[str] = []
        try:
            for index, payload in self.client.fetch(
                peer,
                prompt,
                chunks,
                start,
                deadline,
                deadline_name="the spill's deadline",
                ended=ended,
                grant=grant,
            ):
                if job.cancelled:
                    break
                chunk = chunks[index]
                if chunk.key not in self.cache:
                    self.cache.insert(chunk, parent, payload, payload.nbytes, source="peer")
                    job.held[chunk.key] = payload  # the prompt's until taken (RAM may evict it)
                job.read.add(chunk.key)
                nbytes += payload.nbytes
                parent = chunk.key
                job.done += 1
                wake()
        except Exception:  # never leave a prompt waiting on a copy that died
            ended.append("error")
            log.exception("copying blocks from peer %s failed", peer)
        finally:
            copied = job.done
            if copied < len(job.chunks):
                job.failed = True
            elapsed = time.monotonic() - started
            self._finished(job, peer, copied, nbytes, elapsed, ended)
            wake()
            with self._lock:
                self._free += 1
                self._running.pop(threading.current_thread(), None)

    def _finished(
        self, job: Prefetch, peer: str, copied: int, nbytes: int, elapsed: float, ended: list[str]
    ) -> None:
        tokens = sum(c.size for c in job.chunks[:copied])
        with self._lock:
            self._blocks += copied
            self._tokens += tokens
            self._bytes += nbytes
            self._seconds += elapsed
            if job.failed and not job.cancelled:
                if ended[:1] == ["lacking"]:
                    self._short += 1
                else:
                    self._failed += 1
            if copied and elapsed > 0:  # what this peer really gives
                rate = self._rates.setdefault(
                    peer, _Rate(FIRST_GUESS_BYTES_PER_S, FIRST_GUESS_LATENCY_S)
                )
                seen = nbytes / elapsed
                weight = 1.0 if rate.copies == 0 else _WEIGHT
                rate.bytes_per_s = (1 - weight) * rate.bytes_per_s + weight * seen
                rate.latency_s = 0.0  # the observed rate includes its requests' latency
                rate.copies += 1
        log.info(
            "copied %d/%d block(s), %d tokens, %.1f MiB from peer %s in %.2fs%s",
            copied,
            len(job.chunks),
            tokens,
            nbytes / (1 << 20),
            peer,
            elapsed,
            "" if copied == len(job.chunks) else " (the rest is prefilled)",
        )

    def _rate(self, peer: str) -> _Rate:
        with self._lock:
            found = self._rates.get(peer)
            if found is None:
                return _Rate(FIRST_GUESS_BYTES_PER_S, FIRST_GUESS_LATENCY_S)
            return _Rate(found.bytes_per_s, found.latency_s)

    def stats(self) -> SpillStats:
        with self._lock:
            return SpillStats(
                self.mode,
                self._copies,
                self._declined,
                self._short,
                self._failed,
                self._blocks,
                self._tokens,
                self._bytes,
                self._seconds,
                {
                    url: {"bytes_per_s": r.bytes_per_s, "copies": r.copies}
                    for url, r in self._rates.items()
                },
            )

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            running = list(self._running.items())
        for _, job in running:
            job.cancelled = True
        for thread, _ in running:
            thread.join(timeout=30)
            wait_until_gone(thread)  # it decoded blocks with mlx: see wait_until_gone


def build(context: TierContext) -> PeerSpill:
    """Always built (a request names a peer only when the router sends it one); its mode
    decides whether it copies."""
    options = context.options
    return PeerSpill(
        context.peers,
        context.cache,
        mode=options.spill,
        deadline_s=options.spill_deadline_s,
    )
