"""What `warmfleet sim report` draws, computed from a run directory (report_run) without
matplotlib, so every figure's numbers are testable as plain data. Times are the profiled
Mac's seconds since the run's start, except the router's own figures (decision latency,
CPU), which are this machine's wall time: the router is not simulated. Missing files or
fields make a series empty, never an error."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from warmfleet_cli.sim.report_run import Row, Run, event_time, number

TIERS = ("ram", "disk", "peer")
UNATTRIBUTED = "untiered"  # cached tokens a row does not split by tier (older runs)
QUANTILES = (50, 95, 99)


# -- requests ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank, as `sim replay`'s summary computes it, so the figures agree."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def failed(row: Row) -> bool:
    return row.get("error") is not None


def is_first(row: Row) -> bool:
    return row.get("turn") == 0


def sent(row: Row) -> float:
    return number(row.get("sent_s")) or 0.0


def tokens(row: Row, key: str) -> int:
    return int(number(row.get(key)) or 0)


def served_ttfts(rows: Iterable[Row]) -> list[float]:
    return [t for r in rows if not failed(r) and (t := number(r.get("ttft_s"))) is not None]


@dataclass(frozen=True)
class TtftWindow:
    start_s: float
    requests: int
    failed: int
    p50: float | None
    p95: float | None
    p99: float | None


def _windows(rows: list[Row], window_s: float) -> list[tuple[float, list[Row]]]:
    """Consecutive windows from 0 to the last request, empty ones kept (gaps stay gaps)."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    if not rows:
        return []
    count = int(max(sent(r) for r in rows) // window_s) + 1
    buckets: list[list[Row]] = [[] for _ in range(count)]
    for row in rows:
        buckets[max(0, int(sent(row) // window_s))].append(row)
    return [(n * window_s, bucket) for n, bucket in enumerate(buckets)]


def ttft_windows(rows: list[Row], window_s: float, *, first_only: bool) -> list[TtftWindow]:
    """TTFT p50/p95/p99 of the served requests sent in each window, with its failures."""
    chosen = [r for r in rows if is_first(r)] if first_only else rows
    out = []
    for start, bucket in _windows(chosen, window_s):
        ttfts = served_ttfts(bucket)
        p50, p95, p99 = (percentile(ttfts, q) for q in QUANTILES)
        out.append(TtftWindow(start, len(bucket), sum(map(failed, bucket)), p50, p95, p99))
    return out


@dataclass(frozen=True)
class HitWindow:
    start_s: float
    prompt_tokens: int
    by_tier: dict[str, float]  # each tier's share of the window's prompt tokens
    hit_rate: float | None
    first_hit_rate: float | None  # first requests' only


def tier_tokens(row: Row) -> dict[str, int]:
    """A served row's cached tokens by tier; what its tiers do not account for is
    UNATTRIBUTED, so the tiers always add up to the row's cached tokens."""
    tiers = row.get("cached_by_tier")
    split = (
        {str(k): int(v) for k, v in tiers.items() if number(v) is not None}
        if isinstance(tiers, dict)
        else {}
    )
    rest = tokens(row, "cached_tokens") - sum(split.values())
    if rest > 0:
        split[UNATTRIBUTED] = rest
    return split


def hit_rate(rows: Iterable[Row]) -> float | None:
    served = [r for r in rows if not failed(r)]
    prompt = sum(tokens(r, "prompt_tokens") for r in served)
    return sum(tokens(r, "cached_tokens") for r in served) / prompt if prompt else None


def tier_shares(rows: Iterable[Row]) -> dict[str, float]:
    """Each tier's cached tokens over all served prompt tokens (they add up to the hit rate)."""
    served = [r for r in rows if not failed(r)]
    prompt = sum(tokens(r, "prompt_tokens") for r in served)
    totals: dict[str, int] = {}
    for row in served:
        for tier, n in tier_tokens(row).items():
            totals[tier] = totals.get(tier, 0) + n
    return {t: totals[t] / prompt for t in ordered_tiers(totals)} if prompt else {}


def ordered_tiers(tiers: Iterable[str]) -> list[str]:
    seen = set(tiers)
    ordered = [t for t in TIERS if t in seen] + sorted(seen - set(TIERS) - {UNATTRIBUTED})
    return ordered + ([UNATTRIBUTED] if UNATTRIBUTED in seen else [])


def hit_windows(rows: list[Row], window_s: float) -> list[HitWindow]:
    out = []
    for start, bucket in _windows(rows, window_s):
        served = [r for r in bucket if not failed(r)]
        out.append(
            HitWindow(
                start,
                sum(tokens(r, "prompt_tokens") for r in served),
                tier_shares(served),
                hit_rate(served),
                hit_rate([r for r in served if is_first(r)]),
            )
        )
    return out


# -- events -----------------------------------------------------------------------------

BURST_GAP_S = 600.0  # events of one kind this close are one mark (a rolling restart's nodes)


@dataclass(frozen=True)
class EventMark:
    """One event, or a burst of one kind (a hundred node-restarted), as one mark."""

    kind: str
    start_s: float
    end_s: float
    events: list[Row]

    @property
    def applied(self) -> bool:
        return all(e.get("applied") is not False for e in self.events)

    @property
    def text(self) -> str:
        if len(self.events) > 1:
            text = f"{self.kind} x{len(self.events)}"
        else:
            event = self.events[0]
            text = self.kind + "".join(
                f" {name}{event[key]}"
                for key, name in (("node", ""), ("count", "+"), ("detail", ""))
                if event.get(key) is not None
            )
        return text + ("" if self.applied else " (not applied)")


def event_marks(events: Iterable[Row], gap_s: float = BURST_GAP_S) -> list[EventMark]:
    marks: list[EventMark] = []
    open_by_kind: dict[str, int] = {}
    for event in sorted(events, key=event_time):
        kind, t = str(event.get("event") or "event"), event_time(event)
        at = open_by_kind.get(kind)
        if at is not None and t - marks[at].end_s <= gap_s:
            mark = marks[at]
            marks[at] = EventMark(kind, mark.start_s, t, [*mark.events, event])
        else:
            open_by_kind[kind] = len(marks)
            marks.append(EventMark(kind, t, t, [event]))
    return marks


# -- nodes ------------------------------------------------------------------------------


def node_order(name: str) -> tuple[str, int, str]:
    """node-2 before node-10."""
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match.group(1), int(match.group(2)), "") if match else (name, -1, name)


@dataclass(frozen=True)
class NodeLoad:
    node: str
    requests: int  # the rows the router sent there
    failed: int
    cache_bytes: int | None  # at the last sample that has the node
    cache_peak_bytes: int | None
    budget_bytes: int | None


def node_loads(run: Run) -> list[NodeLoad]:
    """Per node: the requests the rows say it served (the samples' own count when rows
    name no node), and its cache memory at the end, at its peak, and its budget."""
    requests: dict[str, int] = {}
    failures: dict[str, int] = {}
    for row in run.rows:
        node = row.get("node")
        if isinstance(node, str) and node:
            requests[node] = requests.get(node, 0) + 1
            failures[node] = failures.get(node, 0) + failed(row)
    rows_name_nodes = bool(requests)
    last: dict[str, dict[str, Any]] = {}
    peak: dict[str, int] = {}
    for sample in run.samples:
        for node, figures in (sample.get("nodes") or {}).items():
            if not isinstance(figures, dict):
                continue
            last[node] = figures
            cache = number(figures.get("cache_bytes"))
            if cache is not None:
                peak[node] = max(peak.get(node, 0), int(cache))
            counted = number(figures.get("requests"))
            if not rows_name_nodes and counted is not None:
                requests[node] = int(counted)  # cumulative: the last sample's
    loads = []
    for node in sorted(set(requests) | set(last), key=node_order):
        figures = last.get(node, {})
        cache = number(figures.get("cache_bytes"))
        budget = number(figures.get("cache_budget_bytes"))
        loads.append(
            NodeLoad(
                node,
                requests.get(node, 0),
                failures.get(node, 0),
                None if cache is None else int(cache),
                peak.get(node),
                None if budget is None else int(budget),
            )
        )
    return loads


@dataclass(frozen=True)
class FleetPoint:
    t: float
    nodes: int
    nodes_ready: int
    cache_bytes: dict[str, int]  # per node
    warm_sets: int | None
    warm_sets_ready: int | None


def fleet_points(run: Run) -> list[FleetPoint]:
    points = []
    for sample in run.samples:
        nodes = {k: v for k, v in (sample.get("nodes") or {}).items() if isinstance(v, dict)}
        operator = sample.get("operator") or {}
        sets, ready = (number(operator.get(k)) for k in ("warm_sets", "warm_sets_ready"))
        points.append(
            FleetPoint(
                number(sample.get("t")) or 0.0,
                len(nodes),
                sum(bool(v.get("ready")) for v in nodes.values()),
                {
                    k: int(c)
                    for k, v in nodes.items()
                    if (c := number(v.get("cache_bytes"))) is not None
                },
                None if sets is None else int(sets),
                None if ready is None else int(ready),
            )
        )
    return points


@dataclass(frozen=True)
class CacheSpread:
    """The nodes' cache memory at one sample, as a distribution (a hundred lines read as
    none): smallest, 10th percentile, median, 90th, largest."""

    t: float
    low: int
    p10: int
    median: int
    p90: int
    high: int


def cache_spread(points: Iterable[FleetPoint]) -> list[CacheSpread]:
    out = []
    for point in points:
        sizes = [float(v) for v in point.cache_bytes.values()]
        if sizes:
            p10, median, p90 = (int(percentile(sizes, q) or 0) for q in (10, 50, 90))
            out.append(CacheSpread(point.t, int(min(sizes)), p10, median, p90, int(max(sizes))))
    return out


# -- the router -------------------------------------------------------------------------


def bucket_counts(buckets: Mapping[str, Any]) -> list[tuple[float, float]]:
    """A Prometheus histogram's cumulative buckets as (le, count), by le."""
    pairs = []
    for le, count in buckets.items():
        try:
            pairs.append((float(le), float(count)))
        except (TypeError, ValueError):
            continue
    return sorted(pairs)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets: linear within
    the bucket the rank falls in, 0 as the first bucket's lower bound, the highest finite
    le when the rank falls in +Inf. Written here as it is 20 lines and no Python library
    computes it (prometheus_client only exposes histograms)."""
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    # Counts scraped at slightly different moments can decrease; Prometheus evens them.
    counts: list[float] = []
    for _, count in buckets:
        counts.append(max(count, counts[-1]) if counts else count)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    for n, (le, count) in enumerate(zip((b[0] for b in buckets), counts)):
        if count >= rank:
            if math.isinf(le):
                return buckets[n - 1][0] if n > 0 else None
            lower = buckets[n - 1][0] if n > 0 else 0.0
            below = counts[n - 1] if n > 0 else 0.0
            if (n == 0 and le <= 0) or count <= below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
    return None


def bucket_deltas(
    before: list[tuple[float, float]], after: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The decisions between two samples, by bucket. A count that went down means the
    router restarted (its counters reset): the later counts are then the whole interval's,
    as Prometheus' rate() takes them."""
    earlier = dict(before)
    if any(count < earlier.get(le, 0.0) for le, count in after):
        return list(after)
    return [(le, count - earlier.get(le, 0.0)) for le, count in after]


@dataclass(frozen=True)
class RouterPoint:
    t: float  # the interval's end, Mac seconds
    wall_s: float | None  # the interval's wall time (Mac seconds / the run's speed)
    decisions: float | None  # in the interval
    decision_p50_s: float | None
    decision_p99_s: float | None
    cpu_percent: float | None  # of one core, over the interval's wall time
    rss_bytes: int | None
    index_bytes: int | None
    index_blocks: int | None


def router_points(run: Run) -> list[RouterPoint]:
    """One point per sample: the memory it read, and the latency and CPU of the interval
    since the previous sample (none for the first)."""
    points = []
    previous: dict[str, Any] | None = None
    previous_t = 0.0
    for sample in run.samples:
        router = sample.get("router")
        if not isinstance(router, dict):
            continue
        t = number(sample.get("t")) or 0.0
        decisions = p50 = p99 = cpu = wall_s = None
        if previous is not None:
            buckets = bucket_deltas(
                bucket_counts(previous.get("decision_buckets") or {}),
                bucket_counts(router.get("decision_buckets") or {}),
            )
            if buckets:
                decisions = buckets[-1][1]
                p50, p99 = (histogram_quantile(q, buckets) for q in (0.5, 0.99))
            spent, wall_s = _cpu_spent(previous, router), (t - previous_t) / run.speed
            cpu = None if spent is None or wall_s <= 0 else 100.0 * spent / wall_s
        rss, index, blocks = (
            number(router.get(k)) for k in ("rss_bytes", "index_bytes", "index_blocks")
        )
        points.append(
            RouterPoint(
                t,
                wall_s,
                decisions,
                p50,
                p99,
                cpu,
                None if rss is None else int(rss),
                None if index is None else int(index),
                None if blocks is None else int(blocks),
            )
        )
        previous, previous_t = router, t
    return points


def _cpu_spent(before: Mapping[str, Any], after: Mapping[str, Any]) -> float | None:
    """The router's CPU seconds between two samples (a restarted router counts from 0)."""
    start, end = number(before.get("cpu_seconds")), number(after.get("cpu_seconds"))
    if start is None or end is None:
        return None
    return end - start if end >= start else end


def run_decision_buckets(run: Run) -> list[tuple[float, float]]:
    """The whole run's decision histogram: the first sample's counts plus every
    interval's (a restart's reset counted as Prometheus' increase() would)."""
    total: dict[float, float] = {}
    previous: list[tuple[float, float]] = []
    for sample in run.samples:
        router = sample.get("router")
        if not isinstance(router, dict):
            continue
        current = bucket_counts(router.get("decision_buckets") or {})
        for le, count in bucket_deltas(previous, current):
            total[le] = total.get(le, 0.0) + count
        previous = current
    return sorted(total.items())


# -- headline figures -------------------------------------------------------------------


@dataclass(frozen=True)
class Headline:
    label: str
    valid: bool
    invalid_reason: str | None
    policy: str | None
    warm: bool | None
    nodes: int | None
    requests: int
    failed: int
    first_ttft: dict[str, float | None]  # p50/p95/p99, Mac seconds
    later_ttft: dict[str, float | None]
    hit_rate: float | None
    first_hit_rate: float | None
    hit_by_tier: dict[str, float] = field(default_factory=dict)
    decision_p99_s: float | None = None
    index_bytes_peak: int | None = None
    rss_bytes_peak: int | None = None
    router_cpu_percent: float | None = None  # over the whole run
    operator_ready_s: float | None = None
    learn_min_sessions: int | None = None  # the router's; 0: learning off; None: not said
    after_upgrade: tuple[AfterUpgrade, ...] = ()


AFTER_UPGRADE_S = 3600.0  # the profiled Macs' hour after an agent upgrade


@dataclass(frozen=True)
class AfterUpgrade:
    """An upgraded agent's sessions at its new version that started in the hour after
    the upgrade, by their first requests: whether a warm set (captured or learned) had
    their new head warm."""

    agent: str
    version: str
    at_s: float  # when the upgrade was applied, in the profiled Macs' seconds
    first_requests: int
    ttft: dict[str, float | None]  # p50/p95/p99, Mac seconds
    hit_rate: float | None


def after_upgrades(run: Run, window_s: float = AFTER_UPGRADE_S) -> tuple[AfterUpgrade, ...]:
    """One per `agent-upgrade` event of the run, in time order."""
    out = []
    for event in sorted(run.events, key=event_time):
        if event.get("event") != "agent-upgrade":
            continue
        at = event_time(event)
        rows = [
            r
            for r in run.rows
            if is_first(r)
            and r.get("agent") == event.get("agent")
            and r.get("version") == event.get("to")
            and at <= sent(r) < at + window_s
        ]
        out.append(
            AfterUpgrade(
                str(event.get("agent")),
                str(event.get("to")),
                at,
                len(rows),
                {f"p{q}": percentile(served_ttfts(rows), q) for q in QUANTILES},
                hit_rate(rows),
            )
        )
    return tuple(out)


def headline(run: Run) -> Headline:
    rows = run.rows
    first = [r for r in rows if is_first(r)]
    later = [r for r in rows if not is_first(r)]
    points = router_points(run)
    index = [p.index_bytes for p in points if p.index_bytes is not None]
    rss = [p.rss_bytes for p in points if p.rss_bytes is not None]
    warm = run.meta.get("warm")
    nodes = number(run.meta.get("nodes"))
    ready = number(run.summary.get("operator_ready_s"))
    reason = run.meta.get("invalid_reason")
    return Headline(
        run.label,
        run.meta.get("valid") is not False,  # runs that do not say were not judged
        None if reason is None else str(reason),
        run.meta.get("policy"),
        warm if isinstance(warm, bool) else None,
        None if nodes is None else int(nodes),
        len(rows),
        sum(map(failed, rows)),
        {f"p{q}": percentile(served_ttfts(first), q) for q in QUANTILES},
        {f"p{q}": percentile(served_ttfts(later), q) for q in QUANTILES},
        hit_rate(rows),
        hit_rate(first),
        tier_shares(rows),
        histogram_quantile(0.99, run_decision_buckets(run)),
        max(index) if index else None,
        max(rss) if rss else None,
        _run_cpu_percent(points),
        ready,
        learn if isinstance(learn := run.meta.get("learn_min_sessions"), int) else None,
        after_upgrades(run),
    )


def _run_cpu_percent(points: list[RouterPoint]) -> float | None:
    """The router's CPU over the sampled span: each interval's share weighted by its time."""
    timed = [(p.cpu_percent, p.wall_s) for p in points if p.cpu_percent is not None and p.wall_s]
    wall = sum(w for _, w in timed)
    return sum(c * w for c, w in timed) / wall if wall > 0 else None
