"""A shared fleet against a real Kubernetes API server (opt-in: `pytest --e2e`, with
KUBECONFIG pointing at a disposable control plane; see docs/E2E.md): TLS on every hop and
client keys on, as issue 37's fleet runs.

Two tiny-random daemons on 127.0.0.1 serve HTTPS from a throwaway CA, require a client
certificate on their admin, warm-set and peer routes and client keys on inference;
their WarmNodes name https URLs. `warmfleet operator` (verifying with the CA, presenting
its client certificate) pushes a fleet-wide WarmPromptSet and one scoped to a tenant
(the API server keeps the `tenants` field and refuses a bad tenant name); `warmfleet
router --from-cluster` serves HTTPS with the keys file, verifies the daemons and follows
their cache events over mTLS. Through it, the `openai` SDK with each tenant's key: the
fleet-wide prompt is cached for both tenants, the scoped one only for its tenant, and no
request is answered without a key.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from support.cluster import ROOT, apply, get, kubectl, wait
from support.processes import Daemon, interrupt, start_daemon, start_router
from warmfleet_cli.local_ca import CertFiles, make_local_ca

pytestmark = pytest.mark.e2e
TOKEN = "e2e-shared-token-" + uuid.uuid4().hex
KEYS = {
    "team-a": "sk-e2e-team-a-" + uuid.uuid4().hex,
    "team-b": "sk-e2e-team-b-" + uuid.uuid4().hex,
}
SHARED = {"role": "system", "content": "You are the fleet's shared reviewer. " * 10}
SCOPED = {"role": "system", "content": "You are team A's private release bot. " * 10}


class SharedFleet:
    def __init__(self, namespace: str, workdir: Path, certs: CertFiles) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.certs = certs
        self.daemons: dict[str, Daemon] = {}
        self.operator: subprocess.Popen[bytes] | None = None
        self.router: Daemon | None = None

    def tls(self, *, client_ca: bool) -> list[str]:
        c = self.certs
        args = ["--tls-cert", str(c.cert), "--tls-key", str(c.key), "--tls-ca", str(c.ca)]
        return args + (["--tls-client-ca", str(c.ca)] if client_ca else [])

    def warm_set(self, name: str, system: dict[str, str], **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmPromptSet",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "nodeSelector": {"matchLabels": {"warmfleet.io/e2e": self.namespace}},
                "prompts": [{"name": name, "messages": [system]}],
                **spec,
            },
        }

    def ready(self, name: str) -> bool:
        found = get("warmpromptset", name, self.namespace) or {}
        conditions = (found.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedFleet]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("--e2e needs KUBECONFIG to point at a disposable cluster")
    kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("warmnodes", "warmpromptsets"):
        kubectl("wait", "--for=condition=Established", f"crd/{crd}.warmfleet.io")
    namespace = f"warmfleet-e2e-shared-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", namespace)
    workdir = tmp_path_factory.mktemp("e2e-shared")
    certs = make_local_ca(workdir / "tls")
    (workdir / "admin-token").write_text(TOKEN)
    (workdir / "api-keys").write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    fleet = SharedFleet(namespace, workdir, certs)
    keys = ["--api-keys-file", str(workdir / "api-keys")]
    try:
        for name in ("a", "b"):
            fleet.daemons[name] = start_daemon(
                "--model", "tiny-random", "--block-size", "32",
                "--admin-token-file", str(workdir / "admin-token"),
                *fleet.tls(client_ca=True), *keys,
            )  # fmt: skip
        kubectl(
            "create", "secret", "generic", "daemon-token", "-n", namespace,
            f"--from-literal=token={TOKEN}",
        )  # fmt: skip
        apply(
            *(
                {
                    "apiVersion": "warmfleet.io/v1alpha1",
                    "kind": "WarmNode",
                    "metadata": {
                        "name": f"{namespace}-{name}",
                        "labels": {"warmfleet.io/e2e": namespace},
                    },
                    "spec": {
                        "url": daemon.url,  # https://127.0.0.1:PORT
                        "adminTokenSecretRef": {"name": "daemon-token", "key": "token"},
                    },
                }
                for name, daemon in fleet.daemons.items()
            )
        )
        log = open(workdir / "operator.log", "ab")  # noqa: SIM115 (the child holds it)
        c = certs
        fleet.operator = subprocess.Popen(
            [
                sys.executable, "-m", "warmfleet_cli", "operator", "--namespace", namespace,
                "--operator-namespace", namespace, "--liveness", "",
                "--tls-ca", str(c.ca), "--tls-cert", str(c.cert), "--tls-key", str(c.key),
            ],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        log.close()
        # Its own admin token: with client keys its status detail answers only to that.
        (workdir / "router-token").write_text(TOKEN)
        fleet.router = start_router(
            "--from-cluster", "--namespace", namespace, "--health-interval", "0.5",
            "--admin-token-file", str(workdir / "router-token"),
            *fleet.tls(client_ca=False), *keys,
        )  # fmt: skip
        yield fleet
    finally:
        if fleet.router is not None:
            fleet.router.stop()
        if fleet.operator is not None:
            interrupt(fleet.operator)
            print(f"e2e: operator log at {workdir / 'operator.log'}")
        kubectl("delete", "warmpromptsets", "--all", "-n", namespace, "--wait=false", check=False)
        kubectl("delete", "warmnodes", "-l", f"warmfleet.io/e2e={namespace}", check=False)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for daemon in fleet.daemons.values():
            daemon.stop()


def test_the_api_server_keeps_tenants_and_refuses_bad_ones(fleet: SharedFleet) -> None:
    apply(fleet.warm_set("scoped", SCOPED, tenants=["team-a"]))
    kept = get("warmpromptset", "scoped", fleet.namespace)
    assert kept is not None and kept["spec"]["tenants"] == ["team-a"]  # not pruned
    bad = fleet.warm_set("bad", SCOPED, tenants=["not a tenant"])
    out = kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert get("warmpromptset", "bad", fleet.namespace) is None, out


def test_tenants_hit_what_they_may_over_tls(fleet: SharedFleet) -> None:
    apply(fleet.warm_set("shared", SHARED))
    wait(lambda: fleet.ready("shared") and fleet.ready("scoped"), 180, "both sets Ready")
    assert fleet.router is not None
    router = fleet.router
    status = httpx.get(
        f"{router.url}/v1/router/status",
        headers={"Authorization": f"Bearer {TOKEN}"},
        verify=router.verify,
    ).json()
    mine = [b for b in status["backends"] if b["name"].startswith(fleet.namespace)]
    assert len(mine) == 2 and all(b["url"].startswith("https://") for b in mine)
    # The router reads the warm sets every 10 s: what each daemon shares with every tenant.
    deadline = time.monotonic() + 30
    while not all(len(b["warm_sets"]) == 2 for b in mine):
        assert time.monotonic() < deadline, mine
        time.sleep(1)
        status = httpx.get(
            f"{router.url}/v1/router/status",
            headers={"Authorization": f"Bearer {TOKEN}"},
            verify=router.verify,
        ).json()
        mine = [b for b in status["backends"] if b["name"].startswith(fleet.namespace)]

    def cached(tenant: str, system: dict[str, str]) -> int:
        http = httpx.Client(verify=router.verify)
        client = openai.OpenAI(
            base_url=f"{router.url}/v1", api_key=KEYS[tenant], max_retries=0, http_client=http
        )
        question = {"role": "user", "content": f"Is the release ready? {uuid.uuid4().hex}"}
        r = client.chat.completions.create(
            model="tiny-random",
            messages=[system, question],  # type: ignore[list-item]
            max_tokens=2,
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    for tenant in KEYS:
        assert cached(tenant, SHARED) > 50  # fleet-wide: shared by every tenant
    assert cached("team-a", SCOPED) > 50
    assert cached("team-b", SCOPED) < 10  # another tenant: at most the template's header
    anonymous = httpx.get(f"{router.url}/v1/models", verify=router.verify)
    assert anonymous.status_code == 401
    for daemon in fleet.daemons.values():
        assert httpx.get(f"{daemon.url}/v1/models", verify=daemon.verify).status_code == 401
    ctx = ssl.create_default_context(cafile=str(fleet.certs.ca))
    r = httpx.get(
        f"{fleet.daemons['a'].url}/v1/warm-sets",
        headers={"Authorization": f"Bearer {TOKEN}"},
        verify=ctx,
    )
    assert r.status_code == 403  # no client certificate: the operator's and router's only
