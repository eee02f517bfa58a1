"""A learning WarmPromptSet (`spec.learn`): which of the router's learned warm prompts
it takes (its tenant's, from enough sessions, used within its ttl, at most maxPrompts),
and, end to end in local mode, three sessions of an agent whose head was never captured
through a real router make the operator warm it on both tiny-random daemons, so a fourth
session's first request on the daemon that served none of them reads the head from
cache; the secret in every session's first user message reaches neither the set nor
its status. Through kopf (kmock's emulator, which prunes what the CRD does not allow),
the learned prompt and its status entry land on the WarmPromptSet."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from support.kubeemu import Cluster, wait_for
from support.processes import Daemon, serving
from support.router import AUTH, TOKEN, start_router_for, status, tiny_daemons
from warmfleet_cli.local_fleet import TOKEN_SECRET, fleet_documents, learning_set
from warmfleet_common.contract import WarmSetStatus
from warmfleet_common.crd import Node
from warmfleet_operator import learned, reconcile
from warmfleet_operator.objects import Observation

NOW = 1_800_000_000.0
SECRET = "ghp_SECRETSECRET0123456789"


def item(name: str, sessions: int, ago: float, tenant: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": tenant,
        "client": "claude-code",
        "sessions": sessions,
        "last_seen": NOW - ago,
        "prompt": {"name": name, "anthropic": {"system": f"You are {name}."}},
    }


def spec(**learn: Any) -> dict[str, Any]:
    return {"learn": {"router": {"url": "http://r"}, **learn}}


def test_a_set_takes_its_tenants_learned_prompts_from_enough_sessions_used_lately() -> None:
    listing = [
        item("cc-new", 5, 60),
        item("cc-few", 2, 60),  # fewer sessions than the set asks for
        item("cc-old", 9, 8 * 86400),  # unused for longer than the ttl
        item("cc-most", 12, 3600),
        item("cc-theirs", 50, 60, tenant="team-b"),  # another tenant's: never
        {"name": "broken", "tenant": None, "sessions": 9, "last_seen": NOW, "prompt": {}},
    ]
    taken = learned.select(spec(), listing, NOW)
    assert [p["name"] for p in taken.prompts] == ["cc-most", "cc-new"]
    assert taken.status[0] == {
        "name": "cc-most",
        "client": "claude-code",
        "api": "anthropic",
        "sessions": 12,
        "lastSeen": "2027-01-15T07:00:00Z",
    }
    assert [p["name"] for p in learned.select(spec(maxPrompts=1), listing, NOW).prompts] == [
        "cc-most"
    ]
    lenient = learned.select(spec(minSessions=2, ttl="9d"), listing, NOW)
    assert {p["name"] for p in lenient.prompts} == {"cc-most", "cc-new", "cc-few", "cc-old"}
    own = {**spec(), "tenants": ["team-b"]}
    assert [p["name"] for p in learned.select(own, listing, NOW).prompts] == ["cc-theirs"]
    assert learned.tenant_of(own) == "team-b" and learned.tenant_of(spec()) == "-"
    both = {**spec(), "tenants": ["team-a", "team-b"]}
    assert learned.select(both, listing, NOW).prompts == []
    mine = {**spec(), "prompts": [{"name": "cc-new", "messages": [{"role": "system"}]}]}
    assert [p["name"] for p in learned.select(mine, listing, NOW).prompts] == ["cc-most"]


def test_a_learning_set_with_nothing_learned_is_ready_once_its_nodes_hold_it() -> None:
    desired = reconcile.resolve({"learn": {}}, "default", 1, {}, learned=[])
    node = Node("mac-1", "http://mac-1:8000")
    held = WarmSetStatus(
        namespace="default", name="learned", generation=1, source_hash=desired.source_hash,
        content_hash="c", concurrency=2, pin=True, prompts=[], warm=0, total=0, updated_at=0.0,
    )  # fmt: skip

    def ready(seen: Observation) -> Mapping[str, Any]:
        state = reconcile.set_status(
            generation=1, selected=[node], observations={"mac-1": seen}, desired=desired,
            invalid=None, previous=[], now="2026-01-01T00:00:00Z", learning=True,
        )  # fmt: skip
        return reconcile.condition(state, "Ready") or {}

    assert ready(Observation("mac-1", True, held))["reason"] == "NothingLearned"
    assert ready(Observation("mac-1", True, held))["status"] == "True"
    assert ready(Observation("mac-1", False, None, "refused"))["reason"] == "NodesUnreachable"
    filled = reconcile.resolve({"learn": {}}, "default", 1, {}, learned=[item("a", 3, 0)["prompt"]])
    assert [p.name for p in filled.prompts] == ["a"]


def chat(url: str, session: str, user: str, **headers: str) -> dict[str, Any]:
    body = {
        "model": "default",
        "messages": [{"role": "system", "content": AGENT}, {"role": "user", "content": user}],
        "max_tokens": 1,
        "temperature": 0,
    }
    sent = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"x-session-affinity": session, "user-agent": "opencode/1.0", **headers},
        timeout=60,
    )
    assert sent.status_code == 200, sent.text
    answer: dict[str, Any] = sent.json()
    return answer


AGENT = "You are the release agent of the platform team. " * 24 + "Answer in one line."


def wait(check: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_three_sessions_warm_the_head_on_every_node(tmp_path: Path) -> None:
    with tiny_daemons(tokens=[TOKEN, TOKEN]) as daemons:
        router = start_router_for(daemons, tmp_path, "--learn-min-sessions", "3")
        try:
            _learn_and_warm(tmp_path, daemons, router)
        finally:
            router.stop()


def _learn_and_warm(folder: Path, daemons: list[Daemon], router: Daemon) -> None:
    docs = fleet_documents(0, "127.0.0.1", 0, TOKEN)  # the token's Secret
    docs += [
        {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {"name": f"node-{i + 1}", "labels": {"warmfleet.io/fleet": "local"}},
            "spec": {"url": d.url, "adminTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"}},
        }
        for i, d in enumerate(daemons)
    ]
    (folder / "fleet.yaml").write_text(yaml.safe_dump_all(docs))
    (folder / "learned-set.yaml").write_text(yaml.safe_dump(learning_set(router.url, 3)))
    status_file = folder / "status.json"
    operator = subprocess.Popen(
        [sys.executable, "-m", "warmfleet_cli", "operator", "--local", str(folder),
         "--status-file", str(status_file), "--resync-seconds", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        for n in range(3):
            chat(router.url, f"session-{n}", f"deploy with token {SECRET} #{n}")
        served = {d["backend"] for d in status(router)["decisions"]}
        listing = httpx.get(f"{router.url}/v1/router/learned", headers=AUTH, timeout=10).json()
        [prompt] = listing["data"]
        assert prompt["client"] == "opencode" and prompt["sessions"] == 3

        def warm_everywhere() -> dict[str, Any] | None:
            if not status_file.exists():
                return None
            state = json.loads(status_file.read_text())["warmPromptSets"].get("default/learned")
            if state and state.get("learnedPrompts") == 1 and state["warmNodes"] == "2/2":
                return dict(state)
            return None

        try:
            state = wait(warm_everywhere)
        except AssertionError:
            operator.send_signal(signal.SIGINT)
            out, _ = operator.communicate(timeout=30)
            raise AssertionError(f"{status_file.read_text()[:3000]}\n{out[-3000:]}") from None
        assert state["learned"][0]["name"] == prompt["name"]
        assert state["learned"][0]["sessions"] == 3
        # The daemon that served none of the three (either, if both served some).
        names = {b["name"]: b["url"] for b in status(router)["backends"]}
        idle = [url for name, url in names.items() if name not in served] or list(names.values())
        held = httpx.get(f"{idle[0]}/v1/warm-sets/default/learned", headers=AUTH, timeout=10)
        [warm] = held.json()["prompts"]
        assert warm["state"] == "warm" and warm["tokens"] > 0
        assert state["learned"][0]["tokens"] == warm["tokens"]

        def router_knows_tokens() -> bool:  # read from the daemons' warm sets
            answer = httpx.get(f"{router.url}/v1/router/learned", headers=AUTH, timeout=10)
            return bool(answer.json()["data"][0]["tokens"] == warm["tokens"])

        wait(router_knows_tokens, timeout=60)
        fourth = chat(idle[0], "session-3", "what changed since yesterday?", **AUTH)
        cached = fourth["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 0.9 * warm["tokens"], (cached, warm["tokens"])
        for text in (status_file.read_text(), held.text, json.dumps(listing)):
            assert SECRET not in text
    finally:
        operator.send_signal(signal.SIGINT)
        out, _ = operator.communicate(timeout=30)
    assert SECRET not in out


def held_set(daemon: Daemon) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{daemon.url}/v1/warm-sets/default/learned").json()
    return answer


def fake_router(listing: list[dict[str, Any]]) -> Starlette:
    """Answers `GET /v1/router/learned` (with TOKEN only) with `listing`."""

    async def learned_route(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": {"message": "no"}}, 401)
        tenant = request.query_params.get("tenant")
        want = None if tenant == "-" else tenant
        data = [i for i in listing if i["tenant"] == want]
        return JSONResponse({"object": "list", "data": data})

    return Starlette(routes=[Route("/v1/router/learned", learned_route)])


@pytest.mark.asyncio
async def test_kopf_fills_a_learning_set_and_its_status_survives_the_schema(
    cluster: Cluster, daemons: list[Daemon]
) -> None:
    api = "/apis/warmfleet.io/v1alpha1"
    head = {"name": "opencode-0123456789", "messages": [{"role": "system", "content": AGENT}]}
    listing = [{**item("opencode-0123456789", 4, 0), "client": "opencode", "prompt": head}]
    listing[0]["last_seen"] = time.time()
    with serving(fake_router(listing)) as url:  # type: ignore[arg-type]
        await cluster.create(
            "/api/v1/namespaces/default/secrets",
            {"metadata": {"name": "router-token", "namespace": "default"},
             "stringData": {"token": TOKEN}},
        )  # fmt: skip
        await cluster.create(
            f"{api}/warmnodes",
            {"apiVersion": "warmfleet.io/v1alpha1", "kind": "WarmNode",
             "metadata": {"name": "mac-learn", "labels": {"warmfleet.io/pool": "learn"}},
             "spec": {"url": daemons[0].url}},
        )  # fmt: skip
        learning = learning_set(url, 3)
        learning["spec"]["nodeSelector"] = {"matchLabels": {"warmfleet.io/pool": "learn"}}
        learning["spec"]["learn"]["router"]["adminTokenSecretRef"]["name"] = "router-token"
        await cluster.create(f"{api}/namespaces/default/warmpromptsets", learning)

        async def warm() -> dict[str, Any] | None:
            obj = await cluster.get(f"{api}/namespaces/default/warmpromptsets/learned")
            state = (obj or {}).get("status") or {}
            ok = state.get("learnedPrompts") == 1 and state.get("warmNodes") == "1/1"
            return dict(state) if ok else None

        state = await wait_for(warm, what="the learned prompt warm")
    assert state["learned"] == [
        {
            "name": "opencode-0123456789",
            "client": "opencode",
            "api": "chat",
            "sessions": 4,
            "lastSeen": state["learned"][0]["lastSeen"],
            "tokens": state["learned"][0]["tokens"],
        }
    ]
    assert state["learned"][0]["tokens"] > 100
    held = held_set(daemons[0])
    assert [p["name"] for p in held["prompts"]] == ["opencode-0123456789"]
    assert held["warm"] == 1
