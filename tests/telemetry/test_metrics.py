"""`/metrics` after real requests (in process, tiny model): every name the dashboards
and alerts read is there, with the values the requests imply."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from support.engine import model
from support.promql import dashboard_queries, metric_names, rule_exprs
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

SYSTEM = {"role": "system", "content": "You are Relay, the messaging team's assistant. " * 10}


@pytest.fixture
def client(tmp_path) -> Iterator[TestClient]:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(model="tiny-random", daemon_name="mac-test", cache_dir=str(tmp_path))
    with TestClient(create_app(settings, engine=engine)) as c:
        yield c


def samples(client: TestClient) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(values: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= set(ls))


def test_metrics_match_the_requests(client) -> None:
    client.put(
        "/v1/warm-sets/team/relay",
        json={"prompts": [{"name": "relay", "messages": [SYSTEM]}]},
    )
    deadline = time.monotonic() + 30
    while client.get("/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    usages = []
    for i, stream in enumerate([False, True, False]):
        body = {
            "model": "tiny-random",
            "messages": [SYSTEM, {"role": "user", "content": f"question {i}"}],
            "max_tokens": 5,
            "ignore_eos": True,
            "stream": stream,
            "stream_options": {"include_usage": True} if stream else None,
        }
        r = client.post("/v1/chat/completions", json=body)
        if stream:
            import json

            chunks = [
                json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")
            ]
            usages.append(chunks[-1]["usage"])
        else:
            usages.append(r.json()["usage"])
    r = client.post(
        "/v1/completions",
        json={"model": "tiny-random", "prompt": "cold text", "max_tokens": 3, "ignore_eos": True},
    )
    usages.append(r.json()["usage"])

    values = samples(client)
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    base = {"warmfleet_daemon": "mac-test", "gen_ai_request_model": "tiny-random"}
    assert total(values, "gen_ai_server_time_to_first_token_seconds_count", **base) == 4
    assert (
        total(
            values,
            "gen_ai_server_time_to_first_token_seconds_count",
            gen_ai_operation_name="chat",
            warmfleet_cache_outcome="hit",
        )
        == 3
    )
    assert (
        total(
            values,
            "gen_ai_server_time_to_first_token_seconds_count",
            gen_ai_operation_name="text_completion",
            warmfleet_cache_outcome="miss",
        )
        == 1
    )
    assert total(values, "gen_ai_server_request_duration_seconds_count") == 4
    assert total(values, "gen_ai_server_time_per_output_token_seconds_count") == 4
    assert total(values, "gen_ai_server_inference_usage_input_tokens_total", **base) == prompt
    assert total(values, "gen_ai_server_inference_usage_output_tokens_total") == completion
    assert total(values, "gen_ai_server_inference_usage_cache_read_input_tokens_total") == cached
    assert total(values, "warmfleet_prefix_cache_queried_tokens_total") == prompt
    assert total(values, "warmfleet_prefix_cache_hit_tokens_total") == cached > 0
    status = client.get("/v1/status").json()["cache"]
    assert total(values, "warmfleet_prefix_cache_size_bytes", **base) == status["bytes"] > 0
    assert total(values, "warmfleet_prefix_cache_budget_bytes") == 64 << 20
    assert total(values, "warmfleet_prefix_cache_pinned_entries") == status["pinned_count"] > 0
    assert (
        total(
            values,
            "warmfleet_warm_prompts",
            warmfleet_warm_prompt_state="warm",
            warmfleet_warm_set_namespace="team",
        )
        == 1
    )
    assert (
        total(values, "warmfleet_warmup_duration_seconds_count", warmfleet_warm_prompt_state="warm")
        == 1
    )
    assert total(values, "warmfleet_requests_running") == 0
    # Every hit came from RAM; the disk tier is on and holds what RAM stored.
    tiers = "warmfleet_prefix_cache_tier_hit_tokens_total"
    assert total(values, tiers, warmfleet_cache_tier="ram") == cached
    assert total(values, tiers, warmfleet_cache_tier="disk") == 0
    assert total(values, tiers, warmfleet_cache_tier="peer") == 0
    assert "warmfleet_peer_spill_copied_bytes_total" in {name for name, _ in values}
    assert total(values, "warmfleet_disk_tier_enabled") == 1
    assert total(values, "warmfleet_disk_tier_written_bytes_total") > 0

    exported = {name for name, _ in values}
    for where, expr in [*dashboard_queries(), *rule_exprs()]:
        for name in metric_names(expr):
            if name.startswith("warmfleet_router_"):
                continue  # the router's (tests/router/test_router_daemons.py)
            assert name in exported, f"{where} reads {name}, which /metrics does not export"


def test_a_daemon_without_a_disk_tier_exports_every_series_the_dashboards_read() -> None:
    """No disk tier (no --cache-dir or --state-dir) and no request yet: every daemon series
    a dashboard query or an alert names is there, the disk tier's at 0 ("off"), so no panel
    of a healthy fleet reads "No data"."""
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(model="tiny-random", daemon_name="mac-plain")
    with TestClient(create_app(settings, engine=engine)) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        values = samples(client)
        assert client.get("/v1/status").json()["sim"] is None  # a real engine
    exported = {name for name, _ in values}
    missing = {
        name
        for _, expr in [*dashboard_queries(), *rule_exprs()]
        for name in metric_names(expr)
        if not name.startswith("warmfleet_router_") and name not in exported
    }
    # Histograms and counters of requests appear with the first request; everything else
    # (gauges, the tiers, warm sets) is there from the start.
    assert {n for n in missing if not n.startswith(("gen_ai_", "warmfleet_prefix_cache"))} == set()
    disk = {name: v for (name, _), v in values.items() if name.startswith("warmfleet_disk_tier_")}
    assert disk and set(disk.values()) == {0.0}
    # A real engine's simulated time: none, at 0 (a simulated daemon's: test_sim_clock.py).
    sim = {name: v for (name, _), v in values.items() if name.startswith("warmfleet_sim_clock_")}
    assert sim == {
        "warmfleet_sim_clock_spent_seconds_total": 0.0,
        "warmfleet_sim_clock_behind_seconds_total": 0.0,
    }
