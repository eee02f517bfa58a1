"""The dashboard, the rules and the PrometheusRule: structure, and promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from support.promql import PROMETHEUS_RULE, RULES, dashboard

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None, reason="promtool (Debian: prometheus) missing"
)


def test_dashboard_has_the_variables_and_a_datasource_on_every_query() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "model", "daemon", "tenant"}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        if panel["type"] == "row":  # a heading (the disk tier's, the tenants')
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            if panel["title"].startswith(("Tenants:", "Learned:")):  # the router's, per tenant
                assert "$tenant" in target["expr"], panel["title"]
            else:
                assert "$model" in target["expr"] and "$daemon" in target["expr"], panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_hit_rate_and_ttft_share_one_two_axis_panel() -> None:
    first = dashboard()["panels"][0]
    exprs = " ".join(t["expr"] for t in first["targets"])
    assert "hit_tokens_total" in exprs and "time_to_first_token_seconds_bucket" in exprs
    right = [
        o
        for o in first["fieldConfig"]["overrides"]
        if {"id": "custom.axisPlacement", "value": "right"} in o["properties"]
    ]
    assert len(right) == 2  # p50 and p95 on the right axis, in seconds


def test_prometheusrule_carries_the_same_rules() -> None:
    plain = yaml.safe_load(RULES.read_text())
    manifest = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["spec"] == plain


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", "warmfleet-rules.test.yaml"],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_tenants_have_a_row_of_their_own() -> None:
    panels = dashboard()["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Tenants"]
    learned = next(p for p in panels if p["type"] == "row" and p["title"].startswith("Learned"))
    below = [p for p in panels if row["gridPos"]["y"] < p["gridPos"]["y"] < learned["gridPos"]["y"]]
    assert below and all(p["title"].startswith("Tenants:") for p in below)
    exprs = " ".join(t["expr"] for p in below for t in p["targets"])
    for metric in (
        "warmfleet_router_tenant_requests_total",
        "warmfleet_router_tenant_tokens_total",
        "warmfleet_router_tenant_throttled_total",
        "warmfleet_router_tenant_in_flight",
    ):
        assert metric in exprs, metric
    for kind in ("input", "cached"):
        assert f'gen_ai_token_type="{kind}"' in exprs


def test_learned_warm_prompts_have_a_row_of_their_own() -> None:
    """The first-request hit rate per agent, learned or not (a stale warm set is a
    falling line), and how many prompts the router learned."""
    panels = dashboard()["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Learned warm prompts"]
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    assert below and all(p["title"].startswith("Learned:") for p in below)
    exprs = " ".join(t["expr"] for p in below for t in p["targets"])
    assert "warmfleet_router_first_request_tokens_total" in exprs
    assert "warmfleet_router_learned_prompts" in exprs
    assert "by (warmfleet_client, warmfleet_learned)" in exprs


def test_the_disk_tier_has_a_row_of_its_own() -> None:
    panels = dashboard()["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Disk tier"]
    assert row["title"] == "Disk tier"
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    exprs = " ".join(t["expr"] for p in below for t in p.get("targets", []))
    for metric in (
        "warmfleet_prefix_cache_tier_hit_tokens_total",
        "warmfleet_disk_tier_size_bytes",
        "warmfleet_disk_tier_budget_bytes",
        "warmfleet_disk_tier_enabled",
        "warmfleet_disk_tier_written_bytes_total",
        "warmfleet_disk_tier_read_bytes_total",
        "warmfleet_disk_tier_queue_size_bytes",
        "warmfleet_disk_tier_dropped_total",
    ):
        assert metric in exprs, metric
