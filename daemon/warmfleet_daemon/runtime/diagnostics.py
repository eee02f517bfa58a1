"""Live prefix-cache diagnostics: where recent requests that missed the cache diverge
from what was cached, and what varies there.

The engine calls `observe` on its own thread with every finished request: real
requests go into a bounded window (their token tuples, no copies), warm-ups are
remembered as prefixes known to be cached. A thread of its own runs
`divergence.analyze` over the window for the requests that missed (the same rule as the
`warmfleet.cache.outcome` metric: anything before the last message not served from the
cache), so an operator sees "a date/time varies at token 7" with the text there,
without collecting logs. HTTP routes only read its latest report (or wait for a fresh
one without holding a worker thread): whatever the analysis costs, it never delays
`/v1/status`, and each run is bounded (linear in the tokens, a time budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from warmfleet_daemon.divergence import Decode, DivergenceReport, PromptTokens, analyze
from warmfleet_daemon.engine.requests import Event, GenerationRequest
from warmfleet_daemon.support.background import BackgroundThread

log = logging.getLogger(__name__)

WINDOW = 256  # recent requests analyzed
_WARM_PREFIXES = 64  # recently warmed prefixes kept as references
_PREFIX_TOKENS = 4096  # static parts are analyzed up to this many tokens
_MAX_DIFFS = 64  # misses diffed per report: bounds the work done while serving
_TIME_BUDGET_S = 2.0  # ... and so does this: no diff starts after it
_REFRESH_S = 30.0  # new traffic is analyzed at most this often unless a report is asked for


@dataclass(frozen=True)
class _Seen:
    tokens: tuple[int, ...]
    static_end: int | None  # tokens before the last message (chat); None: a plain prompt
    cached_tokens: int
    missed: bool


@dataclass(frozen=True)
class _Memo:
    observed: int  # requests observed when it was computed
    at: float  # time.monotonic()
    report: dict[str, Any]


class CacheDiagnostics:
    def __init__(
        self,
        decode: Decode,
        *,
        window: int = WINDOW,
        block_size: int = 16,
        refresh_s: float = _REFRESH_S,
    ) -> None:
        self._decode = decode
        self._window: deque[_Seen] = deque(maxlen=window)
        self._warm: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._block_size = block_size
        self._refresh_s = refresh_s
        self._observed = 0
        self._lock = threading.Lock()
        self._worker = BackgroundThread("warmfleet-diagnostics", self._lock)
        self._wanted = False  # a caller waits for a report of the current window
        # fresh_report() callers: (requests observed when asked, their loop, a future)
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._memo = _Memo(0, time.monotonic(), self._analyze([], []))

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._worker.start(self._run)

    def stop(self) -> None:
        self._worker.stop()

    def observe(self, request: GenerationRequest, event: Event) -> None:
        """Engine observer (engine thread): O(1), no analysis here."""
        tokens = request.prompt.tokens
        if request.prefill_only:
            if event.finish_reason == "prefilled" and not request.idle:
                with self._lock:
                    self._warm[hash(tokens)] = tokens
                    self._warm.move_to_end(hash(tokens))
                    while len(self._warm) > _WARM_PREFIXES:
                        self._warm.popitem(last=False)
            return
        if event.usage is None:
            return
        start = request.prompt.content_start
        static = start or len(tokens)
        seen = _Seen(
            tokens,
            start or None,
            event.usage.cached_tokens,
            missed=event.usage.cached_tokens < static,
        )
        with self._lock:
            self._window.append(seen)
            self._observed += 1
            if self._memo.observed == 0:  # the first traffic: analyze it soon
                self._worker.wake.notify_all()

    def report(self) -> dict[str, Any]:
        """The latest diagnostics document (never waits for an analysis)."""
        return self._memo.report

    async def fresh_report(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """A report of the window as it is now: asks the analysis thread for one and
        waits for it on the event loop (no worker thread held); after `timeout_s`, the
        latest there is."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._lock:
            observed = self._observed
            if self._memo.observed >= observed:
                return self._memo.report
            self._waiters.append((observed, loop, done))
            self._wanted = True
            self._worker.wake.notify_all()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done, timeout_s)
        return self._memo.report

    def summary(self) -> dict[str, Any]:
        """For /v1/status: counts (current) and where misses diverge (from the latest
        report, at most `refresh_s` old while traffic flows), without any prompt text:
        the status route is not an admin route; the text is on /v1/cache/diagnostics.
        O(window): never waits for an analysis."""
        with self._lock:
            requests = len(self._window)
            misses = sum(s.missed for s in self._window)
        report = self._memo.report
        return {
            "requests": requests,
            "misses": misses,
            "divergences": [
                {"token": p["position"], "kind": p["kind"], "requests": p["requests"]}
                for p in report["points"]
                if p["kind"] != "new prompt"
            ][:3],
            "divergences_as_of": report["computed_at"],
            "details": "/v1/cache/diagnostics",
        }

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._worker.stopping and not self._due():
                    self._worker.wake.wait(timeout=1.0)
                if self._worker.stopping:
                    return
                self._wanted = False
                window, warm, observed = (
                    list(self._window),
                    list(self._warm.values()),
                    self._observed,
                )
            try:
                report = self._analyze(window, warm)
            except Exception:  # diagnostics must never take serving down
                log.exception("cache diagnostics analysis failed")
                report = {**self._memo.report, "error": "analysis failed; see the daemon log"}
            with self._lock:
                self._memo = _Memo(observed, time.monotonic(), report)
                ready = [w for w in self._waiters if w[0] <= observed]
                self._waiters = [w for w in self._waiters if w[0] > observed]
            for _, loop, future in ready:
                with contextlib.suppress(RuntimeError):  # its loop has closed
                    loop.call_soon_threadsafe(_resolve, future)

    def _due(self) -> bool:
        memo = self._memo
        if memo.observed == self._observed:
            return False
        return self._wanted or memo.observed == 0 or time.monotonic() - memo.at >= self._refresh_s

    def _analyze(self, window: list[_Seen], warm: list[tuple[int, ...]]) -> dict[str, Any]:
        misses = [i for i, seen in enumerate(window) if seen.missed]
        prompt_tokens = sum(len(s.tokens) for s in window)
        result: DivergenceReport | None = None
        if misses:
            result = analyze(
                [PromptTokens(s.tokens, s.static_end) for s in window],
                self._decode,
                prefix_tokens=_PREFIX_TOKENS,
                block_size=self._block_size,
                references=warm,
                targets=misses,
                max_points=5,
                max_diffs=_MAX_DIFFS,
                time_budget_s=_TIME_BUDGET_S,
            )
        points = [p.to_dict() for p in result.points] if result else []
        for point in points:
            point["message"] = (
                f"{point['kind']} at token {point['position']} in {point['requests']} of "
                f"{len(misses)} recent misses: {point['excerpt']}"
            )
        findings = [f.to_dict() for f in result.findings] if result else []
        if result and result.matched:
            findings.append(
                {
                    "topic": "evicted",
                    "message": f"{result.matched} recent misses share their whole static prefix "
                    "with an earlier request: it was cached once and is gone.",
                    "advice": "The prefix was evicted or the cache cleared: raise "
                    "--cache-memory-mb, or pin it as a warm prompt.",
                }
            )
        return {
            "window": {
                "size": self._window.maxlen,
                "requests": len(window),
                "misses": len(misses),
                "warm_prefixes": len(warm),
                "hit_rate": (
                    sum(s.cached_tokens for s in window) / prompt_tokens if prompt_tokens else 0.0
                ),
            },
            "analysis": (
                {
                    "unique_prefix_share": result.unique_prefix_share,
                    "ideal_hit_rate": result.hit_rate,
                    "block_hit_rate": result.block_hit_rate,
                    "theoretical_hit_rate": result.theoretical_hit_rate,
                    "block_size": result.block_size,
                    "first_divergence": [
                        {"position": pos, "requests": n} for pos, n in result.first_divergence[:10]
                    ],
                    "misses_matched_in_full": result.matched,
                    "misses_new_prompts": result.new_prompts,
                    "misses_diffed": result.diffed,
                }
                if result
                else None
            ),
            "points": points,
            "findings": findings,
            "computed_at": time.time(),
        }


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # the waiter may have timed out
        future.set_result(None)
