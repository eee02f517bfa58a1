"""`warmfleet router --from-cluster` against a real API server (opt-in: `pytest --e2e`
with KUBECONFIG pointing at a disposable control plane, see docs/E2E.md): WarmNodes
created, changed and deleted with kubectl reach the router's /v1/router/status within
about a second (it watches them), each with the admin token its Secret holds."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from support.cluster import ROOT, apply, kubectl, service_account_kubeconfig
from support.processes import Daemon, start_daemon, start_router

pytestmark = pytest.mark.e2e
TOKEN = "e2e-router-token-" + uuid.uuid4().hex


def report(record: Callable[[str, object], None], what: str, seconds: float) -> None:
    """A measured time, printed at the end of the run (tests/e2e/conftest.py)."""
    record(f"e2e timing: {what}", f"{seconds:.2f} s")


def router_rbac(namespace: str) -> list[dict[str, Any]]:
    """What the chart grants the router (charts/warmfleet/templates/router.yaml): WarmNodes
    get/list/watch cluster-wide, Secrets get in its namespace; nothing more."""
    subject = {"kind": "ServiceAccount", "name": "router", "namespace": namespace}
    rbac = "rbac.authorization.k8s.io"

    def role(kind: str, resource: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"{namespace}-router"}
        if kind == "Role":
            meta["namespace"] = namespace
        return {"apiVersion": f"{rbac}/v1", "kind": kind, "metadata": meta, "rules": [resource]}

    def binding(kind: str, role_kind: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"{namespace}-router"}
        if kind == "RoleBinding":
            meta["namespace"] = namespace
        return {
            "apiVersion": f"{rbac}/v1",
            "kind": kind,
            "metadata": meta,
            "roleRef": {"apiGroup": rbac, "kind": role_kind, "name": f"{namespace}-router"},
            "subjects": [subject],
        }

    nodes = {"apiGroups": ["warmfleet.io"], "resources": ["warmnodes"]}
    secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "router", "namespace": namespace},
        },
        role("ClusterRole", {**nodes, "verbs": ["get", "list", "watch"]}),
        binding("ClusterRoleBinding", "ClusterRole"),
        role("Role", secrets),
        binding("RoleBinding", "Role"),
    ]


class RouterFleet:
    def __init__(self, namespace: str, daemon: Daemon) -> None:
        self.namespace = namespace
        self.daemon = daemon
        self.router: Daemon | None = None

    def node(self, name: str, pool: str = "agents", secret: str = "daemon-token") -> dict[str, Any]:
        return {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {
                "name": f"{self.namespace}-{name}",
                "labels": {"warmfleet.io/e2e": self.namespace, "warmfleet.io/pool": pool},
            },
            "spec": {
                "url": self.daemon.url,
                "adminTokenSecretRef": {"name": secret, "key": "token"},
            },
        }

    def backends(self) -> dict[str, dict[str, Any]]:
        assert self.router is not None
        status = httpx.get(f"{self.router.url}/v1/router/status", timeout=5).json()
        prefix = f"{self.namespace}-"
        return {
            b["name"][len(prefix) :]: b for b in status["backends"] if b["name"].startswith(prefix)
        }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterFleet]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("--e2e needs KUBECONFIG to point at a disposable cluster")
    kubectl("apply", "-f", str(ROOT / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/warmnodes.warmfleet.io")
    namespace = f"warmfleet-e2e-router-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", namespace)
    workdir = tmp_path_factory.mktemp("e2e-router")
    token_file = workdir / "admin-token"
    token_file.write_text(TOKEN)
    daemon = start_daemon("--model", "tiny-random", "--admin-token-file", str(token_file))
    fleet = RouterFleet(namespace, daemon)
    try:
        kubectl(
            "create", "secret", "generic", "daemon-token", "-n", namespace,
            f"--from-literal=token={TOKEN}",
        )  # fmt: skip
        apply(fleet.node("a"), *router_rbac(namespace))
        kubeconfig = workdir / "kubeconfig-router"
        service_account_kubeconfig(kubeconfig, namespace, "router")
        with pytest.MonkeyPatch.context() as env:
            env.setenv("KUBECONFIG", str(kubeconfig))
            fleet.router = start_router(
                "--from-cluster", "--namespace", namespace, "--health-interval", "0.5"
            )
        yield fleet
    finally:
        if fleet.router is not None:
            fleet.router.stop()
            print(f"e2e: router log at {fleet.router.log_path}")
        kubectl("delete", "warmnodes", "-l", f"warmfleet.io/e2e={namespace}", check=False)
        kubectl("delete", "clusterrole,clusterrolebinding", f"{namespace}-router", check=False)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        daemon.stop()


def within(check: Callable[[], Any], timeout: float, what: str) -> float:
    """Seconds until `check()` is truthy (fails after `timeout`)."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < timeout:
        last = check()
        if last:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def test_router_follows_warmnodes_created_changed_and_deleted(
    fleet: RouterFleet, record_property: Callable[[str, object], None]
) -> None:
    within(lambda: fleet.backends()["a"]["index"]["mode"] == "following", 30.0, "a's cache events")

    apply(fleet.node("b"))
    seconds = within(lambda: "b" in fleet.backends(), 5.0, "node b in the router's status")
    report(record_property, "router sees a created WarmNode", seconds)
    # Its token came from the Secret: the cache events (an admin route) are followed.
    within(lambda: fleet.backends()["b"]["index"]["mode"] == "following", 10.0, "b's cache events")

    apply(fleet.node("b", pool="batch"))
    seconds = within(
        lambda: fleet.backends()["b"]["labels"].get("warmfleet.io/pool") == "batch",
        5.0,
        "b relabelled",
    )
    report(record_property, "router sees a relabelled WarmNode", seconds)

    # A node whose Secret does not exist is routed to without admin routes; the other
    # nodes keep theirs.
    apply(fleet.node("c", secret="no-such-secret"))
    within(lambda: "c" in fleet.backends(), 5.0, "node c")
    within(lambda: fleet.backends()["c"]["index"]["mode"] == "history", 10.0, "c without events")
    assert fleet.backends()["a"]["index"]["mode"] == "following"

    kubectl("delete", "warmnode", f"{fleet.namespace}-b")
    seconds = within(lambda: "b" not in fleet.backends(), 5.0, "node b gone from the router")
    report(record_property, "router drops a deleted WarmNode", seconds)
    assert set(fleet.backends()) == {"a", "c"}
    assert fleet.router is not None
    log = fleet.router.log()
    assert "403" not in log and "Forbidden" not in log and "Traceback" not in log, log
