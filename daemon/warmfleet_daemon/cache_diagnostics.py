"""Live prefix-cache diagnostics: where recent requests that missed the cache diverge
from what was cached, and what varies there.

The engine calls `observe` on its own thread with every finished request: real
requests go into a bounded window (their token tuples, no copies), warm-ups are
remembered as prefixes known to be cached. `report()` runs `divergence.analyze` over
the window, on demand and off the engine thread, for the requests that missed (the
same rule as the `warmfleet.cache.outcome` metric: anything before the last message
not served from the cache), so an operator sees "a date/time varies at token 7" with
the text there, without collecting logs.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from warmfleet_daemon.divergence import Decode, DivergenceReport, PromptTokens, analyze
from warmfleet_daemon.engine.core import Event, GenerationRequest

WINDOW = 256  # recent requests analyzed
_WARM_PREFIXES = 64  # recently warmed prefixes kept as references
_PREFIX_TOKENS = 4096  # static parts are analyzed up to this many tokens
_MAX_DIFFS = 64  # misses diffed per report: bounds the work done while serving
_STATUS_MAX_AGE_S = 30.0  # /v1/status reuses a report this recent


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
    def __init__(self, decode: Decode, *, window: int = WINDOW, block_size: int = 16) -> None:
        self._decode = decode
        self._window: deque[_Seen] = deque(maxlen=window)
        self._warm: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._block_size = block_size
        self._observed = 0
        self._lock = threading.Lock()
        self._compute = threading.Lock()  # one analysis at a time
        self._memo: _Memo | None = None

    def observe(self, request: GenerationRequest, event: Event) -> None:
        """Engine observer (engine thread): O(1), no analysis here."""
        tokens = request.prompt.tokens
        if request.prefill_only:
            if event.finish_reason == "prefilled":
                with self._lock:
                    self._warm[hash(tokens)] = tokens
                    self._warm.move_to_end(hash(tokens))
                    while len(self._warm) > _WARM_PREFIXES:
                        self._warm.popitem(last=False)
            return
        if event.usage is None:
            return
        cuts = request.prompt.cuts
        static = cuts[-1] if cuts else len(tokens)
        seen = _Seen(
            tokens,
            cuts[-1] if cuts else None,
            event.usage.cached_tokens,
            missed=event.usage.cached_tokens < static,
        )
        with self._lock:
            self._window.append(seen)
            self._observed += 1

    def report(self, max_age_s: float = 0.0) -> dict[str, Any]:
        """The diagnostics document; recomputed when requests arrived since the last one
        and it is older than `max_age_s`."""
        with self._compute:
            with self._lock:
                window, warm, observed = (
                    list(self._window),
                    list(self._warm.values()),
                    self._observed,
                )
            memo = self._memo
            if memo is not None and (
                memo.observed == observed or time.monotonic() - memo.at < max_age_s
            ):
                return memo.report
            report = self._analyze(window, warm)
            self._memo = _Memo(observed, time.monotonic(), report)
            return report

    def summary(self) -> dict[str, Any]:
        """For /v1/status: counts (current) and where misses diverge (from a report at
        most 30 s old), without any prompt text: the status route is not an admin
        route; the text is on /v1/cache/diagnostics."""
        with self._lock:
            requests = len(self._window)
            misses = sum(s.missed for s in self._window)
        report = self.report(max_age_s=_STATUS_MAX_AGE_S)
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
