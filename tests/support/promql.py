"""Read the PromQL out of the dashboards and rules, the way Grafana and Prometheus do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "warmfleet-prefix-cache.json"
RULES = ROOT / "dashboards" / "alerts" / "warmfleet-rules.yaml"
PROMETHEUS_RULE = ROOT / "dashboards" / "alerts" / "prometheusrule.yaml"

# Grafana's All value for the multi-value variables is the regex ".*".
ALL = ".*"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title / refId, expr) for every panel target and query variable."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):  # rows have none
            out.append((f"{panel['title']} / {target['refId']}", target["expr"]))
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


def rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in rules["groups"]
        for rule in group["rules"]
    ]


def expand(expr: str, *, model: str, rate_interval: str) -> str:
    """Substitute Grafana's variables as it would for a query."""
    values = {
        "__rate_interval": rate_interval,
        "model": prometheus_regex_escape(model),
        "daemon": ALL,
        "namespace": ALL,
        "tenant": ALL,
    }
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def prometheus_regex_escape(value: str) -> str:
    """Grafana's escaping of a variable value inside a PromQL regex string."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def label_values(expr: str) -> str | None:
    """`label_values(metric{...}, label)` -> the series selector (what Grafana asks)."""
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr.strip(), re.S)
    return m.group(1) if m else None


def metric_names(expr: str) -> set[str]:
    """Exported metric names an expression reads (not recording-rule names)."""
    names = set(re.findall(r"\b((?:gen_ai|warmfleet)_[a-z0-9_]+)", expr))
    return {n for n in names if not n.startswith("warmfleet_cache_outcome")} - LABELS


LABELS = {
    "warmfleet_daemon",
    "warmfleet_warm_set_namespace",
    "warmfleet_warm_set_name",
    "warmfleet_warm_prompt_state",
    "warmfleet_cache_outcome",
    "warmfleet_cache_tier",
    "gen_ai_request_model",
    # the router's
    "warmfleet_route_reason",
    "warmfleet_prediction",
    "warmfleet_prediction_source",
    "warmfleet_outcome",
    "warmfleet_index_mode",
    "warmfleet_tenant",
    "warmfleet_client",
    "warmfleet_learned",
    "warmfleet_quota_limit",
    "gen_ai_token_type",
}
