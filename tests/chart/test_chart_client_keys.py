"""charts/warmfleet with client keys: Prometheus needs a key of its own to scrape a keyed
router (its /metrics answers only to a key), and the chart says so at render time."""

from __future__ import annotations

from support.helm import CHART, helm, needs_helm

pytestmark = needs_helm


def test_client_keys_without_a_key_for_prometheus_are_refused() -> None:
    args = ["template", "warmfleet", str(CHART)]
    args += ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]
    for s in ("monitoring.serviceMonitor.enabled=true", "router.enabled=true",
              "router.apiKeys.existingSecret=client-keys"):  # fmt: skip
        args += ["--set", s]
    done = helm(*args, check=False)
    assert done.returncode != 0 and "monitoring.apiKeySecret.existingSecret" in done.stderr
    # With a key for it, the same values render.
    args += ["--set", "monitoring.apiKeySecret.existingSecret=prometheus-client-key"]
    assert helm(*args).returncode == 0
