"""`warmfleet serve --register NAME`: the daemon creates or updates its own WarmNode
through the Kubernetes API (kmock's emulator here, a real API server in tests/e2e), never
touches anything else, and the operator then probes it like any other node."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from support.kubeemu import emulated, write_kubeconfig
from support.processes import free_port
from warmfleet_daemon.node.registration import (
    Registration,
    RegistrationError,
    SecretRef,
    parse_labels,
    parse_secret_ref,
    register,
)

API = "/apis/warmfleet.io/v1alpha1/warmnodes"


@pytest_asyncio.fixture
async def api(tmp_path: Path) -> Any:
    """The emulator alone (no operator), with a kubeconfig for it."""
    async with emulated(tmp_path) as found:
        yield found


def reg(**kw: Any) -> Registration:
    base: dict[str, Any] = {
        "name": "mac-mini-7",
        "url": "http://mac-mini-7.lan:8000",
        "labels": {"warmfleet.io/pool": "agents"},
        "model": "mlx-community/Qwen2.5-7B-Instruct-4bit",
        "memory_bytes": 64 << 30,
        "cache_budget_bytes": 16 << 30,
    }
    return Registration(**{**base, **kw})


@pytest.mark.asyncio
async def test_creates_then_updates_its_own_warmnode_only(api: Any) -> None:
    cluster, kubeconfig = api
    other = {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmNode",
        "metadata": {"name": "someone-else", "labels": {"warmfleet.io/pool": "agents"}},
        "spec": {"url": "http://other:8000"},
    }
    await cluster.create(API, other)

    outcome = await asyncio.to_thread(
        register, reg(token_ref=SecretRef("warmfleet-admin-token", "token", "warmfleet")),
        kubeconfig=str(kubeconfig),
    )  # fmt: skip
    assert outcome == "created"
    node = await cluster.get(f"{API}/mac-mini-7")
    assert node is not None
    assert node["spec"] == {
        "url": "http://mac-mini-7.lan:8000",
        "adminTokenSecretRef": {
            "name": "warmfleet-admin-token", "key": "token", "namespace": "warmfleet"
        },
    }  # fmt: skip
    assert node["metadata"]["labels"] == {"warmfleet.io/pool": "agents"}
    annotations = node["metadata"]["annotations"]
    assert annotations["warmfleet.io/model"] == "mlx-community/Qwen2.5-7B-Instruct-4bit"
    assert annotations["warmfleet.io/capacity-memory-bytes"] == str(64 << 30)
    assert annotations["warmfleet.io/capacity-cache-budget-bytes"] == str(16 << 30)

    # Someone labels it by hand; the daemon restarts with a new URL and another pool.
    await cluster.merge(f"{API}/mac-mini-7", {"metadata": {"labels": {"rack": "b2"}}})
    outcome = await asyncio.to_thread(
        register,
        reg(url="http://10.0.0.7:8001", labels={"warmfleet.io/pool": "review"}),
        kubeconfig=str(kubeconfig),
    )
    assert outcome == "updated"
    node = await cluster.get(f"{API}/mac-mini-7")
    assert node is not None
    assert node["spec"]["url"] == "http://10.0.0.7:8001"
    assert node["metadata"]["labels"] == {"warmfleet.io/pool": "review", "rack": "b2"}
    # Registering without a token reference does not remove the one already there.
    assert node["spec"]["adminTokenSecretRef"]["name"] == "warmfleet-admin-token"
    # The other node is untouched, and both are still there.
    assert (await cluster.get(f"{API}/someone-else") or {})["spec"] == other["spec"]
    listed = (await cluster.api.get(API)).json()["items"]
    assert sorted(n["metadata"]["name"] for n in listed) == ["mac-mini-7", "someone-else"]


def _fake_api(status: int, body: dict[str, Any]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404, json={"kind": "Status", "code": 404})
        assert request.method != "DELETE"
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


def test_forbidden_is_reported_with_what_the_identity_needs(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "k", "https://api.example:6443", token="t")
    message = (
        'warmnodes.warmfleet.io is forbidden: User "system:serviceaccount:warmfleet:'
        'warmfleet-register" cannot create resource "warmnodes"'
    )
    with pytest.raises(RegistrationError) as err:
        register(
            reg(),
            kubeconfig=str(kubeconfig),
            transport=_fake_api(403, {"kind": "Status", "code": 403, "message": message}),
        )
    assert "403" in str(err.value) and "cannot create resource" in str(err.value)
    assert "registration ClusterRole" in str(err.value)


def test_api_server_errors_are_retried_then_reported(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "k", "https://api.example:6443", token="t")
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return httpx.Response(503, json={"message": "etcdserver: leader changed"})

    with pytest.raises(RegistrationError, match="leader changed"):
        register(reg(), kubeconfig=str(kubeconfig), attempts=3, backoff=0.01,
                 transport=httpx.MockTransport(handle))  # fmt: skip
    assert calls == ["GET", "GET", "GET"]


def test_flags_are_validated() -> None:
    assert parse_labels("warmfleet.io/pool=agents, site=office") == {
        "warmfleet.io/pool": "agents",
        "site": "office",
    }
    for bad in ("pool", "=x", "pool=a b", "Bad_Prefix.io/x=1", "x=" + "v" * 64):
        with pytest.raises(RegistrationError, match="--labels"):
            parse_labels(bad)
    assert parse_secret_ref("warmfleet/warmfleet-admin-token") == SecretRef(
        "warmfleet-admin-token", "token", "warmfleet"
    )
    assert parse_secret_ref("tok:admin") == SecretRef("tok", "admin", None)
    with pytest.raises(RegistrationError):
        parse_secret_ref("Bad/Name")
    for url in ("ftp://x", "http://", "http://h:99999/", "http://a b"):
        with pytest.raises(RegistrationError, match="--advertise-url"):
            reg(url=url)
    with pytest.raises(RegistrationError, match="DNS-1123"):
        reg(name="Mac_7")


def test_serve_without_credentials_refuses_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "warmfleet_cli", "serve", "--model", "tiny-random",
         "--port", str(port), "--register", "m1", "--advertise-url", f"http://127.0.0.1:{port}",
         "--kubeconfig", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "cannot read the kubeconfig" in done.stderr
