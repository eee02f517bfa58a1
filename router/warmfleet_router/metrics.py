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
`resyncing`);
in-flight requests, health and index size as gauges; failovers and index resyncs as
counters; time to first byte as seen by the router. Exported names: dots become
underscores, counters get `_total`.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from warmfleet_common import otel
from warmfleet_router.backend import Backend

TTFB_BUCKETS = otel.LATENCY_BUCKETS
CPU_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
HEALTH = ("ready", "unready", "draining", "down", "unknown")


class RouterMetrics(otel.Metrics):
    def __init__(self, name: str = "warmfleet-router") -> None:
        super().__init__(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", name), "service.instance.id": name}
        )
        meter = self.provider.get_meter("warmfleet.router")
        self._requests = meter.create_counter(
            "warmfleet.router.requests",
            unit="{request}",
            description="Requests by backend, decision reason and outcome",
        )
        self._prompt = meter.create_counter(
            "warmfleet.router.prompt_tokens",
            unit="{token}",
            description="Prompt tokens (the backends' usage)",
        )
        self._cached = meter.create_counter(
            "warmfleet.router.cached_tokens",
            unit="{token}",
            description="Prompt tokens served from the backends' prefix caches (their usage)",
        )
        self._predicted = meter.create_counter(
            "warmfleet.router.predicted_cached_tokens",
            unit="{token}",
            description="Cached tokens the router's index predicted, for requests with usage",
        )
        self._predictions = meter.create_counter(
            "warmfleet.router.predictions",
            unit="{request}",
            description="Requests with usage by how the prediction compared: exact, over, under",
        )
        self._failovers = meter.create_counter(
            "warmfleet.router.failovers",
            unit="{request}",
            description="Requests retried elsewhere, by the backend that failed",
        )
        self._resyncs = meter.create_counter(
            "warmfleet.router.index.resyncs",
            unit="{resync}",
            description="Index resyncs from a daemon snapshot",
        )
        self._events = meter.create_counter(
            "warmfleet.router.index.events", unit="{event}", description="Cache events applied"
        )
        self._read_errors = meter.create_counter(
            "warmfleet.router.backend.read_errors",
            unit="{error}",
            description="Reads from a backend that failed (unreachable, too slow, too large, a "
            "payload of the wrong shape), by what was read and error.type",
        )
        self._cpu = meter.create_histogram(
            "warmfleet.router.request.cpu_time",
            unit="s",
            description="CPU time the router spent on a request, by stage: prepare (parse, "
            "check and key its body, in a worker) and route (the decision, on the event loop)",
            explicit_bucket_boundaries_advisory=CPU_BUCKETS,
        )
        meter.create_observable_counter(
            "process.cpu.time",
            [_process_cpu],
            unit="s",
            description="CPU time of the router process and its workers (CPU per request: "
            "rate of this over the rate of requests)",
        )
        self._ttfb = meter.create_histogram(
            "warmfleet.router.time_to_first_byte",
            unit="s",
            description="From the request's arrival to the backend's first response byte",
            explicit_bucket_boundaries_advisory=TTFB_BUCKETS,
        )
        self._backends: Callable[[], Iterable[Backend]] = list
        self._index_size: Callable[[str], int] = lambda _: 0
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

    def observe(
        self, backends: Callable[[], Iterable[Backend]], index_size: Callable[[str], int]
    ) -> None:
        """Where the gauges read the fleet from."""
        self._backends, self._index_size = backends, index_size

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

    def request_cpu(self, route: str, stage: str, seconds: float) -> None:
        self._cpu.record(seconds, {"warmfleet.route": route, "warmfleet.stage": stage})

    def read_error(self, backend: Backend, what: str, kind: str) -> None:
        self._read_errors.add(1, {**labels(backend), "warmfleet.read": what, "error.type": kind})

    def failover(self, backend: Backend) -> None:
        self._failovers.add(1, labels(backend))

    def index_event(self, backend: Backend, kind: str) -> None:
        if kind == "resync":  # its model (a label) may be known only now
            self._resyncs.add(1, labels(backend))
            self._failovers.add(0, labels(backend))
        else:
            self._events.add(1, labels(backend))


def _process_cpu(_: CallbackOptions) -> Iterable[Observation]:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    workers = _worker_cpu()
    total = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + workers
    return [Observation(total)]


def _worker_cpu() -> float:
    """CPU of live worker processes (RUSAGE_CHILDREN counts only those that ended)."""
    total = 0.0
    for child in multiprocessing.active_children():
        try:
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            continue  # not Linux, or it just ended
    return total


def labels(backend: Backend) -> dict[str, str]:
    """The daemon's own label names, so one dashboard variable filters both."""
    return {"warmfleet.daemon": backend.name, "gen_ai.request.model": backend.model or "unknown"}
