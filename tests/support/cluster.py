"""A real Kubernetes cluster for the e2e suites ($KUBECONFIG's): its command-line tools,
objects applied and read, waits, and a kubeconfig that acts as one ServiceAccount."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """The path of the command-line tool `name` (kubectl, helm): the repository's
    .tools/bin first, then PATH; the test fails without it."""
    local = ROOT / ".tools" / "bin" / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"the e2e suite needs {name} (make test installs it to .tools/bin)")
    return found


def run(
    name: str,
    *args: str,
    stdin: str | None = None,
    check: bool = True,
    timeout: float = 180,
) -> str:
    """`name ARGS` (kubectl, helm) run to its end: its stdout; with `check`, an exit other
    than 0 fails the test with its stderr."""
    done = subprocess.run(
        [tool(name), *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)}: {done.stderr}")
    return done.stdout


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    """`kubectl ARGS` against $KUBECONFIG's cluster: its stdout."""
    return run("kubectl", *args, stdin=stdin, check=check)


def apply(*docs: dict[str, Any], server_side: bool = False) -> None:
    """`kubectl apply` of `docs` (server-side apply as the field manager `e2e`)."""
    extra = ["--server-side", "--field-manager=e2e"] if server_side else []
    body = "\n---\n".join(json.dumps(d) for d in docs)
    kubectl("apply", *extra, "-f", "-", stdin=body)


def get(kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    """The object as the API server holds it (None: there is no such object)."""
    args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
    out = kubectl(*args, check=False)
    return json.loads(out) if out else None


def wait(check: Callable[[], Any], timeout: float = 120, what: str = "condition") -> Any:
    """The first truthy `check()`, polled every 0.2 s; fails the test, with the last
    answer, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def service_account_kubeconfig(
    path: Path, namespace: str, service_account: str, duration: str = "1h"
) -> Path:
    """`path`, written as a kubeconfig for $KUBECONFIG's cluster that authenticates as
    `service_account` of `namespace` only (a token for `duration`), in that namespace."""
    admin = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json"))
    cluster = admin["clusters"][0]["cluster"]
    token = kubectl(
        "create", "token", service_account, "-n", namespace, "--duration", duration
    ).strip()
    user = service_account
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": user,
                "clusters": [{"name": "e2e", "cluster": cluster}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": user,
                        "context": {"cluster": "e2e", "user": user, "namespace": namespace},
                    }
                ],
            }
        )
    )
    return path


def operator_rbac(namespace: str) -> list[dict[str, Any]]:
    """deploy/rbac's ServiceAccount and namespaced variant, moved to `namespace`; the
    cluster-scoped binding gets a per-run name."""
    docs = [yaml.safe_load((ROOT / "deploy/rbac/serviceaccount.yaml").read_text())]
    for path in sorted((ROOT / "deploy/rbac/namespaced").glob("*.yaml")):
        docs.append(yaml.safe_load(path.read_text()))
    for doc in docs:
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        if doc["kind"] == "ClusterRoleBinding":
            doc["metadata"]["name"] += f"-{namespace}"
    return docs
