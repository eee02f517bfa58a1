"""OpenTelemetry metrics: one MeterProvider, read by Prometheus on `/metrics` and, when
an OTLP endpoint is configured, pushed by OTLP (gRPC or HTTP/protobuf, chosen by the
standard `OTEL_EXPORTER_OTLP_*` variables).

Names follow the GenAI semantic conventions where they exist
(`gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`,
`gen_ai.server.request.duration` with the conventions' bucket boundaries; token usage
as server-side counterparts of `gen_ai.client.inference.usage.*`, whose
`cache_read.input_tokens` is the summed `gen_ai.usage.cache_read.input_tokens`).
Prefix-cache hit rate is token-weighted: rate(hit_tokens) / rate(queried_tokens),
both counters, never a gauge. On the way to Prometheus, dots become underscores, `s`
and `By` units become `_seconds` and `_bytes`, and counters get `_total`:
`dashboards/` uses those exported names.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Observation

from warmfleet_common import __version__, otel
from warmfleet_common.tiers import TIERS
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import Event, GenerationRequest
from warmfleet_daemon.kvtransfer.disk_tier import DiskTier
from warmfleet_daemon.kvtransfer.spill import PeerSpill
from warmfleet_daemon.sim.clock import SimClock
from warmfleet_daemon.warming.manager import WarmManager

log = logging.getLogger(__name__)

# The GenAI conventions' ExplicitBucketBoundaries.
TTFT_BUCKETS = otel.LATENCY_BUCKETS
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (
    *(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64),
    *(1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
)
WARMUP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0)

PROVIDER = "warmfleet"

_Callback = Callable[[CallbackOptions], Iterable[Observation]]


@dataclass(frozen=True)
class TelemetryConfig:
    daemon: str  # this daemon's name (a label on every metric)
    model: str  # the served model id
    otlp_endpoint: str | None = None  # overrides OTEL_EXPORTER_OTLP_ENDPOINT


def default_daemon_name() -> str:
    return os.environ.get("WARMFLEET_DAEMON_NAME") or socket.gethostname()


class Telemetry(otel.Metrics):
    """Owns the MeterProvider; `observe()` is registered with the engine."""

    def __init__(self, config: TelemetryConfig) -> None:
        super().__init__(
            {
                "service.name": os.environ.get("OTEL_SERVICE_NAME", "warmfleet-daemon"),
                "service.version": __version__,
                "service.instance.id": config.daemon,
                "warmfleet.daemon": config.daemon,
                "gen_ai.request.model": config.model,
            },
            otlp_endpoint=config.otlp_endpoint,
        )
        self.config = config
        self._base = {"warmfleet.daemon": config.daemon, "gen_ai.request.model": config.model}
        meter = self.provider.get_meter("warmfleet", __version__)
        self._ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Time to generate the first token for successful responses",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
        )
        self._tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token after the first, for successful responses",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS,
        )
        self._duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Server request duration, to the last output token",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._input = meter.create_counter(
            "gen_ai.server.inference.usage.input_tokens",
            unit="{token}",
            description="Input (prompt) tokens, including cached ones",
        )
        self._output = meter.create_counter(
            "gen_ai.server.inference.usage.output_tokens",
            unit="{token}",
            description="Output (completion) tokens",
        )
        self._cache_read = meter.create_counter(
            "gen_ai.server.inference.usage.cache_read.input_tokens",
            unit="{token}",
            description="Input tokens served from the prefix cache "
            "(sum of gen_ai.usage.cache_read.input_tokens)",
        )
        self._tier_hits = meter.create_counter(
            "warmfleet.prefix_cache.tier.hit_tokens",
            unit="{token}",
            description="Prompt tokens served from the prefix cache, by the tier they came "
            f"from (warmfleet.cache.tier: {', '.join(TIERS)} or a tier the daemon's tier "
            "registry adds, by its name: as many values as the registry has tiers)",
        )
        self._warmup = meter.create_histogram(
            "warmfleet.warmup.duration",
            unit="s",
            description="Time to warm one prompt",
            explicit_bucket_boundaries_advisory=WARMUP_BUCKETS,
        )
        self._meter = meter

    def observe_engine(self, engine: Engine) -> None:
        """Gauges and counters read from the engine and its prefix cache at collection."""
        meter, base = self._meter, self._base

        def cache(field: str) -> _Callback:
            return lambda _: [Observation(getattr(engine.cache.stats, field), base)]

        def queue(field: str) -> _Callback:
            return lambda _: [Observation(getattr(engine.stats(), field), base)]

        meter.create_observable_counter(
            "warmfleet.prefix_cache.queried_tokens",
            [cache("queried_tokens")],
            unit="{token}",
            description="Prompt tokens looked up in the prefix cache",
        )
        meter.create_observable_counter(
            "warmfleet.prefix_cache.hit_tokens",
            [cache("hit_tokens")],
            unit="{token}",
            description="Prompt tokens found in the prefix cache (= prefill tokens saved)",
        )
        meter.create_observable_counter(
            "warmfleet.prefix_cache.evictions",
            [cache("evictions")],
            unit="{block}",
            description="Blocks evicted to stay within the byte budget",
        )
        meter.create_observable_gauge(
            "warmfleet.prefix_cache.size", [cache("bytes")], unit="By", description="Bytes held"
        )
        meter.create_observable_gauge(
            "warmfleet.prefix_cache.budget",
            [cache("budget_bytes")],
            unit="By",
            description="Byte budget",
        )
        meter.create_observable_gauge(
            "warmfleet.prefix_cache.pinned.size",
            [cache("pinned_bytes")],
            unit="By",
            description="Bytes held by pinned (warm) blocks",
        )
        meter.create_observable_gauge(
            "warmfleet.prefix_cache.entries",
            [cache("entry_count")],
            unit="{block}",
            description="Blocks stored",
        )
        meter.create_observable_gauge(
            "warmfleet.prefix_cache.pinned.entries",
            [cache("pinned_count")],
            unit="{block}",
            description="Blocks pinned by warm sets",
        )
        for field, what in (
            ("running", "decoding"),
            ("prefilling", "prefilling"),
            ("waiting", "waiting for a slot"),
        ):
            meter.create_observable_gauge(
                f"warmfleet.requests.{field}",
                [queue(field)],
                unit="{request}",
                description=f"Requests {what}",
            )
        engine.observers.append(self.observe)

    def observe_disk_tier(self, disk: DiskTier | None) -> None:
        """The disk tier's gauges and counters, read from its stats at collection. Without
        a disk tier every series is there at 0 (`enabled` 0: off), so a dashboard panel
        says "off" rather than "No data"."""
        meter, base = self._meter, self._base

        def read(field: str) -> _Callback:
            if disk is None:
                return lambda _: [Observation(0, base)]
            return lambda _: [Observation(getattr(disk.stats(), field), base)]

        def enabled(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(1 if disk is not None and disk.stats().state == "on" else 0, base)

        meter.create_observable_gauge(
            "warmfleet.disk_tier.enabled",
            [enabled],
            unit="{tier}",
            description="1 while the disk tier works; 0 once a full or failing disk turned it "
            "off (the reason is in /v1/status and the log)",
        )
        gauges = (
            ("size", "bytes", "By", "Bytes of blocks on disk"),
            ("budget", "budget_bytes", "By", "Disk budget (--cache-disk-mb)"),
            ("entries", "blocks", "{block}", "Blocks on disk"),
            ("queue.size", "queued_bytes", "By", "Bytes waiting in the write-behind queue"),
            ("queue.entries", "queued_blocks", "{block}", "Blocks in the write-behind queue"),
        )
        for name, field, unit, description in gauges:
            meter.create_observable_gauge(
                f"warmfleet.disk_tier.{name}", [read(field)], unit=unit, description=description
            )
        counters = (
            ("written", "written_bytes", "By", "Bytes written"),
            ("read", "read_bytes", "By", "Bytes read back (instead of prefilled)"),
            ("write.time", "write_seconds", "s", "Time spent writing (throughput: written/this)"),
            ("read.time", "read_seconds", "s", "Time spent reading and verifying"),
            ("evictions", "evictions", "{block}", "Blocks deleted to stay within the budget"),
            ("dropped", "dropped_blocks", "{block}", "Blocks evicted from RAM, never written"),
            ("ignored", "ignored_files", "{file}", "Corrupt, truncated or mismatched files"),
        )
        for name, field, unit, description in counters:
            meter.create_observable_counter(
                f"warmfleet.disk_tier.{name}", [read(field)], unit=unit, description=description
            )

    def observe_spill(self, spill: PeerSpill | None) -> None:
        """Spill copies from peers, read from their stats at collection (at 0 on a daemon
        that copies none: the simulated engine's)."""
        meter, base = self._meter, self._base

        def read(field: str) -> _Callback:
            if spill is None:
                return lambda _: [Observation(0, base)]
            return lambda _: [Observation(getattr(spill.stats(), field), base)]

        counters = (
            ("copies", "copies", "{copy}", "Spill copies started from a peer daemon"),
            ("declined", "declined", "{copy}", "Spills prefilled: estimated slower, or busy"),
            ("short", "short", "{copy}", "Copies that ended where the peer's blocks end"),
            ("failed", "failed", "{copy}", "Copies the peer ended early (the rest prefilled)"),
            ("blocks", "blocks", "{block}", "Blocks copied from peers and verified"),
            ("copied", "bytes", "By", "Bytes copied from peers"),
            ("time", "seconds", "s", "Time spent copying from peers (throughput: copied/this)"),
        )
        for name, field, unit, description in counters:
            meter.create_observable_counter(
                f"warmfleet.peer_spill.{name}", [read(field)], unit=unit, description=description
            )

    def observe_sim_clock(self, clock: SimClock | None) -> None:
        """A simulated engine's time, in the profiled Mac's seconds, read from its clock at
        collection (at 0 on a daemon with a real engine): what its steps charged, and how
        late they ran beyond that (the machine running the simulation saturated: every
        time the daemon reports is inflated by rate(behind) / rate(spent))."""
        meter, base = self._meter, self._base

        def read(field: str) -> _Callback:
            if clock is None:
                return lambda _: [Observation(0, base)]
            return lambda _: [Observation(getattr(clock.stats(), field), base)]

        counters = (
            ("spent", "spent_s", "Simulated seconds charged (what the profiled Mac would take)"),
            (
                "behind",
                "behind_s",
                "Simulated seconds the engine's steps ran late beyond what they charged",
            ),
        )
        for name, field, description in counters:
            meter.create_observable_counter(
                f"warmfleet.sim.clock.{name}", [read(field)], unit="s", description=description
            )

    def observe_warm_sets(self, manager: WarmManager) -> None:
        base = self._base

        def prompts(_: CallbackOptions) -> Iterable[Observation]:
            sets = manager.list()
            if not sets:  # each state at 0: the panel says "none", not "No data"
                for state in ("pending", "warming", "warm", "failed"):
                    yield Observation(0, {**base, "warmfleet.warm_prompt.state": state})
            for s in sets:
                for state in ("pending", "warming", "warm", "failed"):
                    yield Observation(
                        sum(p.state.value == state for p in s.prompts),
                        {
                            **base,
                            "warmfleet.warm_set.namespace": s.namespace,
                            "warmfleet.warm_set.name": s.name,
                            "warmfleet.warm_prompt.state": state,
                        },
                    )

        self._meter.create_observable_gauge(
            "warmfleet.warm_prompts",
            [prompts],
            unit="{prompt}",
            description="Warm prompts by warm set and state",
        )
        manager.observers.append(self.observe_warmup)

    def observe(self, request: GenerationRequest, event: Event) -> None:
        """Record a finished request (engine thread)."""
        if request.prefill_only or event.usage is None or event.timings is None:
            return
        usage, timings = event.usage, event.timings
        attrs = {
            **self._base,
            "gen_ai.operation.name": request.operation,
            "gen_ai.provider.name": PROVIDER,
            "warmfleet.cache.outcome": cache_outcome(request, usage.cached_tokens),
        }
        ok = event.finish_reason in ("stop", "length")
        if not ok:
            attrs["error.type"] = event.finish_reason or "unknown"
        self._duration.record(timings.duration_s, attrs)
        if ok and usage.completion_tokens:
            self._ttft.record(timings.ttft_s, attrs)
            if usage.completion_tokens > 1:
                per_token = (timings.duration_s - timings.ttft_s) / (usage.completion_tokens - 1)
                self._tpot.record(per_token, attrs)
        tokens = {k: v for k, v in attrs.items() if k != "warmfleet.cache.outcome"}
        tokens["gen_ai.token.modality"] = "text"
        self._input.add(usage.prompt_tokens, tokens)
        self._output.add(usage.completion_tokens, tokens)
        self._cache_read.add(usage.cached_tokens, tokens)
        for tier, hit in usage.cached.items():
            self._tier_hits.add(hit, {**self._base, "warmfleet.cache.tier": tier})

    def observe_warmup(self, namespace: str, name: str, state: str, seconds: float) -> None:
        self._warmup.record(
            seconds,
            {
                **self._base,
                "warmfleet.warm_set.namespace": namespace,
                "warmfleet.warm_set.name": name,
                "warmfleet.warm_prompt.state": state,
            },
        )


def cache_outcome(request: GenerationRequest, cached_tokens: int) -> str:
    """hit: everything before the last message came from the cache (or, without chat
    cuts, the whole prompt); partial: some of it; miss: none."""
    if cached_tokens == 0:
        return "miss"
    static = request.prompt.content_start or len(request.prompt.tokens)
    return "hit" if cached_tokens >= static else "partial"
