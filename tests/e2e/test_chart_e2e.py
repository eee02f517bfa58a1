"""charts/warmfleet on a real API server (opt-in: `pytest tests/e2e --e2e` with KUBECONFIG
pointing at a disposable cluster, e.g. ../shared/k8s): `helm install` and `helm upgrade`
succeed and keep the generated admin token; the operator, run as a process with the
chart's ServiceAccount token (so with exactly the chart's RBAC), reconciles the chart's
WarmPromptSet into real daemons; a daemon started with `--register` and the chart's
registration ServiceAccount creates its WarmNode, which the operator then probes.

Nothing here needs a kubelet: the chart's Deployments are created but their pods need not
run; the operator and daemons run on this machine (127.0.0.1)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.cluster import ROOT, get, kubectl, run, service_account_kubeconfig, wait
from support.processes import Daemon, free_port, interrupt, start_daemon

pytestmark = pytest.mark.e2e
CHART = ROOT / "charts" / "warmfleet"
SYSTEM = "You are Quill, the docs team's writing assistant. " * 6


class Release:
    def __init__(self, tmp: Path) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.namespace = f"wf-chart-{suffix}"
        self.name = f"wfc-{suffix}"
        self.fullname = f"{self.name}-warmfleet"
        self.ports = [free_port(), free_port()]
        self.tmp = tmp
        self.values = tmp / "values.yaml"
        self.values.write_text(
            yaml.safe_dump(
                {
                    "operator": {"watchNamespaces": [self.namespace]},
                    "registration": {"enabled": True},
                    "nodes": [
                        {
                            "name": f"{self.name}-mac-{i}",
                            "url": f"http://127.0.0.1:{port}",
                            "labels": {"warmfleet.io/pool": self.name},
                        }
                        for i, port in enumerate(self.ports)
                    ],
                    "warmPromptSets": [
                        {
                            "name": "docs",
                            "spec": {
                                "nodeSelector": {"matchLabels": {"warmfleet.io/pool": self.name}},
                                "prompts": [
                                    {"name": "quill",
                                     "messages": [{"role": "system", "content": SYSTEM}]}
                                ],
                            },
                        }
                    ],
                }
            )
        )  # fmt: skip

    def helm(self, verb: str, *args: str) -> str:
        return run("helm", verb, self.name, str(CHART), "-n", self.namespace, *args)

    def token(self) -> str:
        secret = get("secret", f"{self.fullname}-admin-token", self.namespace)
        assert secret is not None
        return base64.b64decode(secret["data"]["token"]).decode()


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("--e2e needs KUBECONFIG to point at a disposable cluster")
    rel = Release(tmp_path_factory.mktemp("chart"))
    # CRDs someone already applied with kubectl (another suite on a shared cluster) are
    # theirs: Helm's server-side apply would conflict with their field manager.
    have_crds = get("crd", "warmnodes.warmfleet.io") and get("crd", "warmpromptsets.warmfleet.io")
    rel.helm("install", "-f", str(rel.values), "--create-namespace",
             *(["--skip-crds"] if have_crds else []))  # fmt: skip
    kubectl("wait", "--for=condition=Established", "crd/warmnodes.warmfleet.io",
            "crd/warmpromptsets.warmfleet.io")  # fmt: skip
    yield rel
    # WarmPromptSets and WarmNodes carry the operator's finalizers: the operator fixture
    # removes them before it stops; then the release and its namespace go.
    run("helm", "uninstall", rel.name, "-n", rel.namespace, "--wait=false", check=False)
    kubectl("delete", "namespace", rel.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def daemons(release: Release) -> Iterator[list[Daemon]]:
    token = release.tmp / "admin-token"
    token.write_text(release.token())
    started = [
        start_daemon("--model", "tiny-random", "--admin-token-file", str(token), port=port)
        for port in release.ports
    ]
    yield started
    for d in started:
        d.stop()


@pytest.fixture(scope="module")
def operator(release: Release, daemons: list[Daemon]) -> Iterator[Path]:
    """`warmfleet operator` with the chart's own arguments and ServiceAccount token."""
    kubeconfig = service_account_kubeconfig(
        release.tmp / "operator.kubeconfig", release.namespace, f"{release.fullname}-operator"
    )
    log = release.tmp / "operator.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "warmfleet_cli", "operator",
             f"--namespace={release.namespace}", "--resync-seconds=2", "--probe-seconds=2",
             "--liveness="],
            env={**os.environ, "KUBECONFIG": str(kubeconfig),
                 "WARMFLEET_OPERATOR_NAMESPACE": release.namespace},
            stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    yield log
    # Let it release its finalizers: delete what it manages while it still runs.
    kubectl("-n", release.namespace, "delete", "wps", "--all", "--timeout=60s", check=False)
    kubectl("delete", "wn", "-l", f"warmfleet.io/pool={release.name}", "--timeout=60s",
            check=False)  # fmt: skip
    interrupt(proc, timeout=60)


def test_helm_install_then_upgrade_keeps_the_admin_token(release: Release) -> None:
    status = json.loads(run("helm", "status", release.name, "-n", release.namespace, "-o", "json"))
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    nodes = [get("warmnode", f"{release.name}-mac-{i}") for i in range(2)]
    assert all(n is not None for n in nodes)
    assert get("warmpromptset", "docs", release.namespace) is not None
    token = release.token()
    assert len(token) == 48

    release.helm("upgrade", "-f", str(release.values), "--set", "operator.probeSeconds=10")
    status = json.loads(run("helm", "status", release.name, "-n", release.namespace, "-o", "json"))
    assert status["info"]["status"] == "deployed" and status["version"] == 2
    assert release.token() == token, "helm upgrade replaced the admin token"
    deployment = get("deployment", f"{release.fullname}-operator", release.namespace)
    assert deployment is not None
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--probe-seconds=10" in args


def test_the_chart_rbac_is_enough_and_no_more(release: Release) -> None:
    operator = f"system:serviceaccount:{release.namespace}:{release.fullname}-operator"
    register = f"system:serviceaccount:{release.namespace}:{release.fullname}-register"

    def can(who: str, *what: str) -> bool:
        out = kubectl("auth", "can-i", *what, f"--as={who}", check=False).strip()
        return out == "yes"

    ns = ["-n", release.namespace]
    assert can(operator, "watch", "warmpromptsets.warmfleet.io", *ns)
    assert can(operator, "patch", "warmnodes.warmfleet.io/status")
    assert can(operator, "get", "secrets", *ns)
    assert not can(operator, "get", "secrets", "-n", "kube-system")
    assert not can(operator, "watch", "warmpromptsets.warmfleet.io", "-n", "default")
    assert not can(operator, "delete", "warmnodes.warmfleet.io")
    assert can(register, "create", "warmnodes.warmfleet.io")
    assert can(register, "patch", "warmnodes.warmfleet.io")
    assert not can(register, "delete", "warmnodes.warmfleet.io")
    assert not can(register, "list", "warmnodes.warmfleet.io")
    assert not can(register, "get", "secrets", *ns)


def test_operator_with_the_charts_serviceaccount_warms_the_charts_set(
    release: Release, daemons: list[Daemon], operator: Path
) -> None:
    def ready() -> dict[str, Any] | None:
        wps = get("warmpromptset", "docs", release.namespace)
        for c in ((wps or {}).get("status") or {}).get("conditions") or []:
            if c["type"] == "Ready" and c["status"] == "True":
                return wps
        return None

    wait(ready, timeout=180, what=f"the chart's set Ready ({operator.read_text()[-2000:]})")
    for d in daemons:
        held = _warm_set(d.url, release)
        assert held is not None and held["warm"] == held["total"] == 1, held
    forbidden = [
        line[:400]
        for line in operator.read_text().splitlines()
        if "403" in line or "orbidden" in line
    ]
    assert not forbidden, "\n".join(forbidden)


def test_register_creates_a_warmnode_the_operator_probes(release: Release, operator: Path) -> None:
    kubeconfig = service_account_kubeconfig(
        release.tmp / "register.kubeconfig", release.namespace, f"{release.fullname}-register"
    )
    token = release.tmp / "admin-token"
    port = free_port()
    name = f"{release.name}-joiner"
    daemon = start_daemon(
        "--model", "tiny-random", "--admin-token-file", str(token), "--register", name,
        "--advertise-url", f"http://127.0.0.1:{port}",
        "--labels", f"warmfleet.io/pool={release.name}",
        "--admin-token-secret", f"{release.namespace}/{release.fullname}-admin-token",
        "--kubeconfig", str(kubeconfig), port=port,
    )  # fmt: skip
    try:

        def probed() -> dict[str, Any] | None:
            node = get("warmnode", name)
            return node if ((node or {}).get("status") or {}).get("reachable") is True else None

        node = wait(probed, timeout=120, what="the registered WarmNode probed")
        assert node["spec"]["url"] == f"http://127.0.0.1:{port}"
        assert node["metadata"]["annotations"]["warmfleet.io/model"] == "tiny-random"
        # It joined the pool, so the chart's set is pushed to it too.
        wait(
            lambda: (_warm_set(daemon.url, release) or {}).get("warm") == 1,
            timeout=120,
            what="the set pushed to the registered daemon",
        )
    finally:
        daemon.stop()


def _warm_set(url: str, release: Release) -> dict[str, Any] | None:
    """The chart's set as the daemon holds it (its admin route, with the chart's token)."""
    r = httpx.get(
        f"{url}/v1/warm-sets/{release.namespace}/docs",
        headers={"Authorization": f"Bearer {release.token()}"},
        timeout=10,
    )
    return dict(r.json()) if r.status_code == 200 else None
