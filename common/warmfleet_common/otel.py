"""The OpenTelemetry set-up the daemon and the router share: one MeterProvider read by
Prometheus (its own registry, served on `/metrics`) and, when an OTLP endpoint is
configured, pushed by OTLP (gRPC or HTTP/protobuf, chosen by the standard
`OTEL_EXPORTER_OTLP_*` variables). Plain OpenTelemetry: no mlx, so the router imports it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# The GenAI conventions' ExplicitBucketBoundaries for time to first token (the router's
# time to first byte uses them too, so the two histograms line up on one panel).
LATENCY_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1),
    *(0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
)


class Metrics:
    """A MeterProvider with a Prometheus reader on its own registry (and OTLP if set)."""

    def __init__(self, resource: Mapping[str, str], *, otlp_endpoint: str | None = None) -> None:
        self.registry = CollectorRegistry()
        readers: list[MetricReader] = [PrometheusMetricReader(registry=self.registry)]
        if otlp_configured(otlp_endpoint):
            readers.append(PeriodicExportingMetricReader(otlp_exporter(otlp_endpoint)))
        self.provider = MeterProvider(
            metric_readers=readers, resource=Resource.create(dict(resource))
        )

    def prometheus_text(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def shutdown(self) -> None:
        self.provider.shutdown()


def otlp_configured(explicit: str | None) -> bool:
    return bool(
        explicit
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def otlp_exporter(endpoint: str | None) -> MetricExporter:
    """OTLP over gRPC or HTTP/protobuf, as the standard variables say; `endpoint` (a
    base URL, like OTEL_EXPORTER_OTLP_ENDPOINT) overrides theirs."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        log.info("OTLP metrics: gRPC to %s", endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")
        return OTLPMetricExporter(endpoint=endpoint) if endpoint else OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPExporter,
    )

    if endpoint:
        endpoint = endpoint.rstrip("/") + "/v1/metrics"
    log.info("OTLP metrics: HTTP/protobuf to %s", endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")
    return HTTPExporter(endpoint=endpoint) if endpoint else HTTPExporter()
