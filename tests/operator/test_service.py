"""Service: one pass per set at a time, the newest generation wins; the handlers'
coalescing of WarmNode bursts; and the API emulator the operator tests rely on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import kmock
import pytest
import pytest_asyncio

from support.kubeemu import RESOURCES, Emulator
from warmfleet_common.crd import Node, SecretRef, SetKey
from warmfleet_operator.client import DaemonClient
from warmfleet_operator.coalesce import Coalesced
from warmfleet_operator.service import Service

SPEC = {"prompts": [{"name": "p", "messages": [{"role": "system", "content": "hi"}]}]}
KEY = SetKey("ns", "s")
pytestmark = pytest.mark.asyncio


class NoTokens:
    async def token(self, ref: SecretRef) -> str:
        raise AssertionError(f"no token configured, yet asked for {ref}")


class SlowDaemon:
    """A daemon's warm-set API in memory with the daemon's ordering rule; each PUT
    takes a while so passes overlap."""

    def __init__(self) -> None:
        self.held: dict[str, Any] | None = None
        self.puts: list[int] = []
        self.requests: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/status":
            return httpx.Response(200, json={"warm_sets": [self.held] if self.held else []})
        if request.method == "GET":
            return httpx.Response(200, json=self.held) if self.held else httpx.Response(404)
        spec = json.loads(request.content)
        held = self.held
        if held and held["uid"] == spec["uid"] and spec["generation"] < held["generation"]:
            return httpx.Response(409, json={"detail": "older"})
        await asyncio.sleep(0.05)
        self.puts.append(spec["generation"])
        self.held = {
            "namespace": "ns",
            "name": "s",
            "generation": spec["generation"],
            "uid": spec["uid"],
            "source_hash": spec["source_hash"],
            "content_hash": "c",
            "concurrency": 2,
            "pin": True,
            "prompts": [],
            "warm": 0,
            "total": 0,
            "updated_at": 0.0,
        }
        return httpx.Response(202, json=self.held)


async def test_concurrent_passes_push_once_and_a_stale_body_changes_nothing() -> None:
    daemon = SlowDaemon()
    client = DaemonClient(NoTokens(), transport=httpx.MockTransport(daemon))
    service = Service(client)
    node = Node("a", "http://a", {})

    async def reconcile(generation: int) -> Any:
        return await service.reconcile(
            KEY,
            spec=SPEC,
            generation=generation,
            uid="u1",
            nodes=[node],
            configmaps={},
            status=None,
        )

    # An edit's handler, the resync timer and a re-target pass, all at once.
    outcomes = await asyncio.gather(reconcile(2), reconcile(2), reconcile(2))
    assert daemon.puts == [2]  # the later passes found the node in sync
    assert [o.status["observedGeneration"] for o in outcomes] == [2, 2, 2]
    # A timer still holding the body from before the edit: no push, no status.
    assert await reconcile(1) is None
    assert daemon.puts == [2] and daemon.held is not None and daemon.held["generation"] == 2
    await client.close()


async def test_drift_repair_reads_the_probe_instead_of_asking_each_node() -> None:
    daemon = SlowDaemon()
    client = DaemonClient(NoTokens(), transport=httpx.MockTransport(daemon))
    service = Service(client, snapshot_max_age=60)
    node = Node("a", "http://a", {})

    async def resync() -> Any:
        return await service.reconcile(
            KEY, spec=SPEC, generation=1, uid="u", nodes=[node], configmaps={},
            status=None, fresh=False,
        )  # fmt: skip

    await service.probe(node)
    assert (await resync()).pushes  # the probe said the node lacks the set
    daemon.requests.clear()
    await service.probe(node)
    assert not (await resync()).pushes
    assert daemon.requests == ["GET /v1/status"]  # no GET of the set itself
    daemon.held = None  # the daemon restarted without its state
    await service.probe(node)
    assert (await resync()).pushes and daemon.puts == [1, 1]
    await client.close()


async def test_coalesced_runs_once_per_burst_and_again_if_triggered_while_running() -> None:
    runs: list[int] = []
    gate = asyncio.Event()

    async def run() -> None:
        runs.append(len(runs))
        await gate.wait()

    coalesced = Coalesced(0.01)
    for _ in range(20):  # twenty WarmNodes created at once
        coalesced.trigger(run)
    await asyncio.sleep(0.05)
    assert runs == [0]
    coalesced.trigger(run)  # a change that the running pass may have missed
    gate.set()
    await asyncio.sleep(0.05)
    assert runs == [0, 1]
    await coalesced.close()


@pytest_asyncio.fixture
async def emulator() -> Any:
    async with Emulator() as emu, kmock.Server(emu):
        emu.resources.update(RESOURCES)
        async with httpx.AsyncClient(base_url=str(emu.url).rstrip("/")) as api:
            yield api


async def test_emulator_versions_like_kube_apiserver(emulator: httpx.AsyncClient) -> None:
    path = "/apis/warmfleet.io/v1alpha1/namespaces/default/warmpromptsets"
    body = {"apiVersion": "warmfleet.io/v1alpha1", "kind": "WarmPromptSet", "spec": SPEC}
    created = (await emulator.post(path, json={**body, "metadata": {"name": "a"}})).json()
    meta = created["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["resourceVersion"]

    merge = {"Content-Type": "application/merge-patch+json"}
    spec = (await emulator.patch(f"{path}/a", json={"spec": {"pin": False}}, headers=merge)).json()
    assert spec["metadata"]["generation"] == 2
    assert spec["metadata"]["resourceVersion"] != meta["resourceVersion"]
    status = await emulator.patch(
        f"{path}/a/status", json={"status": {"warmNodes": "0/0"}}, headers=merge
    )
    assert status.json()["metadata"]["generation"] == 2  # status does not bump it

    # kopf's optimistic JSON patch with a stale resourceVersion: 422, nothing applied.
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x"]},
    ]
    r = await emulator.patch(
        f"{path}/a", json=stale, headers={"Content-Type": "application/json-patch+json"}
    )
    assert r.status_code == 422 and r.json()["kind"] == "Status"
    assert "finalizers" not in (await emulator.get(f"{path}/a")).json()["metadata"]


class RejectingDaemon:
    """A daemon that refuses every push with 422, and counts them."""

    def __init__(self) -> None:
        self.puts = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.puts += 1
            error = {"message": "prompt 'p' is too long", "type": "invalid_request_error"}
            return httpx.Response(422, json={"error": error})
        return httpx.Response(404, json={"error": {"message": "no such set"}})


async def test_a_rejected_push_is_reported_and_not_repeated_for_the_same_content() -> None:
    daemon = RejectingDaemon()
    client = DaemonClient(NoTokens(), transport=httpx.MockTransport(daemon))
    service = Service(client, rejection_backoff=60)
    node = Node("d1", "http://d1", {})

    async def reconcile(spec: dict[str, Any]) -> Any:
        return await service.reconcile(
            KEY, spec=spec, generation=1, uid="u", nodes=[node], configmaps={}, status=None
        )

    first = await reconcile(SPEC)
    assert "pushed to" not in first.summary and "push failed on d1" in first.summary
    ready = next(c for c in first.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PushRejected")
    assert "too long" in first.status["nodes"][0]["error"]
    again = await reconcile(SPEC)  # a resync: same content, same daemon process
    assert daemon.puts == 1 and not again.pushes
    assert next(c for c in again.status["conditions"] if c["type"] == "Ready")["reason"] == (
        "PushRejected"
    )
    edited = {"prompts": [{"name": "p", "messages": [{"role": "system", "content": "hey"}]}]}
    await reconcile(edited)  # new content: tried at once
    assert daemon.puts == 2
    await client.close()


class RefusingDaemon:
    async def __call__(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": "invalid admin token"}})


async def test_a_daemon_refusing_the_token_is_reachable_but_unauthorized() -> None:
    client = DaemonClient(NoTokens(), transport=httpx.MockTransport(RefusingDaemon()))
    service = Service(client)
    node = Node("d1", "http://d1", {})
    status = await service.probe(node)
    assert status["reachable"] is True and "invalid admin token" in status["error"]
    authorized = next(c for c in status["conditions"] if c["type"] == "Authorized")
    assert (authorized["status"], authorized["reason"]) == ("False", "Unauthorized")
    removal = await service.remove_everywhere(KEY, [node])  # no retries: it is not down
    assert removal.refused == ["d1"] and removal.unreachable == []
    await client.close()


async def test_secrets_without_a_namespace_are_read_in_the_operators_own(
    emulator: httpx.AsyncClient,
) -> None:
    import kopf

    from warmfleet_common.kube import KubeClient, SecretError

    await emulator.post(
        "/api/v1/namespaces/ops/secrets",
        json={"metadata": {"name": "daemon-token", "namespace": "ops"}, "data": {"token": "czM="}},
    )
    kube = KubeClient()
    kube.configure_from(kopf.ConnectionInfo(server=str(emulator.base_url), default_namespace="ops"))
    assert await kube.token(SecretRef("daemon-token", "token")) == "s3"
    with pytest.raises(SecretError) as caught:
        await kube.token(SecretRef("missing", "token"))
    assert not caught.value.transient and "ops/missing" in caught.value.message
    await kube.close()


class MissingToken:
    async def token(self, ref: SecretRef) -> str:
        from warmfleet_common.kube import SecretError

        raise SecretError(f"admin token Secret ops/{ref.name} not found", transient=False)


@pytest.mark.parametrize("up", [True, False])
async def test_a_missing_token_is_not_mistaken_for_an_answer_or_an_outage(up: bool) -> None:
    """Without a token nothing is sent to the admin routes: /healthz says if it is up."""

    async def daemon(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/healthz" and "authorization" not in request.headers
        if not up:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"status": "ok"})

    client = DaemonClient(MissingToken(), transport=httpx.MockTransport(daemon))
    service = Service(client)
    node = Node("d1", "http://d1", {}, token_ref=SecretRef("daemon-token", "token"))
    status = await service.probe(node)
    assert status["reachable"] is up and "ops/daemon-token not found" in status["error"]
    if up:
        authorized = next(c for c in status["conditions"] if c["type"] == "Authorized")
        assert authorized["reason"] == "TokenUnavailable"
        outcome = await service.reconcile(
            KEY, spec=SPEC, generation=1, uid="u", nodes=[node], configmaps={}, status=None
        )
        ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "Unauthorized")
    await client.close()


async def test_a_status_without_the_warm_set_detail_is_not_read_as_empty() -> None:
    """A daemon that shows only counts to callers without its admin token."""

    async def daemon(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/status":
            counts = {"sets": 3, "prompts": 3, "warm": 3, "failed": 0}
            return httpx.Response(200, json={"instance_id": "i1", "warm_set_counts": counts})
        return httpx.Response(404, json={"error": {"message": "no such set"}})

    client = DaemonClient(NoTokens(), transport=httpx.MockTransport(daemon))
    service = Service(client, snapshot_max_age=60)
    node = Node("d1", "http://d1", {})
    status = await service.probe(node)
    assert status["reachable"] is True and status["instanceId"] == "i1"
    assert "warmSets" not in status and service.held.sets(node) == {}
    await client.close()


class Tokens:
    """Secrets by name; a missing one is a SecretError, as the API server's 404."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens

    async def token(self, ref: SecretRef) -> str:
        from warmfleet_common.kube import SecretError

        if ref.name not in self.tokens:
            raise SecretError(f"admin token Secret ops/{ref.name} not found", transient=False)
        return self.tokens[ref.name]


async def test_a_push_grants_each_peer_with_its_own_token() -> None:
    """Nodes with their own tokens: the node told to copy from warm peers gets, per peer
    with an admin token, a grant that peer honours; a peer without one is named by URL
    alone (the node asks it as today)."""
    from warmfleet_common.grants import grant_refusal, urls_reached_at
    from warmfleet_operator.reconcile import resolve

    source_hash = resolve(SPEC, "ns", 1, {}, "u").source_hash
    puts: dict[str, Any] = {}

    async def fleet(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        held = {
            "namespace": "ns", "name": "s", "generation": 1, "uid": "u",
            "source_hash": source_hash, "content_hash": "c", "concurrency": 2, "pin": True,
            "prompts": [], "warm": 1, "total": 1, "updated_at": 0.0,
        }  # fmt: skip
        if request.method == "PUT":
            puts[host] = json.loads(request.content)
            return httpx.Response(202, json={**held, "warm": 0})
        return httpx.Response(404) if host == "joining" else httpx.Response(200, json=held)

    client = DaemonClient(
        Tokens({"t-a": "token-a", "t-joining": "token-j"}),
        transport=httpx.MockTransport(fleet),
    )
    nodes = [
        Node("a", "http://a:8000", {}, token_ref=SecretRef("t-a", "token")),
        Node("b", "http://b:8000", {}),  # no admin token: nothing to grant
        Node("joining", "http://joining:8000", {}, token_ref=SecretRef("t-joining", "token")),
    ]
    await Service(client).reconcile(
        KEY, spec=SPEC, generation=1, uid="u", nodes=nodes, configmaps={}, status=None
    )
    (pushed,) = puts.values()
    assert list(puts) == ["joining"]
    granted, plain = pushed["peers"]
    assert plain == "http://b:8000" and granted["url"] == "http://a:8000"
    assert grant_refusal("token-a", urls_reached_at("a:8000"), granted["grant"]) is None
    assert grant_refusal("token-j", urls_reached_at("a:8000"), granted["grant"]) is not None
    await client.close()


async def test_a_peer_whose_secret_cannot_be_read_is_named_without_a_grant(caplog) -> None:
    bodies: list[Any] = []

    async def daemon(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {"message": "stop here"}})

    client = DaemonClient(Tokens({}), transport=httpx.MockTransport(daemon))
    peer = Node("a", "http://a:8000", {}, token_ref=SecretRef("gone", "token"))
    from warmfleet_common.contract import WarmSetSpec
    from warmfleet_operator.client import DaemonError

    spec = WarmSetSpec.model_validate({**SPEC, "peers": [peer.url]})
    with pytest.raises(DaemonError):
        await client.put_warm_set(Node("n", "http://n", {}), KEY, spec, peers=[peer])
    assert bodies[0]["peers"] == ["http://a:8000"]
    assert "no grant for peer a: admin token Secret ops/gone not found" in caplog.text
    await client.close()
