"""The real helm binary (`.tools/bin`, installed by `scripts/setup.sh --test-tools`) on
charts/warmfleet, and offline validation of what it renders: Kubernetes kinds against the
Kubernetes OpenAPI schemas (kubernetes-validate), monitoring.coreos.com kinds against the
prometheus-operator models (cloudcoil), warmfleet.io kinds against our CRDs."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "warmfleet"
HELM = ROOT / ".tools" / "bin" / "helm"
# The chart's oldest and the newest Kubernetes that kubernetes-validate has schemas for.
KUBE_VERSIONS = ("1.27.0", "1.37.0")
MONITORING_APIS = (
    "monitoring.coreos.com/v1/PrometheusRule",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1alpha1/ScrapeConfig",
)
needs_helm = pytest.mark.skipif(
    not HELM.exists() and shutil.which("helm") is None,
    reason="helm not installed (make test installs it to .tools/bin on Linux x86_64)",
)


def helm_binary() -> str:
    return str(HELM) if HELM.exists() else str(shutil.which("helm"))


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}:\n{done.stderr}")
    return done


def render(
    *values_files: Path,
    sets: tuple[str, ...] = (),
    monitoring: bool = False,
    namespace: str = "warmfleet",
    release: str = "warmfleet",
) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    if monitoring:
        for api in MONITORING_APIS:
            args += ["--api-versions", api]
    return [d for d in yaml.safe_load_all(_template(tuple(args))) if d]


@cache
def _template(args: tuple[str, ...]) -> str:
    # helm is the slow part (and the output is the same for the same files): once per run.
    return helm(*args).stdout


def notes(*values_files: Path) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it (a cluster without the
    Prometheus Operator: client mode serves only the built-in APIs)."""
    args = ["install", "warmfleet", str(CHART), "-n", "warmfleet", "--dry-run=client"]
    for f in values_files:
        args += ["-f", str(f)]
    out = helm(*args).stdout
    return out.split("NOTES:", 1)[1] if "NOTES:" in out else ""


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


# -- validation ------------------------------------------------------------------------


def validate(doc: dict[str, Any]) -> None:
    """Raise if `doc` is not a valid object of its kind (unknown fields included)."""
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    if group == "warmfleet.io":
        jsonschema.validate(doc, crd_jsonschema(doc["kind"]))
    elif group == "monitoring.coreos.com":
        validate_monitoring(doc)
    else:
        import kubernetes_validate

        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def validate_monitoring(doc: dict[str, Any]) -> None:
    """Against the prometheus-operator models; fields they do not know are errors too."""
    from cloudcoil.models.prometheus_operator import v1, v1alpha1

    version = doc["apiVersion"].split("/")[1]
    model = getattr({"v1": v1, "v1alpha1": v1alpha1}[version], doc["kind"])
    parsed = model.model_validate(doc)
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    unknown = _unknown_fields(doc, dumped)
    assert not unknown, f"{doc['kind']}: fields the prometheus-operator schema lacks: {unknown}"


def _unknown_fields(given: Any, known: Any, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(known, dict):
        out: list[str] = []
        for key, value in given.items():
            if key not in known:
                out.append(f"{path}.{key}")
            elif path.endswith(("labels", "annotations")):
                continue
            else:
                out += _unknown_fields(value, known[key], f"{path}.{key}")
        return out
    if isinstance(given, list) and isinstance(known, list):
        return [
            f
            for i, (g, k) in enumerate(zip(given, known))
            for f in _unknown_fields(g, k, f"{path}[{i}]")
        ]
    return []


@cache
def crd_jsonschema(kind: str) -> dict[str, Any]:
    for path in (ROOT / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return dict(_strip_extensions(schema))
    raise KeyError(kind)


def _strip_extensions(node: Any) -> Any:
    """JSON Schema from a structural schema: fields it does not list are errors here (the
    API server would silently prune them, which is worse for values someone wrote)."""
    if isinstance(node, dict):
        out = {k: _strip_extensions(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strip_extensions(v) for v in node]
    return node
