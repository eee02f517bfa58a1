"""Simulated Macs on a real Kubernetes API server (opt-in: `pytest --e2e` with KUBECONFIG,
see test_real_cluster.py): `warmfleet serve --engine sim --nodes N --register PREFIX`
registers a WarmNode for each simulated daemon, and the operator, running in cluster mode
as the shipped RBAC's ServiceAccount, makes a WarmPromptSet Ready on all of them.

WARMFLEET_E2E_SIM_NODES sets N (10; docs/PERFORMANCE.md's figure is 100). The times are
printed as `e2e timing:` lines: apply -> every node warm, and the last node's warm-up ->
Ready=True (issue 35's target: within 10 s at 100 nodes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.cluster import ROOT, apply, get, kubectl, operator_rbac, service_account_kubeconfig
from support.cluster import wait as wait_for
from support.processes import interrupt
from support.sim import consecutive_free_ports, write_profile

pytestmark = pytest.mark.e2e
NODES = int(os.environ.get("WARMFLEET_E2E_SIM_NODES", "10"))
TOKEN = "e2e-sim-token-" + uuid.uuid4().hex
# An agent's head: a 2,000-word system prompt (the simulated Mac prefills it in its time).
SYSTEM = "You are the platform team's coding agent. Follow the repository's rules. " * 200

Record = Callable[[str, object], None]


class SimFleet:
    def __init__(self, namespace: str, workdir: Path, port: int) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.operator: subprocess.Popen[bytes] | None = None

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.port + i}" for i in range(NODES)]

    def names(self) -> list[str]:
        return [f"{self.namespace}-{i}" for i in range(1, NODES + 1)]


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("--e2e needs KUBECONFIG to point at a disposable cluster")
    kubectl("apply", "-f", str(ROOT / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/warmpromptsets.warmfleet.io",
            "crd/warmnodes.warmfleet.io")  # fmt: skip
    namespace = f"warmfleet-sim-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", namespace)
    workdir = tmp_path_factory.mktemp("e2e-sim")
    fleet = SimFleet(namespace, workdir, consecutive_free_ports(NODES))
    try:
        apply(*operator_rbac(namespace))
        kubectl("create", "secret", "generic", "daemon-token", "-n", namespace,
                f"--from-literal=token={TOKEN}")  # fmt: skip
        profile = write_profile(workdir / "mac.json", context_length=32768)
        log = (workdir / "sim.log").open("ab")
        fleet.process = subprocess.Popen(
            [
                sys.executable, "-m", "warmfleet_cli", "serve", "--engine", "sim",
                "--profile", str(profile), "--sim-speed", "10", "--nodes", str(NODES),
                "--port", str(fleet.port), "--register", namespace,
                "--advertise-url", "http://127.0.0.1:{port}",
                "--labels", f"warmfleet.io/pool={namespace}",
                "--admin-token-secret", f"{namespace}/daemon-token:token",
                "--cache-memory-mb", "4096", "--log-level", "warning",
            ],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "WARMFLEET_ADMIN_TOKEN": TOKEN},
        )  # fmt: skip
        kubeconfig = service_account_kubeconfig(
            workdir / "kubeconfig-sa", namespace, "warmfleet-operator", "2h"
        )
        operator_log = (workdir / "operator.log").open("ab")
        fleet.operator = subprocess.Popen(
            [sys.executable, "-m", "warmfleet_cli", "operator", "--namespace", namespace,
             "--liveness", ""],
            stdout=operator_log, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        yield fleet
    finally:
        kubectl("delete", "wps", "--all", "-n", namespace, "--timeout=60s", check=False)
        for process in (fleet.operator, fleet.process):
            if process is not None:
                interrupt(process)
        kubectl("delete", "warmnodes", "-l", f"warmfleet.io/pool={namespace}", "--wait=false",
                check=False)  # fmt: skip
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        kubectl("delete", "clusterrolebinding",
                f"warmfleet-operator-cluster-scoped-{namespace}", check=False)  # fmt: skip
        print(f"e2e: logs in {workdir}", file=sys.__stderr__)


def _warmed_at(url: str, namespace: str) -> float | None:
    """When the node's last prompt of the set finished warming (its own clock)."""
    held = httpx.get(f"{url}/v1/warm-sets/{namespace}/agents",
                     headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)  # fmt: skip
    times = [p.get("warmed_at") for p in held.json()["prompts"]] if held.status_code == 200 else []
    return max(times) if times and None not in times else None


def _ready(namespace: str) -> dict[str, Any] | None:
    obj = get("wps", "agents", namespace)
    conditions = {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions", [])}
    return obj if conditions.get("Ready", {}).get("status") == "True" else None


def test_simulated_nodes_register_and_a_set_is_ready_on_all(
    sim_fleet: SimFleet, record_property: Record
) -> None:
    names = sim_fleet.names()

    def registered() -> bool:
        out = kubectl("get", "warmnodes", "-l", f"warmfleet.io/pool={sim_fleet.namespace}",
                      "-o", "name")  # fmt: skip
        return len(out.split()) == NODES

    wait_for(registered, 120, f"{NODES} WarmNodes registered")
    node = get("warmnode", names[-1])
    assert node is not None and node["spec"]["url"] == sim_fleet.urls()[-1]
    t_apply = time.time()
    apply({
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": "agents", "namespace": sim_fleet.namespace},
        "spec": {
            "nodeSelector": {"matchLabels": {"warmfleet.io/pool": sim_fleet.namespace}},
            "prompts": [{"name": "coder", "messages": [{"role": "system", "content": SYSTEM}]}],
        },
    })  # fmt: skip
    obj = wait_for(lambda: _ready(sim_fleet.namespace), 300, "agents Ready")
    ready_at = time.time()  # seen Ready (kubectl's poll: an upper bound)
    assert obj["status"]["warmNodes"] == f"{NODES}/{NODES}"
    warmed = [_warmed_at(url, sim_fleet.namespace) for url in sim_fleet.urls()]
    assert all(w is not None for w in warmed), warmed  # Ready means warm on every node
    last_warm = max(w for w in warmed if w is not None)
    assert last_warm <= ready_at
    record_property(f"e2e timing: {NODES} simulated nodes: apply -> every node warm",
                    f"{last_warm - t_apply:.1f} s")  # fmt: skip
    record_property(f"e2e timing: {NODES} simulated nodes: last node warm -> Ready=True",
                    f"{ready_at - last_warm:.1f} s")  # fmt: skip
