"""Per-request measurements and their per-cell statistics (pure functions)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestResult:
    """One streamed request, as the client saw it. Times are seconds from sending it."""

    prompt_set: str
    concurrency: int
    repetition: int
    index: int  # within its cell
    ttft_s: float | None  # to the first generated token (None: none arrived)
    e2e_s: float  # to the end of the stream, or to the failure
    prompt_tokens: int | None = None  # from `usage` (None: the server did not say)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # set when the request failed (HTTP, transport, stream)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first."""
        n = self.completion_tokens
        if self.ttft_s is None or n is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)


@dataclass(frozen=True)
class Summary:
    p50: float | None
    p95: float | None
    mean: float | None
    count: int


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linearly interpolated between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float | None]) -> Summary:
    present = [v for v in values if v is not None]
    if not present:
        return Summary(None, None, None, 0)
    return Summary(
        percentile(present, 50), percentile(present, 95), sum(present) / len(present), len(present)
    )


@dataclass(frozen=True)
class CellStats:
    requests: int
    ok: int
    errors: int
    length_finishes: int  # stopped at max_tokens: a success, counted for information
    ttft: Summary
    tpot: Summary
    e2e: Summary
    prompt_tokens: Summary
    cached_tokens: Summary
    completion_tokens: Summary
    cached_share: float | None  # cached / prompt tokens over the successful requests
    duration_s: float  # wall time the cell's requests took
    request_throughput: float  # successful requests per second
    output_token_throughput: float  # completion tokens per second
    error_messages: tuple[str, ...]  # distinct messages, most frequent first


def cell_stats(results: Sequence[RequestResult], duration_s: float) -> CellStats:
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    with_cache = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    prompt_total = sum(r.prompt_tokens or 0 for r in with_cache)
    completion_total = sum(r.completion_tokens or 0 for r in ok)
    counts: dict[str, int] = {}
    for r in failed:
        counts[r.error or ""] = counts.get(r.error or "", 0) + 1
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    return CellStats(
        requests=len(results),
        ok=len(ok),
        errors=len(failed),
        length_finishes=sum(r.finish_reason == "length" for r in ok),
        ttft=summarize([r.ttft_s for r in ok]),
        tpot=summarize([r.tpot_s for r in ok]),
        e2e=summarize([r.e2e_s for r in ok]),
        prompt_tokens=summarize([_float(r.prompt_tokens) for r in ok]),
        cached_tokens=summarize([_float(r.cached_tokens) for r in ok]),
        completion_tokens=summarize([_float(r.completion_tokens) for r in ok]),
        cached_share=(
            sum(r.cached_tokens or 0 for r in with_cache) / prompt_total if prompt_total else None
        ),
        duration_s=duration_s,
        request_throughput=per_s(len(ok)),
        output_token_throughput=per_s(completion_total),
        error_messages=tuple(sorted(counts, key=lambda m: -counts[m])),
    )


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)
