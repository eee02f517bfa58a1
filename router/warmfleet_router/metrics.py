"""The router's OpenTelemetry metrics (the daemon's conventions: one MeterProvider,
Prometheus pull on `/metrics`, OTLP push when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).

Per backend (labelled like the daemons' own series: `warmfleet.daemon` is the backend's
name, `gen_ai.request.model` the model its layout names) and decision reason: requests;
prompt, cached and predicted cached tokens (fleet hit rate = rate(cached) / rate(prompt),
token-weighted; index accuracy = the share of requests whose prediction was exact, by
what the prediction rested on, `warmfleet.prediction.source`: `events` (a daemon's
cache events: the accuracy that matters), `contended` (events, but another request in
flight on that daemon shares blocks it has not stored yet: which of the two reuses them
is the daemon's scheduling), `history` (guesses for backends without events),
`resyncing`); predicted and served cached tokens by cache tier (`warmfleet.cache.tier`,
one of `warmfleet_common.tiers.TIERS`, or `other` for any tier a daemon's registry adds
(`tier_label`: a backend's usage cannot add series); served tiers as a warmfleet
daemon's usage says them);
in-flight requests, health and index size as gauges; failovers and index resyncs as
counters; time to first byte as seen by the router. Per tenant (`warmfleet.tenant`, the
keys file's names, `-` for an open router's clients; past MAX_TENANT_LABELS, `other`):
requests by outcome (ok, throttled, other), tokens in, cached and out, refusals by the
limit they hit, requests in flight. Learned warm prompts (`learning`): how many per
tenant, and sessions' first requests with their static head (their prompt and cached
tokens) by client (`warmfleet.client`, the agent its User-Agent names: a handful of
values) and whether the head was learned (`warmfleet.learned`). Exported names: dots
become underscores, counters get `_total`.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterable
from pathlib import Path

from opentelemetry.metrics import CallbackOptions, Observation

from warmfleet_common import otel
from warmfleet_common.tiers import OTHER_TIER, TIERS, TierTokens, tier_label
from warmfleet_router.backend import Backend
from warmfleet_router.quotas import LIMITS, OPEN
from warmfleet_router.routes import Usage

TTFB_BUCKETS = otel.LATENCY_BUCKETS
# A decision is parsing and keying the body, then scoring every backend: milliseconds.
DECISION_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25)
HEALTH = ("ready", "unready", "draining", "down", "unknown")
MAX_TENANT_LABELS = 256  # tenants named on the metrics; the rest are `other`


class RouterMetrics(otel.Metrics):
    def __init__(self, name: str = "warmfleet-router") -> None:
        super().__init__(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", name), "service.instance.id": name}
        )
        meter = self.provider.get_meter("warmfleet.router")
        # Counters are summed here and read by OpenTelemetry at export time: a synchronous
        # instrument costs 18-42 us a call in the SDK, and a request touched eight of them.
        self._totals: dict[str, _Totals] = {}

        def counter(name: str, unit: str, description: str) -> _Totals:
            totals = self._totals[name] = _Totals()
            meter.create_observable_counter(
                name, [totals.observe], unit=unit, description=description
            )
            return totals

        self._requests = counter(
            "warmfleet.router.requests", "{request}",
            "Requests by backend, decision reason and outcome",
        )  # fmt: skip
        self._prompt = counter(
            "warmfleet.router.prompt_tokens", "{token}", "Prompt tokens (the backends' usage)"
        )
        self._cached = counter(
            "warmfleet.router.cached_tokens", "{token}",
            "Prompt tokens served from the backends' prefix caches (their usage)",
        )  # fmt: skip
        self._predicted = counter(
            "warmfleet.router.predicted_cached_tokens", "{token}",
            "Cached tokens the router's index predicted, for requests with usage",
        )  # fmt: skip
        self._predicted_tiers = counter(
            "warmfleet.router.predicted_tier_hit_tokens", "{token}",
            "Cached tokens the router's index predicted, for requests with usage, by the "
            f"tier it expected each block in (warmfleet.cache.tier: {', '.join(TIERS)}, "
            f"{OTHER_TIER})",
        )  # fmt: skip
        self._served_tiers = counter(
            "warmfleet.router.tier_hit_tokens", "{token}",
            "Prompt tokens served from the backends' caches by the tier they came from, as "
            "their usage says (warmfleet daemons' cached_tokens_by_tier; tiers beyond "
            f"{', '.join(TIERS)} as {OTHER_TIER})",
        )  # fmt: skip
        self._predictions = counter(
            "warmfleet.router.predictions", "{request}",
            "Requests with usage by how the prediction compared: exact, over, under",
        )  # fmt: skip
        self._failovers = counter(
            "warmfleet.router.failovers", "{request}",
            "Requests retried elsewhere, by the backend that failed",
        )  # fmt: skip
        self._spills = counter(
            "warmfleet.router.spills", "{request}",
            "Requests sent away from the backend holding most of their blocks with that "
            "backend named as the peer to copy them from, by backend and warmfleet.peer",
        )  # fmt: skip
        self._handoffs = counter(
            "warmfleet.router.handoffs", "{session}",
            "Sessions of a draining backend the router asked their next backend to copy, by "
            "the draining backend and outcome (copied, failed, skipped)",
        )  # fmt: skip
        self._resyncs = counter(
            "warmfleet.router.index.resyncs", "{resync}", "Index resyncs from a daemon snapshot"
        )
        self._events = counter("warmfleet.router.index.events", "{event}", "Cache events applied")
        self._read_errors = counter(
            "warmfleet.router.backend.read_errors", "{error}",
            "Reads from a backend that failed (unreachable, too slow, too large, a payload of "
            "the wrong shape), by what was read and error.type",
        )  # fmt: skip
        self._cpu = counter(
            "warmfleet.router.request.cpu_time", "s",
            "CPU time the router spent on requests, by stage: prepare (parse, check and key "
            "the body, in a key worker) and route (the decision, on the event loop); per "
            "request: its rate over the rate of requests",
        )  # fmt: skip
        meter.create_observable_counter(
            "process.cpu.time",
            [_process_cpu],
            unit="s",
            description="CPU time of the router process and its key workers (per request: "
            "its rate over the rate of requests)",
        )
        self._ttfb = meter.create_histogram(
            "warmfleet.router.time_to_first_byte",
            unit="s",
            description="From the request's arrival to the backend's first response byte",
            explicit_bucket_boundaries_advisory=TTFB_BUCKETS,
        )
        self._decision = meter.create_histogram(
            "warmfleet.router.decision.duration",
            unit="s",
            description="From a request's arrival to the backend chosen for it: its body "
            "parsed and keyed (in a key worker), every backend scored",
            explicit_bucket_boundaries_advisory=DECISION_BUCKETS,
        )
        self._tenant_requests = counter(
            "warmfleet.router.tenant.requests", "{request}",
            "Requests per tenant (warmfleet.tenant) by outcome: ok, throttled (a 429), other",
        )  # fmt: skip
        self._tenant_tokens = counter(
            "warmfleet.router.tenant.tokens", "{token}",
            "Tokens per tenant by gen_ai.token.type: input (prompt), cached (of the input, "
            "served from a prefix cache), output (generated), as the backends' usage says",
        )  # fmt: skip
        self._throttled = counter(
            "warmfleet.router.tenant.throttled", "{request}",
            "Requests refused with a 429 per tenant, by the limit hit (warmfleet.quota.limit)",
        )  # fmt: skip
        self._first = counter(
            "warmfleet.router.first_requests", "{request}",
            "Sessions' first requests with their static head, by tenant, the agent its "
            "User-Agent names (warmfleet.client) and whether the head is a learned warm "
            "prompt (warmfleet.learned): what a stale warm set shows first",
        )  # fmt: skip
        self._first_tokens = counter(
            "warmfleet.router.first_request_tokens", "{token}",
            "Prompt tokens of sessions' first requests (gen_ai.token.type: input) and those "
            "of them served from a prefix cache (cached), by tenant, warmfleet.client and "
            "warmfleet.learned: the first-request hit rate",
        )  # fmt: skip
        self._learned: Callable[[], dict[str | None, int]] = dict
        meter.create_observable_gauge(
            "warmfleet.router.learned.prompts",
            [self._observe_learned],
            unit="{prompt}",
            description="Warm prompts the router learned from heads many sessions share, per "
            "tenant",
        )
        self._tenant_labels: set[str] = set()
        self._tenants_in_flight: Callable[[], dict[str, int]] = dict
        meter.create_observable_gauge(
            "warmfleet.router.tenant.in_flight",
            [self._observe_tenants],
            unit="{request}",
            description="Requests in flight per tenant",
        )
        self._backends: Callable[[], Iterable[Backend]] = list
        self._index_size: Callable[[str], int] = lambda _: 0
        self._index_bytes: Callable[[], int] = lambda: 0
        meter.create_observable_gauge(
            "warmfleet.router.in_flight",
            [self._observe_in_flight],
            unit="{request}",
            description="Requests in flight per backend",
        )
        meter.create_observable_gauge(
            "warmfleet.router.backend.ready",
            [self._observe_ready],
            description="1 when the backend takes new requests",
        )
        meter.create_observable_gauge(
            "warmfleet.router.index.blocks",
            [self._observe_blocks],
            unit="{block}",
            description="Cache blocks the index knows per backend",
        )
        meter.create_observable_gauge(
            "warmfleet.router.index.memory",
            [lambda _: [Observation(self._index_bytes())]],
            unit="By",
            description="The index's bytes as its budget counts them (entries x ENTRY_BYTES)",
        )
        meter.create_observable_gauge(
            "process.memory.usage",
            [_process_memory],
            unit="By",
            description="Resident memory of the router process (Linux; none reported elsewhere)",
        )

    def observe(
        self,
        backends: Callable[[], Iterable[Backend]],
        index_size: Callable[[str], int],
        index_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        """Where the gauges read the fleet from."""
        self._backends, self._index_size, self._index_bytes = backends, index_size, index_bytes

    def observe_tenants(self, in_flight: Callable[[], dict[str, int]]) -> None:
        self._tenants_in_flight = in_flight

    def _tenant(self, tenant: str) -> dict[str, str]:
        """The tenant's label, bounded: the first MAX_TENANT_LABELS are named."""
        if tenant not in self._tenant_labels:
            if len(self._tenant_labels) >= MAX_TENANT_LABELS:
                return {"warmfleet.tenant": "other"}
            self._tenant_labels.add(tenant)
            for limit in LIMITS:  # a rate of 0, not no data
                self._throttled.add(0, {"warmfleet.tenant": tenant, "warmfleet.quota.limit": limit})
        return {"warmfleet.tenant": tenant}

    def observe_learned(self, counts: Callable[[], dict[str | None, int]]) -> None:
        self._learned = counts

    def _observe_learned(self, _: CallbackOptions) -> Iterable[Observation]:
        summed: dict[str, int] = {OPEN: 0}  # 0, not no data, before anything is learned
        for tenant, count in self._learned().items():
            label = self._tenant(tenant or OPEN)["warmfleet.tenant"]
            summed[label] = summed.get(label, 0) + count
        return [Observation(n, {"warmfleet.tenant": t}) for t, n in summed.items()]

    def first_request(self, tenant: str, client: str, learned: bool, usage: Usage) -> None:
        """A session's first request with its static head ended with `usage`."""
        label = {
            **self._tenant(tenant),
            "warmfleet.client": client,
            "warmfleet.learned": str(learned).lower(),
        }
        self._first.add(1, label)
        self._first_tokens.add(usage.prompt_tokens, {**label, "gen_ai.token.type": "input"})
        self._first_tokens.add(usage.cached_tokens, {**label, "gen_ai.token.type": "cached"})

    def _observe_tenants(self, _: CallbackOptions) -> Iterable[Observation]:
        summed: dict[str, int] = {}
        for tenant, count in self._tenants_in_flight().items():
            label = self._tenant(tenant)["warmfleet.tenant"]
            summed[label] = summed.get(label, 0) + count
        return [Observation(n, {"warmfleet.tenant": t}) for t, n in summed.items()]

    def throttled(self, tenant: str, limit: str) -> None:
        label = self._tenant(tenant)
        self._throttled.add(1, {**label, "warmfleet.quota.limit": limit})
        self._tenant_requests.add(1, {**label, "warmfleet.outcome": "throttled"})

    def tenant_request(self, tenant: str, outcome: str, usage: Usage | None) -> None:
        label = self._tenant(tenant)
        self._tenant_requests.add(1, {**label, "warmfleet.outcome": outcome})
        if usage is None:
            return
        self._tenant_tokens.add(usage.prompt_tokens, {**label, "gen_ai.token.type": "input"})
        self._tenant_tokens.add(usage.cached_tokens, {**label, "gen_ai.token.type": "cached"})
        if usage.completion_tokens is not None:
            self._tenant_tokens.add(
                usage.completion_tokens, {**label, "gen_ai.token.type": "output"}
            )

    def _observe_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(b.in_flight, labels(b)) for b in self._backends()]

    def _observe_ready(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(int(b.usable), labels(b)) for b in self._backends()]

    def _observe_blocks(self, _: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(
                self._index_size(b.name),
                {**labels(b), "warmfleet.index.mode": b.index_mode},
            )
            for b in self._backends()
        ]

    def backend_added(self, backend: Backend) -> None:
        """Counters that may stay at zero exist from the start (a rate of 0, not no data)."""
        self._failovers.add(0, labels(backend))
        self._resyncs.add(0, labels(backend))

    def request_finished(
        self,
        backend: Backend,
        reason: str,
        outcome: str,
        predicted: int | None,
        source: str,
        prompt_tokens: int | None,
        cached: int | None,
        first_byte: float | None,
        predicted_tiers: TierTokens | None = None,
        served_tiers: TierTokens | None = None,
    ) -> None:
        base = labels(backend)
        self._requests.add(
            1, {**base, "warmfleet.route.reason": reason, "warmfleet.outcome": outcome}
        )
        if first_byte is not None:
            self._ttfb.record(first_byte, base)
        if prompt_tokens is not None and cached is not None:
            self._prompt.add(prompt_tokens, {**base, "warmfleet.route.reason": reason})
            self._cached.add(cached, {**base, "warmfleet.route.reason": reason})
            if predicted is not None:
                judged = {**base, "warmfleet.prediction.source": source}
                self._predicted.add(predicted, judged)
                result = "exact" if predicted == cached else "over"
                if predicted < cached:
                    result = "under"
                self._predictions.add(1, {**judged, "warmfleet.prediction": result})
                for tier, tokens in (predicted_tiers or {}).items():
                    tier_labels = {**judged, "warmfleet.cache.tier": tier_label(tier)}
                    self._predicted_tiers.add(tokens, tier_labels)
            for tier, tokens in (served_tiers or {}).items():
                self._served_tiers.add(tokens, {**base, "warmfleet.cache.tier": tier_label(tier)})

    def decision(self, route: str, seconds: float) -> None:
        self._decision.record(seconds, {"warmfleet.route": route})

    def request_cpu(self, route: str, stage: str, seconds: float) -> None:
        self._cpu.add(seconds, {"warmfleet.route": route, "warmfleet.stage": stage})

    def read_error(self, backend: Backend, what: str, kind: str) -> None:
        self._read_errors.add(1, {**labels(backend), "warmfleet.read": what, "error.type": kind})

    def failover(self, backend: Backend) -> None:
        self._failovers.add(1, labels(backend))

    def spill(self, backend: Backend, peer: Backend) -> None:
        self._spills.add(1, {**labels(backend), "warmfleet.peer": peer.name})

    def handoff(self, draining: Backend, outcome: str) -> None:
        self._handoffs.add(1, {**labels(draining), "warmfleet.handoff.outcome": outcome})

    def index_event(self, backend: Backend, kind: str) -> None:
        if kind == "resync":  # its model (a label) may be known only now
            self._resyncs.add(1, labels(backend))
            self._failovers.add(0, labels(backend))
        else:
            self._events.add(1, labels(backend))


class _Totals:
    """A counter's running sums, by attributes."""

    def __init__(self) -> None:
        self._sums: dict[tuple[tuple[str, str], ...], float] = {}

    def add(self, value: float, attributes: dict[str, str]) -> None:
        key = tuple(attributes.items())
        self._sums[key] = self._sums.get(key, 0) + value

    def observe(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(total, dict(key)) for key, total in list(self._sums.items())]


def _process_cpu(_: CallbackOptions) -> Iterable[Observation]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime + _live_children_cpu()
    return [Observation(total)]


def _process_memory(_: CallbackOptions) -> Iterable[Observation]:
    """The router's resident set size, from /proc/self/statm (none where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return []
    return [Observation(pages * os.sysconf("SC_PAGE_SIZE"))]


def _live_children_cpu() -> float:
    """CPU of the key workers still running (RUSAGE_CHILDREN counts only those that
    ended); Linux's /proc, nothing elsewhere."""
    total = 0.0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in threads:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                continue  # it just ended
    return total


def labels(backend: Backend) -> dict[str, str]:
    """The daemon's own label names, so one dashboard variable filters both."""
    return {"warmfleet.daemon": backend.name, "gen_ai.request.model": backend.model or "unknown"}
