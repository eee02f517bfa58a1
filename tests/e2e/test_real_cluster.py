"""The operator against a real Kubernetes cluster (opt-in: `pytest --e2e`, with
KUBECONFIG pointing at a disposable cluster such as kind or k3d).

The operator runs on this machine (`warmfleet operator`, as during development) and
the daemons too, on 127.0.0.1, so no image or network set-up is needed: the cluster
only stores the resources. See docs/E2E.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemons import Daemon, free_port, start_daemon

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def kubectl_binary() -> str:
    local = ROOT / ".tools" / "bin" / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    if not found:
        pytest.fail("the e2e suite needs kubectl (make test installs it to .tools/bin)")
    return found


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(
        [kubectl_binary(), *args], input=stdin, capture_output=True, text=True, timeout=120
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("--e2e needs KUBECONFIG to point at a disposable cluster")
    kubectl("apply", "-f", str(ROOT / "crds"))
    kubectl(
        "wait",
        "--for=condition=Established",
        "crd/warmpromptsets.warmfleet.io",
        "crd/warmnodes.warmfleet.io",
    )
    name = f"warmfleet-e2e-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
    kubectl("delete", "warmnodes", "-l", f"warmfleet.io/e2e={name}", check=False)


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[Daemon]]:
    started = [start_daemon("--model", "tiny-random") for _ in range(2)]
    yield started
    for d in started:
        d.stop()


@pytest.fixture(scope="module")
def operator(namespace: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warmfleet_daemon.cli",
            "operator",
            "--namespace",
            namespace,
            "--resync-seconds",
            "2",
            "--probe-seconds",
            "2",
            "--liveness",
            "",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield proc
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def apply(doc: dict[str, Any]) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps(doc))


def get(kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
    out = kubectl(*args, check=False)
    return json.loads(out) if out else None


def wait(check: Any, timeout: float = 120, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def ready_condition(obj: dict[str, Any] | None) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return dict(c)
    return {}


def test_the_operator_on_a_real_cluster(
    namespace: str, daemons: list[Daemon], operator: Any
) -> None:
    pool = {"warmfleet.io/pool": namespace, "warmfleet.io/e2e": namespace}
    for i, d in enumerate(daemons):
        apply(
            {
                "apiVersion": "warmfleet.io/v1alpha1",
                "kind": "WarmNode",
                "metadata": {"name": f"{namespace}-{i}", "labels": pool},
                "spec": {"url": d.url},
            }
        )
    system = "You are the e2e assistant. " * 10
    wps = {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": "agents", "namespace": namespace},
        "spec": {
            "nodeSelector": {"matchLabels": {"warmfleet.io/pool": namespace}},
            "prompts": [
                {"name": "a", "messages": [{"role": "system", "content": system}]},
                {"name": "b", "messages": [{"role": "system", "content": "Be brief."}]},
            ],
        },
    }
    apply(wps)
    obj = wait(
        lambda: (
            (o := get("wps", "agents", namespace))
            and ready_condition(o).get("status") == "True"
            and o
        ),
        what="Ready",
    )
    assert obj["status"]["warmNodes"] == "2/2"
    printed = kubectl("get", "wps", "-n", namespace)
    assert "True" in printed and "2/2" in printed

    # edit one prompt: only it re-warms
    before = {
        p["name"]: p
        for p in httpx.get(f"{daemons[0].url}/v1/warm-sets/{namespace}/agents").json()["prompts"]
    }
    wps["spec"]["prompts"][1]["messages"][0]["content"] = "Be very brief."
    apply(wps)

    def rewarmed() -> bool:
        now = {
            p["name"]: p
            for p in httpx.get(f"{daemons[0].url}/v1/warm-sets/{namespace}/agents").json()[
                "prompts"
            ]
        }
        return (
            now["b"]["content_hash"] != before["b"]["content_hash"] and now["b"]["state"] == "warm"
        )

    wait(rewarmed, what="re-warm of the edited prompt")
    after = {
        p["name"]: p
        for p in httpx.get(f"{daemons[0].url}/v1/warm-sets/{namespace}/agents").json()["prompts"]
    }
    assert after["a"]["warmed_at"] == before["a"]["warmed_at"]

    # a restarted daemon is pushed again
    port = int(daemons[1].url.rsplit(":", 1)[1])
    daemons[1].process.send_signal(signal.SIGKILL)
    daemons[1].process.wait()
    daemons[1] = start_daemon("--model", "tiny-random", port=port)
    wait(
        lambda: httpx.get(f"{daemons[1].url}/v1/warm-sets/{namespace}/agents").status_code == 200,
        what="re-push after restart",
    )

    # an unreachable node degrades the set, and it recovers
    dead = free_port()
    apply(
        {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {"name": f"{namespace}-late", "labels": pool},
            "spec": {"url": f"http://127.0.0.1:{dead}"},
        }
    )
    wait(
        lambda: (
            ready_condition(get("wps", "agents", namespace)).get("reason") == "NodesUnreachable"
        ),
        what="Degraded",
    )
    late = start_daemon("--model", "tiny-random", port=dead)
    try:
        wait(
            lambda: ready_condition(get("wps", "agents", namespace)).get("status") == "True",
            what="recovered",
        )

        # delete: unpinned everywhere
        kubectl("delete", "wps", "agents", "-n", namespace, "--timeout=120s")
        for d in [*daemons, late]:
            assert httpx.get(f"{d.url}/v1/warm-sets/{namespace}/agents").status_code == 404
            assert httpx.get(f"{d.url}/v1/status").json()["cache"]["pinned_count"] == 0
    finally:
        late.stop()
