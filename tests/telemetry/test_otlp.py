"""OTLP push: the daemon sends its metrics to a local OTLP/HTTP receiver (started by
the test, decoding the protobuf) and they are the same metrics /metrics shows."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from support.processes import HandlerServer, QuietHandler


class Receiver:
    def __init__(self) -> None:
        self.metrics: dict[str, int] = {}  # name -> data points seen
        self.resources: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def handle(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for rm in request.resource_metrics:
                self.resources.append({a.key: a.value.string_value for a in rm.resource.attributes})
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        points = len(getattr(m, kind).data_points) if kind else 0
                        self.metrics[m.name] = self.metrics.get(m.name, 0) + points


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    got = Receiver()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/metrics", self.path
            got.handle(body)
            reply = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    with HandlerServer(Handler) as server:
        yield got, server.url


def test_metrics_are_pushed_over_otlp_http(daemon_factory, receiver) -> None:
    got, endpoint = receiver
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }
    daemon = daemon_factory("--model", "tiny-random", "--daemon-name", "mac-otlp", env=env)
    body = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    }
    for _ in range(2):
        assert (
            httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=60).status_code
            == 200
        )
    prometheus_names = {
        line.split("{")[0].split(" ")[0]
        for line in httpx.get(f"{daemon.url}/metrics").text.splitlines()
        if line and not line.startswith("#")
    }
    wanted = {
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
        "gen_ai.server.inference.usage.input_tokens",
        "gen_ai.server.inference.usage.cache_read.input_tokens",
        "warmfleet.prefix_cache.queried_tokens",
        "warmfleet.prefix_cache.hit_tokens",
        "warmfleet.prefix_cache.size",
        "warmfleet.requests.running",
    }
    deadline = time.monotonic() + 30
    while not wanted <= set(got.metrics):
        assert time.monotonic() < deadline, f"missing over OTLP: {wanted - set(got.metrics)}"
        time.sleep(0.2)
    with got.lock:
        assert any(r.get("warmfleet.daemon") == "mac-otlp" for r in got.resources)
        assert all(got.metrics[name] > 0 for name in wanted)
        # the same instruments Prometheus exports, before its renaming
        for name in got.metrics:
            exported = name.replace(".", "_")
            assert any(p.startswith(exported) for p in prometheus_names), name
