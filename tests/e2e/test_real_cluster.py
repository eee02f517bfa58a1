"""The operator against a real Kubernetes API server (opt-in: `pytest --e2e`, with
KUBECONFIG pointing at a disposable control plane such as ../shared/k8s's, kind or k3d;
it needs cluster-admin to install the CRDs and RBAC).

The operator runs on this machine (`warmfleet operator`) as the ServiceAccount the
shipped RBAC (deploy/rbac/namespaced) binds, with a token from `kubectl create token`;
the daemons run here too, on 127.0.0.1, so no image or network set-up is needed. The
tests run in file order, each building on the fleet the previous one left. Measured
times are printed as `e2e timing:` lines. See docs/E2E.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.agents import claude_code, codex
from support.cluster import (
    ROOT,
    apply,
    get,
    kubectl,
    operator_rbac,
    service_account_kubeconfig,
    tool,
    wait,
)
from support.processes import Daemon, interrupt, start_daemon
from warmfleet_common.agent_apis.prefix import warm_prompt

pytestmark = pytest.mark.e2e
TOKEN = "e2e-admin-token-" + uuid.uuid4().hex
SYSTEM = "You are the e2e assistant. " * 10


Record = Callable[[str, object], None]


def report(record: Record, what: str, seconds: float) -> None:
    """A measured time, printed at the end of the run (tests/e2e/conftest.py)."""
    record(f"e2e timing: {what}", f"{seconds:.1f} s")


def refused(doc: dict[str, Any]) -> str:
    """kubectl apply's error for a document the API server refuses."""
    done = subprocess.run(
        [tool("kubectl"), "apply", "-f", "-"],
        input=json.dumps(doc), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    return done.stderr


def condition(obj: dict[str, Any] | None, kind: str = "Ready") -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def held(daemon: Daemon, namespace: str, name: str) -> dict[str, Any] | None:
    """The set as the daemon holds it (None: it does not)."""
    try:
        r = httpx.get(
            f"{daemon.url}/v1/warm-sets/{namespace}/{name}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=5,
        )
    except httpx.HTTPError:
        return None
    return dict(r.json()) if r.status_code == 200 else None


def all_warm(daemon: Daemon, namespace: str, name: str) -> bool:
    found = held(daemon, namespace, name)
    return bool(found) and found["warm"] == found["total"]  # type: ignore[index]


class Fleet:
    """The state the tests share: namespace, daemons, the operator process."""

    def __init__(self, namespace: str, workdir: Path) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.token_file = workdir / "admin-token"
        self.token_file.write_text(TOKEN)
        self.daemons: dict[str, Daemon] = {}
        self.state_dirs: dict[str, str] = {}
        self.operator: subprocess.Popen[bytes] | None = None
        self.operator_log = workdir / "operator.log"
        self.kubeconfig = workdir / "kubeconfig-sa"

    def start_daemon(self, name: str, port: int | None = None, state: bool = False) -> Daemon:
        args = ["--model", "tiny-random", "--admin-token-file", str(self.token_file)]
        if state:
            self.state_dirs.setdefault(name, tempfile.mkdtemp(prefix=f"e2e-{name}-"))
        if name in self.state_dirs:
            args += ["--state-dir", self.state_dirs[name]]
        daemon = start_daemon(*args, port=port)
        self.daemons[name] = daemon
        return daemon

    def node(self, name: str, pool: str | None = None) -> dict[str, Any]:
        labels = {"warmfleet.io/e2e": self.namespace, "warmfleet.io/pool": pool or self.namespace}
        return {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {"name": f"{self.namespace}-{name}", "labels": labels},
            "spec": {
                "url": self.daemons[name].url,
                # no namespace: the operator's own (its kubeconfig context's)
                "adminTokenSecretRef": {"name": "daemon-token", "key": "token"},
            },
        }

    def start_operator(self) -> None:
        log = open(self.operator_log, "ab")  # noqa: SIM115 (the child holds it)
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "warmfleet_cli",
                "operator",
                "--namespace",
                self.namespace,
                "--liveness",
                "",
            ],
            stdout=log,  # a file: a pipe nobody reads blocks the operator once full
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"},
        )
        log.close()

    def stop_operator(self) -> None:
        if self.operator is not None:
            interrupt(self.operator)
        self.operator = None

    def log(self) -> str:
        return self.operator_log.read_text(errors="replace") if self.operator_log.exists() else ""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("--e2e needs KUBECONFIG to point at a disposable cluster")
    kubectl("apply", "-f", str(ROOT / "crds"))
    kubectl(
        "wait",
        "--for=condition=Established",
        "crd/warmpromptsets.warmfleet.io",
        "crd/warmnodes.warmfleet.io",
    )
    namespace = f"warmfleet-e2e-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", namespace)
    fleet = Fleet(namespace, tmp_path_factory.mktemp("e2e"))
    try:
        apply(*operator_rbac(namespace))
        kubectl(
            "create", "secret", "generic", "daemon-token", "-n", namespace,
            f"--from-literal=token={TOKEN}",
        )  # fmt: skip
        service_account_kubeconfig(fleet.kubeconfig, namespace, "warmfleet-operator", "2h")
        fleet.start_daemon("a")
        fleet.start_daemon("b", state=True)
        fleet.start_operator()
        yield fleet
    finally:
        teardown(fleet)


def teardown(fleet: Fleet) -> None:
    """Never hangs: WarmNodes carry no finalizer; sets are deleted while the operator
    runs, and whatever is left is released by hand before the namespace goes."""
    ns = fleet.namespace
    kubectl("delete", "warmnodes", "-l", f"warmfleet.io/e2e={ns}", "--timeout=30s", check=False)
    if fleet.operator is not None:
        kubectl("delete", "wps", "--all", "-n", ns, "--timeout=60s", check=False)
    fleet.stop_operator()
    for name in kubectl("get", "wps", "-n", ns, "-o", "name", check=False).split():
        kubectl(
            "patch", name, "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
            check=False,
        )  # fmt: skip
    kubectl("delete", "namespace", ns, "--wait=false", check=False)
    kubectl("delete", "clusterrolebinding", f"warmfleet-operator-cluster-scoped-{ns}", check=False)
    for daemon in fleet.daemons.values():
        daemon.stop()
    print(f"e2e: operator log at {fleet.operator_log}", file=sys.__stderr__)


def wps(fleet: Fleet, name: str, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": name, "namespace": fleet.namespace},
        "spec": {
            "nodeSelector": {"matchLabels": {"warmfleet.io/pool": fleet.namespace}},
            "prompts": prompts,
        },
    }


def ready(fleet: Fleet, name: str, warm: str | None = None, timeout: float = 120) -> Any:
    def check() -> Any:
        obj = get("wps", name, fleet.namespace)
        ok = condition(obj).get("status") == "True" and obj["metadata"]["generation"] == (
            obj["status"].get("observedGeneration")
        )
        if ok and warm is not None:
            ok = obj["status"]["warmNodes"] == warm
        return obj if ok else None

    return wait(check, timeout, what=f"{name} Ready ({warm or 'any'})")


AGENTS = [
    {"name": "a", "messages": [{"role": "system", "content": SYSTEM}]},
    {"name": "b", "messages": [{"role": "system", "content": "Be brief."}]},
]


def test_apply_is_ready_as_soon_as_the_nodes_are_warm(
    fleet: Fleet, record_property: Record
) -> None:
    record = record_property
    apply(fleet.node("a"), fleet.node("b"))
    t0 = time.monotonic()
    apply(wps(fleet, "agents", AGENTS))
    both = wait(
        lambda: all(all_warm(d, fleet.namespace, "agents") for d in fleet.daemons.values()),
        what="both daemons warm",
    )
    warm_at = time.monotonic()
    obj = ready(fleet, "agents", "2/2")
    report(record, "apply -> every daemon warm", warm_at - t0)
    report(record, "apply -> Ready=True", time.monotonic() - t0)
    report(record, "last daemon warm -> Ready=True", time.monotonic() - warm_at)
    assert both and obj["status"]["warmNodes"] == "2/2"
    assert not any("error" in n for n in obj["status"]["nodes"])
    # printer columns: REASON only with -o wide
    assert "AllWarm" not in kubectl("get", "wps", "agents", "-n", fleet.namespace)
    wide = kubectl("get", "wps", "agents", "-n", fleet.namespace, "-o", "wide")
    assert "True" in wide and "2/2" in wide and "AllWarm" in wide
    # the WarmNode status, with the token read from the operator's own namespace
    node = wait(
        lambda: (
            (n := get("warmnode", f"{fleet.namespace}-a"))
            and "status" in n
            and f"{fleet.namespace}/agents" in n["status"].get("warmSets", [])
            and n
        ),
        what="WarmNode status",
    )
    assert node["status"]["reachable"] is True and node["status"]["model"] == "tiny-random"
    assert condition(node, "Authorized")["status"] == "True"
    assert not node["metadata"].get("finalizers")  # deleting a WarmNode never waits
    # kopf keeps a digest, not a copy of the spec, in the annotations
    annotations = get("wps", "agents", fleet.namespace)["metadata"]["annotations"]
    assert len(json.dumps({k: v for k, v in annotations.items() if "kubectl" not in k})) < 1024


def test_a_prompt_edit_rewarms_only_that_prompt(fleet: Fleet, record_property: Record) -> None:
    record = record_property
    daemon = fleet.daemons["a"]
    before = {p["name"]: p for p in held(daemon, fleet.namespace, "agents")["prompts"]}  # type: ignore[index]
    edited = [AGENTS[0], {"name": "b", "messages": [{"role": "system", "content": "Be terse."}]}]
    t0 = time.monotonic()
    apply(wps(fleet, "agents", edited))

    def rewarmed() -> bool:
        now = {p["name"]: p for p in (held(daemon, fleet.namespace, "agents") or {})["prompts"]}
        b = now["b"]
        return b["content_hash"] != before["b"]["content_hash"] and b["state"] == "warm"

    wait(rewarmed, what="the edited prompt re-warmed")
    ready(fleet, "agents", "2/2")
    report(record, "prompt edit -> Ready=True (generation 2)", time.monotonic() - t0)
    after = {p["name"]: p for p in held(daemon, fleet.namespace, "agents")["prompts"]}  # type: ignore[index]
    assert after["a"]["warmed_at"] == before["a"]["warmed_at"]


def _restart(fleet: Fleet, name: str) -> float:
    """SIGKILL a daemon and start it on the same port; returns when it listens again."""
    daemon = fleet.daemons[name]
    port = int(daemon.url.rsplit(":", 1)[1])
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()
    fleet.start_daemon(name, port=port)
    return time.monotonic()


def test_a_daemon_restarted_without_its_state_is_pushed_again(
    fleet: Fleet, record_property: Record
) -> None:
    record = record_property
    up = _restart(fleet, "a")  # no --state-dir: it comes back empty
    daemon = fleet.daemons["a"]
    wait(lambda: held(daemon, fleet.namespace, "agents"), 30, what="re-push")
    report(record, "restart (no state dir) -> set pushed again", time.monotonic() - up)
    wait(lambda: all_warm(daemon, fleet.namespace, "agents"), what="re-warm")
    ready(fleet, "agents", "2/2")
    report(record, "restart (no state dir) -> Ready=True again", time.monotonic() - up)


def test_a_daemon_restarted_with_its_state_rewarms_by_itself(
    fleet: Fleet, record_property: Record
) -> None:
    record = record_property
    up = _restart(fleet, "b")  # --state-dir: it restores the set and re-warms it
    daemon = fleet.daemons["b"]
    wait(lambda: all_warm(daemon, fleet.namespace, "agents"), 30, what="restored")
    ready(fleet, "agents", "2/2")
    report(record, "restart (state dir) -> Ready=True again", time.monotonic() - up)


def test_relabelling_and_deleting_a_warm_node_unpins_its_daemon(
    fleet: Fleet, record_property: Record
) -> None:
    record = record_property
    ns, a = fleet.namespace, fleet.daemons["a"]
    t0 = time.monotonic()
    apply(fleet.node("a", pool="elsewhere"))
    wait(lambda: held(a, ns, "agents") is None, 30, what="removed after relabel")
    report(record, "relabel out of the pool -> set removed", time.monotonic() - t0)
    ready(fleet, "agents", "1/1")
    apply(fleet.node("a"))
    wait(lambda: all_warm(a, ns, "agents"), 30, what="pushed again after relabel")
    ready(fleet, "agents", "2/2")

    t0 = time.monotonic()
    kubectl("delete", "warmnode", f"{ns}-a", "--timeout=30s")
    wait(lambda: held(a, ns, "agents") is None, 30, what="removed after WarmNode delete")
    report(record, "WarmNode delete -> set removed from its daemon", time.monotonic() - t0)
    obj = ready(fleet, "agents", "1/1")
    assert [n["node"] for n in obj["status"]["nodes"]] == [f"{ns}-b"]
    apply(fleet.node("a"))
    ready(fleet, "agents", "2/2")


def test_a_150kb_spec_is_handled_and_deleted(fleet: Fleet, record_property: Record) -> None:
    record = record_property
    # 40 distinct prompts of ~3,750 characters: 150 KB, each within the tiny model's context.
    prompts = [
        {
            "name": f"doc-{i}",
            "messages": [
                {"role": "system", "content": f"Document {i}. " + "Background facts. " * 207}
            ],
        }
        for i in range(40)
    ]
    body = wps(fleet, "big", prompts)
    assert len(json.dumps(body)) > 150_000
    t0 = time.monotonic()
    apply(body)  # client-side: kubectl's own annotation holds a copy, kopf's only a digest
    ready(fleet, "big", "2/2", timeout=300)
    report(record, "150 KB spec (40 prompts) apply -> Ready=True", time.monotonic() - t0)
    kubectl("delete", "wps", "big", "-n", fleet.namespace, "--timeout=60s")
    for daemon in fleet.daemons.values():
        assert held(daemon, fleet.namespace, "big") is None


def test_captured_agent_prompts_warm_what_the_agents_send(fleet: Fleet) -> None:
    """Claude Code's captured prompt inline (`anthropic`), Codex's from a ConfigMap
    (`responsesFrom`): the API server takes them (schema and CEL rules), the operator
    passes them through, and the agents' next sessions find them cached."""
    ns = fleet.namespace
    claude = warm_prompt("anthropic", claude_code().body, "claude-code")
    codex_prompt = warm_prompt("responses", codex().body, "codex")
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "codex-prompt", "namespace": ns},
        "data": {
            "responses.json": json.dumps(codex_prompt.model_dump(exclude_none=True)["responses"])
        },
    }
    prompts = [
        claude.model_dump(mode="json", exclude_none=True),
        {
            "name": "codex",
            "responsesFrom": {"configMapKeyRef": {"name": "codex-prompt", "key": "responses.json"}},
        },
    ]
    apply(config, wps(fleet, "coding", prompts), server_side=True)
    ready(fleet, "coding", "2/2")
    a = fleet.daemons["a"]
    held_tokens = {p["name"]: p["tokens"] for p in held(a, ns, "coding")["prompts"]}  # type: ignore[index]

    live = claude_code("Find the flaky test under ci/.", model="default")
    r = httpx.post(
        f"{a.url}{live.path}", json={**live.body, "stream": False, "max_tokens": 1},
        headers=live.headers, timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["cache_read_input_tokens"] == held_tokens["claude-code"]
    live = codex("Find the flaky test under ci/.", model="default")
    r = httpx.post(
        f"{a.url}{live.path}", json={**live.body, "stream": False, "max_output_tokens": 1},
        headers=live.headers, timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens_details"]["cached_tokens"] == held_tokens["codex"]

    # The API server's CEL rules: one shape per prompt; a namespace lists its tools.
    both = {**prompts[0], "messages": [{"role": "system", "content": "x"}]}
    assert "set exactly one of messages" in refused(wps(fleet, "bad", [both]))
    bare = {"name": "n", "responses": {"tools": [{"type": "namespace", "name": "ns"}]}}
    assert "a namespace tool lists its tools" in refused(wps(fleet, "bad", [bare]))
    assert get("wps", "bad", ns) is None
    kubectl("delete", "wps", "coding", "-n", ns, "--timeout=60s")


def test_an_unreachable_node_degrades_the_set_and_its_status_holds_nothing_stale(
    fleet: Fleet,
) -> None:
    ns, a = fleet.namespace, fleet.daemons["a"]
    port = int(a.url.rsplit(":", 1)[1])
    a.stop()

    def degraded() -> Any:
        obj = get("wps", "agents", ns)
        return obj if condition(obj).get("reason") == "NodesUnreachable" else None

    wait(degraded, 30, what="Degraded")
    node = get("warmnode", f"{ns}-a")
    assert node is not None and node["status"]["reachable"] is False
    assert not {"model", "warmSets", "hitRate", "instanceId"} & set(node["status"])
    fleet.start_daemon("a", port=port)
    ready(fleet, "agents", "2/2")


def test_the_operator_stopped_during_a_delete(fleet: Fleet) -> None:
    ns = fleet.namespace
    fleet.stop_operator()
    kubectl("delete", "wps", "agents", "-n", ns, "--wait=false")
    time.sleep(2)
    pending = get("wps", "agents", ns)
    assert pending is not None and pending["metadata"].get("deletionTimestamp")
    assert held(fleet.daemons["a"], ns, "agents") is not None  # nobody has unpinned it yet
    # WarmNodes have no finalizer: deleting one does not wait for the operator
    apply({**fleet.node("b", pool="gone"), "metadata": {"name": f"{ns}-spare", "labels": {}}})
    kubectl("delete", "warmnode", f"{ns}-spare", "--timeout=20s")
    fleet.start_operator()
    wait(lambda: get("wps", "agents", ns) is None, 60, what="the delete to finish")
    for daemon in fleet.daemons.values():
        assert held(daemon, ns, "agents") is None


def test_the_service_account_needed_nothing_more(fleet: Fleet) -> None:
    log = fleet.log()
    assert "Forbidden" not in log and " 403" not in log, log[-4000:]
    assert "inconsistencies" not in log, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
