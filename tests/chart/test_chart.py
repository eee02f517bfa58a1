"""charts/warmfleet with the real helm: lint, render with the defaults, with every option
on and with the README's three-Mac example, validate every manifest offline, and check
what each object must say (hardening, least privilege, copies identical to the sources)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.helm import CHART, ROOT, by_kind, helm, needs_helm, notes, one, render, validate

pytestmark = needs_helm
ALL = Path(__file__).with_name("all-options.yaml")
EXAMPLE = ROOT / "examples" / "helm" / "values.yaml"


# -- the chart's copies are the repository's files ---------------------------------------


def test_chart_crds_are_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert top and chart == top, (
        "charts/warmfleet/crds/ differs from crds/: cp crds/*.yaml charts/warmfleet/crds/"
    )


def test_chart_dashboards_and_rules_are_the_repository_files() -> None:
    top = {p.name: p.read_bytes() for p in (ROOT / "dashboards").glob("*.json")}
    chart = {p.name: p.read_bytes() for p in (CHART / "dashboards").glob("*.json")}
    assert top and chart == top, (
        "charts/warmfleet/dashboards/ differs: cp dashboards/*.json charts/warmfleet/dashboards/"
    )
    rules = ROOT / "dashboards" / "alerts" / "warmfleet-rules.yaml"
    assert (CHART / "files" / "warmfleet-rules.yaml").read_bytes() == rules.read_bytes(), (
        "cp dashboards/alerts/warmfleet-rules.yaml charts/warmfleet/files/"
    )


# -- lint and render -----------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, ALL, EXAMPLE], ids=["defaults", "all", "example"])
def test_helm_lint_strict(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    assert "0 chart(s) failed" in helm(*args).stdout


@pytest.mark.parametrize(
    ("values", "monitoring"),
    [(None, False), (ALL, True), (ALL, False), (EXAMPLE, True)],
    ids=["defaults", "all", "all-without-prometheus-operator", "example"],
)
def test_every_rendered_manifest_is_valid(values: Path | None, monitoring: bool) -> None:
    docs = render(*([values] if values else []), monitoring=monitoring)
    assert docs
    for doc in docs:
        validate(doc)
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two objects with the same kind and name"


def test_defaults_render_the_operator_and_nothing_optional() -> None:
    docs = render()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Role",
        "RoleBinding",
        "Secret",
        "ServiceAccount",
    ]
    assert [d["metadata"]["name"] for d in by_kind(docs, "Deployment")] == ["warmfleet-operator"]


def test_every_option_renders_every_object() -> None:
    docs = render(ALL, monitoring=True)
    kinds = {d["kind"] for d in docs}
    assert kinds >= {
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "WarmNode",
        "WarmPromptSet",
        "ConfigMap",
        "PrometheusRule",
        "ServiceMonitor",
        "ScrapeConfig",
        "Secret",
    }
    assert {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")} == {
        "wf-op",
        "wf-router",
        "mac-joiner",
    }


# -- the operator ----------------------------------------------------------------------------


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


@pytest.mark.parametrize("values", [None, ALL], ids=["defaults", "all"])
def test_operator_is_hardened_and_probed_on_kopfs_liveness_endpoint(values: Path | None) -> None:
    docs = render(*([values] if values else []))
    name = "wf-operator" if values else "warmfleet-operator"
    deployment = one(docs, "Deployment", name)
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert (
        deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    )
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # The probes hit the port kopf's liveness endpoint listens on, at its path.
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    assert f"--liveness=http://0.0.0.0:{port}/healthz" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["args"][0] == "operator"
    assert pod["serviceAccountName"] == ("wf-op" if values else "warmfleet-operator")


def test_operator_arguments_are_what_its_cli_accepts() -> None:
    """The chart's command line parses with `warmfleet operator`'s own parser."""
    import argparse

    from warmfleet_operator.cli import add_arguments

    for values in (None, ALL):
        container = _container(
            one(
                render(*([values] if values else [])),
                "Deployment",
                "wf-operator" if values else "warmfleet-operator",
            )
        )
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(container["args"][1:])
        if values:
            assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces
            assert (args.resync_seconds, args.probe_seconds) == (15, 10)
        else:
            assert args.all_namespaces and args.namespace == []


# -- RBAC ------------------------------------------------------------------------------------


def _rules(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


OPERATOR_SET_RULES = {
    *(("warmfleet.io", "warmpromptsets", v) for v in ("get", "list", "watch", "patch")),
    ("warmfleet.io", "warmpromptsets/status", "get"),
    ("warmfleet.io", "warmpromptsets/status", "patch"),
    ("", "configmaps", "get"),
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "events", "create"),
}
OPERATOR_NODE_RULES = {
    *(("warmfleet.io", "warmnodes", v) for v in ("get", "list", "watch", "patch")),
    ("warmfleet.io", "warmnodes/status", "get"),
    ("warmfleet.io", "warmnodes/status", "patch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
NAMESPACE_RULES = {("", "namespaces", "list"), ("", "namespaces", "watch")}


def test_operator_rbac_cluster_wide_is_exactly_what_it_uses() -> None:
    docs = render()
    cluster_role = one(docs, "ClusterRole", "warmfleet-operator")
    assert _rules(cluster_role) == OPERATOR_NODE_RULES | OPERATOR_SET_RULES
    secrets = one(docs, "Role", "warmfleet-operator-secrets")
    assert secrets["metadata"]["namespace"] == "warmfleet"
    assert _rules(secrets) == {("", "secrets", "get")}
    binding = one(docs, "ClusterRoleBinding", "warmfleet-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "warmfleet-operator", "namespace": "warmfleet"}
    ]


def test_operator_rbac_with_watch_namespaces_is_namespaced() -> None:
    docs = render(ALL)
    assert _rules(one(docs, "ClusterRole", "wf-operator")) == OPERATOR_NODE_RULES | NAMESPACE_RULES
    roles = {
        d["metadata"]["namespace"]: d
        for d in by_kind(docs, "Role")
        if d["metadata"]["name"] == "wf-operator"
    }
    assert set(roles) == {"team-a", "team-b", "warmfleet"}
    assert _rules(roles["team-a"]) == _rules(roles["team-b"]) == OPERATOR_SET_RULES
    # The release's namespace only gets the WarmNodes' Events.
    assert _rules(roles["warmfleet"]) == {("", "events", "create")}
    secret_roles = {
        d["metadata"]["namespace"]
        for d in by_kind(docs, "Role")
        if d["metadata"]["name"] == "wf-operator-secrets"
    }
    assert secret_roles == {"warmfleet", "tokens"}
    bindings = by_kind(docs, "RoleBinding")
    router = [b for b in bindings if b["metadata"]["name"] == "wf-router-secrets"]
    assert all(b["subjects"][0]["name"] == "wf-op" for b in bindings if b not in router)
    # The router reads the WarmNodes' token Secrets through the same Role, nothing more.
    assert {b["metadata"]["namespace"] for b in router} == secret_roles
    assert {b["roleRef"]["name"] for b in router} == {"wf-operator-secrets"}


def test_nothing_may_delete_and_only_the_operator_reads_secrets() -> None:
    docs = render(ALL)
    for doc in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        rules = _rules(doc)
        assert not {r for r in rules if r[2] in ("delete", "deletecollection", "*")}, doc
        assert not {r for r in rules if r[1] == "*" or r[0] == "*"}, doc
        if ("", "secrets", "get") in rules:
            assert doc["kind"] == "Role" and doc["metadata"]["name"] == "wf-operator-secrets"


def test_registration_role_creates_reads_and_patches_warmnodes_only() -> None:
    docs = render(ALL)
    role = one(docs, "ClusterRole", "wf-register")
    assert role["rules"] == [
        {"apiGroups": ["warmfleet.io"], "resources": ["warmnodes"], "verbs": ["create"]},
        {
            "apiGroups": ["warmfleet.io"],
            "resources": ["warmnodes"],
            "verbs": ["get", "patch"],
            "resourceNames": ["mac-mini-3", "mac-mini-4"],
        },
    ]
    binding = one(docs, "ClusterRoleBinding", "wf-register")
    assert binding["subjects"][0]["name"] == "mac-joiner"
    assert one(docs, "ServiceAccount", "mac-joiner")["automountServiceAccountToken"] is False
    assert not [d for d in render() if "register" in d["metadata"]["name"]]


# -- router ----------------------------------------------------------------------------------


def test_router_is_off_by_default_and_reads_warmnodes_when_on() -> None:
    assert not [d for d in render() if "router" in d["metadata"]["name"]]
    docs = render(ALL)
    deployment = one(docs, "Deployment", "wf-router")
    container = _container(deployment)
    assert container["args"][:4] == ["router", "--from-cluster", "--host=0.0.0.0", "--port=9000"]
    assert "--policy=prefix" in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deployment["spec"]["replicas"] == 2
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["admin-token"]["secret"]["secretName"] == "daemon-token"
    assert "--admin-token-file=/var/run/warmfleet/admin-token/admin" in container["args"]
    service = one(docs, "Service", "wf-router")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    assert _rules(one(docs, "ClusterRole", "wf-router")) == {
        ("warmfleet.io", "warmnodes", v) for v in ("get", "list", "watch")
    }


# -- WarmNodes, WarmPromptSets, the admin token ---------------------------------------------


def test_warmnodes_and_warmpromptsets_from_values() -> None:
    docs = render(EXAMPLE)
    nodes = {d["metadata"]["name"]: d for d in by_kind(docs, "WarmNode")}
    assert set(nodes) == {"mac-mini-1", "mac-mini-2", "mac-studio-1"}
    assert nodes["mac-studio-1"]["metadata"]["labels"]["warmfleet.io/pool"] == "review"
    assert nodes["mac-mini-1"]["spec"] == {
        "url": "http://mac-mini-1.lan:8000",
        "adminTokenSecretRef": {
            "name": "warmfleet-admin-token",
            "namespace": "warmfleet",
            "key": "token",
        },
    }
    sets = {d["metadata"]["name"]: d for d in by_kind(docs, "WarmPromptSet")}
    assert set(sets) == {"on-call", "code-review"}
    assert sets["on-call"]["metadata"]["namespace"] == "warmfleet"
    example = yaml.safe_load(EXAMPLE.read_text())
    assert sets["on-call"]["spec"] == example["warmPromptSets"][0]["spec"]
    all_docs = render(ALL)
    node2 = one(all_docs, "WarmNode", "mac-mini-2")
    assert node2["spec"]["adminTokenSecretRef"] == {
        "name": "mac-mini-2-token",
        "key": "token",
        "namespace": "tokens",
    }
    assert one(all_docs, "WarmNode", "mac-mini-1")["spec"]["adminTokenSecretRef"] == {
        "name": "daemon-token",
        "namespace": "warmfleet",
        "key": "admin",
    }
    assert one(all_docs, "WarmPromptSet", "agents")["metadata"]["namespace"] == "team-a"


def test_admin_token_is_generated_unless_an_existing_secret_is_named() -> None:
    secret = one(render(), "Secret", "warmfleet-admin-token")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # A second render (no cluster to look it up in) draws another one: it is random.
    fresh = helm("template", "warmfleet", str(CHART), "--namespace", "warmfleet").stdout
    again = one(list(yaml.safe_load_all(fresh)), "Secret", "warmfleet-admin-token")["data"]["token"]
    assert again != secret["data"]["token"]
    assert not [
        d for d in render(ALL) if d["kind"] == "Secret" and "token" in d["metadata"]["name"]
    ]


# -- observability ---------------------------------------------------------------------------


def test_dashboards_configmap_is_the_dashboard_json_for_grafanas_sidecar() -> None:
    docs = render(ALL)
    cm = one(docs, "ConfigMap", "wf-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    sources = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert set(cm["data"]) == set(sources)
    for name, text in sources.items():
        assert cm["data"][name] == text.rstrip("\n")
        assert json.loads(cm["data"][name]) == json.loads(text)
    assert not by_kind(render(sets=("monitoring.dashboards.enabled=false",)), "ConfigMap")


def test_prometheusrule_holds_the_alert_rules() -> None:
    rule = one(render(ALL, monitoring=True), "PrometheusRule", "wf")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load((ROOT / "dashboards" / "alerts" / "warmfleet-rules.yaml").read_text())
    assert rule["spec"] == source


def test_monitoring_objects_need_the_prometheus_operator_api() -> None:
    docs = render(ALL, monitoring=False)
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")]
    text = notes(ALL)
    assert "does not serve\nmonitoring.coreos.com/v1 PrometheusRule" in text
    assert "ScrapeConfig" in text
    assert "NOTE" not in notes()


def test_servicemonitor_scrapes_the_router_service() -> None:
    docs = render(ALL, monitoring=True)
    monitor = one(docs, "ServiceMonitor", "wf-router")
    service = one(docs, "Service", "wf-router")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {k: endpoint[k] for k in ("port", "path", "interval")} == {
        "port": "http",
        "path": "/metrics",
        "interval": "15s",
    }
    # With client keys the router's /metrics answers only to a key: Prometheus sends its own.
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "prometheus-client-key", "key": "key"},
    }
    # Without the router there is nothing to monitor.
    assert not by_kind(
        render(sets=("monitoring.serviceMonitor.enabled=true",), monitoring=True), "ServiceMonitor"
    )


KEYED = {"type": "Bearer", "credentials": {"name": "prometheus-client-key", "key": "key"}}


def test_scrapeconfig_targets_the_macs_by_scheme_and_path() -> None:
    docs = render(ALL, monitoring=True)
    configs = {d["spec"]["jobName"]: d["spec"] for d in by_kind(docs, "ScrapeConfig")}
    assert configs == {
        "warmfleet-daemons-1": {
            "jobName": "warmfleet-daemons-1",
            "scheme": "HTTP",
            "metricsPath": "/metrics",
            "scrapeInterval": "20s",
            "authorization": KEYED,
            "staticConfigs": [
                {"targets": ["mac-mini-1.lan:8000"], "labels": {"warmnode": "mac-mini-1"}}
            ],
        },
        "warmfleet-daemons": {
            "jobName": "warmfleet-daemons",
            "scheme": "HTTPS",
            "metricsPath": "/warmfleet/metrics",
            "scrapeInterval": "20s",
            "authorization": KEYED,
            "staticConfigs": [
                {"targets": ["mac-mini-2.example.com:443"], "labels": {"warmnode": "mac-mini-2"}}
            ],
        },
    }


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_plain_scrape_config_is_a_valid_prometheus_config(tmp_path: Path) -> None:
    secret = one(render(ALL), "Secret", "wf-scrape-daemons")
    jobs = yaml.safe_load(secret["stringData"]["prometheus-additional.yaml"])
    assert [j["job_name"] for j in jobs] == ["warmfleet-daemons", "warmfleet-daemons-1"]
    assert jobs[0]["static_configs"][0]["targets"] == ["mac-mini-2.example.com:443"]
    assert jobs[0]["metrics_path"] == "/warmfleet/metrics" and jobs[0]["scheme"] == "https"
    key_file = "/etc/prometheus/secrets/prometheus-client-key/key"
    assert all(j["authorization"] == {"credentials_file": key_file} for j in jobs)
    (tmp_path / "key").write_text("sk-prometheus-0123456789")  # promtool opens the file
    for job in jobs:
        job["authorization"]["credentials_file"] = str(tmp_path / "key")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    done = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_notes_say_what_to_run_next() -> None:
    text = notes(EXAMPLE)
    assert "kubectl -n warmfleet rollout status deploy/warmfleet-operator" in text
    assert "get secret warmfleet-admin-token" in text
    assert "warmfleet service install --host 0.0.0.0 --admin-token-file" in text
    assert "--admin-token-secret warmfleet/warmfleet-admin-token:token" in text
    assert "create token warmfleet-register" in text
    assert "port-forward svc/warmfleet-router" in text


def _readme_values() -> str:
    readme = (ROOT / "docs" / "operator.md").read_text()
    section = readme.split("## The operator: `helm install warmfleet charts/warmfleet", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_readme_values_for_three_macs_render_and_validate(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(_readme_values())
    docs = render(values)
    for doc in docs:
        validate(doc)
    assert len(by_kind(docs, "WarmNode")) == 3
    assert [d["metadata"]["name"] for d in by_kind(docs, "WarmPromptSet")] == ["code-review"]
    operator = _container(one(docs, "Deployment", "warmfleet-operator"))
    assert operator["image"] == "registry.example.com/platform/warmfleet:0.1.0"


def _operator_grants(docs: list[dict[str, Any]], names: set[str]) -> set[tuple[str, str, str]]:
    return {
        rule
        for doc in by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        if doc["metadata"]["name"] in names
        for rule in _rules(doc)
    }


@pytest.mark.parametrize(
    ("values", "deploy_dir", "names"),
    [
        (None, "all-namespaces", {"warmfleet-operator", "warmfleet-operator-secrets"}),
        (ALL, "namespaced", {"wf-operator", "wf-operator-secrets"}),
    ],
)
def test_the_chart_grants_the_operator_what_deploy_rbac_grants(
    values: Path | None, deploy_dir: str, names: set[str]
) -> None:
    """deploy/rbac/ is what the e2e suite runs the operator as on a real API server; the
    chart splits the same rules by namespace but grants no more and no less."""
    docs = render(values) if values else render()
    shipped = [
        doc
        for path in sorted((ROOT / "deploy" / "rbac" / deploy_dir).glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] in ("ClusterRole", "Role")
    ]
    assert _operator_grants(docs, names) == {r for doc in shipped for r in _rules(doc)}


# -- TLS, client keys and quotas --------------------------------------------------------------


def _mounted(deployment: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mounted at the directory holding `path`."""
    container = _container(deployment)
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    return dict(volumes[mount["name"]])


def test_router_serves_https_with_keys_and_quotas_from_secrets_and_values() -> None:
    """The router's command line parses with its own parser, every file it names is
    mounted from the Secret or ConfigMap the values say (whole, so renewals reach it), its
    probes speak HTTPS, and the quotas ConfigMap is a quotas file the router accepts."""
    import argparse

    from warmfleet_router.cli import add_arguments
    from warmfleet_router.quotas import parse_quotas

    docs = render(ALL)
    deployment = one(docs, "Deployment", "wf-router")
    container = _container(deployment)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    files = {
        args.tls_cert: ("secret", "wf-router-tls"),
        args.tls_key: ("secret", "wf-router-tls"),
        args.tls_ca: ("secret", "fleet-ca"),
        args.tls_client_cert: ("secret", "wf-client-tls"),
        args.tls_client_key: ("secret", "wf-client-tls"),
        args.api_keys_file: ("secret", "client-keys"),
        args.quotas: ("configMap", "wf-router-quotas"),
    }
    for path, (kind, name) in files.items():
        volume = _mounted(deployment, path)
        source = volume[kind]
        assert source.get("secretName", source.get("name")) == name, path
        if "items" in source:  # the ConfigMap's one key is mounted whole
            assert path.rsplit("/", 1)[1] in [i["path"] for i in source["items"]]
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        assert "subPath" not in mount  # a renewal reaches the mounted files
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    quotas = one(docs, "ConfigMap", "wf-router-quotas")["data"]["quotas.yaml"]
    config = parse_quotas(quotas)
    assert config.limits("team-a").requests_per_minute == 60
    assert config.limits("team-a").concurrent_requests == 16  # the default's
    monitor = one(render(ALL, monitoring=True), "ServiceMonitor", "wf-router")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "wf-router-tls", "key": "ca.crt"}
    # Off by default: plain HTTP to the daemons, nothing mounted for it.
    plain = _container(one(render(), "Deployment", "warmfleet-operator"))
    assert not [a for a in plain["args"] if a.startswith("--tls")]


def test_operator_verifies_and_presents_certificates_from_secrets() -> None:
    import argparse

    from warmfleet_operator.cli import add_arguments

    deployment = one(render(ALL), "Deployment", "wf-operator")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(_container(deployment)["args"][1:])
    assert _mounted(deployment, args.tls_ca)["secret"]["secretName"] == "fleet-ca"
    for path in (args.tls_cert, args.tls_key):
        assert _mounted(deployment, path)["secret"]["secretName"] == "wf-client-tls"


@pytest.mark.parametrize(
    "bad",
    [
        {"router": {"quotas": {"default": {"requests_per_minute": 0}}}},
        {"router": {"quotas": {"tenants": {"bad name": {}}}}},
        {"router": {"quotas": {"default": {"rpm": 3}}}},
        {"router": {"apiKeys": {"existingSecret": "Not_A_Name", "secretKey": "k"}}},
        {"tls": {"caSecret": "ca", "caKey": "a/b"}},
    ],
)
def test_the_schema_refuses_bad_tls_keys_and_quotas(bad: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    done = helm("template", "t", str(CHART), "-f", str(path), check=False)
    assert done.returncode != 0 and "values don't meet the specifications" in done.stderr
