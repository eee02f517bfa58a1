"""Values that charts/warmfleet must refuse, with a message naming what is wrong, before
anything reaches a cluster; and the offline validators themselves catch bad manifests."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from support.helm import CHART, helm, needs_helm, render, validate

pytestmark = needs_helm

BAD_VALUES = [
    # (a --set, what the error must mention)
    ("operator.resyncSecond=3", "resyncSecond"),  # misspelt key
    ("operator.resyncSeconds=0", "/operator/resyncSeconds"),
    ("operator.watchNamespaces[0]=Team_A", "/operator/watchNamespaces/0"),
    ("operator.healthPort=70000", "/operator/healthPort"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("router.service.type=Ingress", "/router/service/type"),
    ("router.replicas=-1", "/router/replicas"),
    ("nodes[0].name=Mac_Mini,nodes[0].url=http://m:8000", "/nodes/0/name"),
    ("nodes[0].name=m1,nodes[0].url=ftp://m1", "/nodes/0/url"),
    ("nodes[0].name=m1", "url"),  # url missing
    ("nodes[0].name=m1,nodes[0].url=http://m1:8000,nodes[0].labels.bad key=x", "'bad key'"),
    ("nodes[0].name=m1,nodes[0].url=http://m1:8000,nodes[0].adminTokenSecretRef.name=t", "key"),
    ("warmPromptSets[0].name=s", "spec"),
    ("adminToken.existingSecret=Not_A_Name", "/adminToken/existingSecret"),
    ("monitoring.serviceMonitor.interval=often", "/monitoring/serviceMonitor/interval"),
    ("monitoring.dashboard.enabled=true", "dashboard"),
]


@pytest.mark.parametrize(("setting", "mentions"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_schema_refuses_bad_values(setting: str, mentions: str) -> None:
    done = helm("template", "warmfleet", str(CHART), "--set", setting, check=False)
    assert done.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr
    assert mentions in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            (
                "nodes[0].name=m1",
                "nodes[0].url=http://a:1",
                "nodes[1].name=m1",
                "nodes[1].url=http://b:1",
            ),
            '"m1" is listed twice',
        ),
        (
            (
                "warmPromptSets[0].name=s",
                "warmPromptSets[0].spec.prompts[0].name=p",
                "warmPromptSets[1].name=s",
                "warmPromptSets[1].spec.prompts[0].name=p",
            ),
            "warmfleet/s is listed twice",
        ),
    ],
    ids=["duplicate-node", "duplicate-set"],
)
def test_duplicates_are_refused(settings: tuple[str, ...], message: str) -> None:
    args = ["template", "warmfleet", str(CHART), "-n", "warmfleet"]
    for s in settings:
        args += ["--set", s]
    done = helm(*args, check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_the_validators_catch_what_they_must() -> None:
    """A typo in any kind of rendered manifest fails validation (a validator that accepts
    anything would make the rendering tests worthless)."""
    docs = render(
        CHART / "values.yaml",
        sets=(
            "nodes[0].name=m1",
            "nodes[0].url=http://m1:8000",
            "router.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.scrapeConfig.enabled=true",
        ),
        monitoring=True,
    )
    broken: list[tuple[dict[str, Any], str]] = []
    for doc in docs:
        bad = copy.deepcopy(doc)
        if doc["kind"] == "Deployment":
            bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
        elif doc["kind"] == "WarmNode":
            bad["spec"]["ur1"] = "http://x"
        elif doc["kind"] in ("ServiceMonitor", "ScrapeConfig", "PrometheusRule"):
            bad["spec"]["intervall"] = "30s"
        else:
            continue
        broken.append((bad, doc["kind"]))
    assert {kind for _, kind in broken} == {
        "Deployment",
        "WarmNode",
        "ServiceMonitor",
        "ScrapeConfig",
        "PrometheusRule",
    }
    for bad, kind in broken:
        try:
            validate(bad)
        except Exception:  # each validator raises its own type
            continue
        pytest.fail(f"{kind}: a misspelt field was accepted")
