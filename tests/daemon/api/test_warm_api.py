"""The push API over HTTP (in process, tiny model): codes, auth, bodies."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from support.engine import model
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings
from warmfleet_daemon.warming.manager import WarmManager

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = {"role": "system", "content": "You are Scout, the SRE team's log analyst. " * 10}
BODY = {"generation": 1, "prompts": [{"name": "scout", "messages": [SYSTEM]}]}


def make_client(**settings: object) -> TestClient:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    return TestClient(create_app(DaemonSettings(model="tiny-random", **settings), engine=engine))


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(admin_token=TOKEN) as c:
        yield c


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 60
    while client.get("/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_put_get_list_delete(client) -> None:
    r = client.put("/v1/warm-sets/team-a/scout", json=BODY, headers=AUTH)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["namespace"] == "team-a" and body["generation"] == 1 and body["total"] == 1
    assert body["prompts"][0]["state"] in ("pending", "warming", "warm")
    wait_ready(client)
    one = client.get("/v1/warm-sets/team-a/scout", headers=AUTH).json()
    assert one["warm"] == 1 and one["prompts"][0]["tokens"] > 100
    assert [s["name"] for s in client.get("/v1/warm-sets", headers=AUTH).json()["sets"]] == [
        "scout"
    ]
    chat = client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny-random",
            "messages": [SYSTEM, {"role": "user", "content": "errors?"}],
            "max_tokens": 2,
        },
    ).json()
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] == one["prompts"][0]["tokens"]
    assert client.get("/v1/status", headers=AUTH).json()["warm_sets"][0]["warm"] == 1
    assert client.delete("/v1/warm-sets/team-a/scout", headers=AUTH).json()["status"] == "deleted"
    assert client.get("/v1/warm-sets/team-a/scout", headers=AUTH).status_code == 404
    assert client.delete("/v1/warm-sets/team-a/scout", headers=AUTH).status_code == 404


def test_readyz_warm_waits_for_every_prompt(client) -> None:
    assert client.get("/readyz", params={"warm": 1}).status_code == 200  # nothing to warm
    client.put("/v1/warm-sets/team-a/scout", json=BODY, headers=AUTH)
    wait_ready(client)
    assert client.get("/readyz").status_code == 200


def test_cache_clear_answers_and_rewarms(client) -> None:
    client.put("/v1/warm-sets/team-a/scout", json=BODY, headers=AUTH)
    wait_ready(client)
    r = client.delete("/v1/cache/prefix", headers=AUTH)
    assert r.status_code == 200
    assert r.json()["status"] == "cleared" and r.json()["rewarm_scheduled"] is True
    wait_ready(client)
    assert client.get("/v1/status").json()["cache"]["entry_count"] > 0


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 403), ({"Authorization": "Basic x"}, 401)],
)
def test_admin_routes_need_the_token(client, headers, status) -> None:
    for method, path in [
        ("put", "/v1/warm-sets/team-a/scout"),
        ("get", "/v1/warm-sets"),
        ("delete", "/v1/cache/prefix"),
    ]:
        kwargs = {"json": BODY} if method == "put" else {}
        r = getattr(client, method)(path, headers=headers, **kwargs)
        assert r.status_code == status and r.json()["error"]["message"]
    assert client.get("/v1/warm-sets", headers=AUTH).json()["sets"] == []
    assert client.get("/v1/models").status_code == 200  # the OpenAI routes stay open


def test_without_a_token_loopback_is_open() -> None:
    with make_client() as c:
        assert c.get("/v1/warm-sets").status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/warm-sets/Team_A/x", BODY, 400, "namespace"),
        (
            "/v1/warm-sets/team/x",
            {"prompts": [{"name": "a", "messages": []}]},
            400,
            "prompts.0.messages",
        ),
        (
            "/v1/warm-sets/team/x",
            {"prompts": [{"name": "a b", "messages": [SYSTEM]}]},
            400,
            "prompts.0.name",
        ),
        (
            "/v1/warm-sets/team/x",
            {"prompts": [{"name": "a", "messages": [SYSTEM]}] * 2},
            400,
            "prompts",
        ),
        ("/v1/warm-sets/team/x", {"prompts": [], "surprise": 1}, 400, "surprise"),
        (
            "/v1/warm-sets/team/x",
            {
                "prompts": [
                    {"name": "a", "messages": [{"role": "system", "content": "word " * 9000}]}
                ]
            },
            422,
            "prompts.0",
        ),
    ],
)
def test_bad_pushes_are_rejected_and_change_nothing(client, path, body, status, param) -> None:
    r = client.put(path, json=body, headers=AUTH)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert client.get("/v1/warm-sets", headers=AUTH).json()["sets"] == []


def test_not_ready_before_the_warm_prompts_file_is_registered(tmp_path, monkeypatch) -> None:
    """`/readyz?warm=1` must never be vacuously true between the model becoming ready
    and the start-up file's prompts being registered."""
    path = tmp_path / "agents.json"
    path.write_text(json.dumps([[SYSTEM]]))
    ready_when_applied: list[bool] = []
    original = WarmManager.apply

    def apply(self: WarmManager, *args: object, **kwargs: object) -> object:
        ready_when_applied.append(app.state.daemon.ready is not None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(WarmManager, "apply", apply)
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    app = create_app(DaemonSettings(model="tiny-random", warm_prompts=str(path)), engine=engine)
    with TestClient(app) as client:
        assert ready_when_applied == [False]
        wait_ready(client)
        sets = client.get("/v1/warm-sets").json()["sets"]
        assert [(s["name"], s["warm"], s["total"]) for s in sets] == [("warm-prompts", 1, 1)]


def test_status_names_the_daemon_instance(client) -> None:
    """A new instance id per process start: the operator tells a restart (sets lost)
    from a slow answer at once."""
    status = client.get("/v1/status", headers=AUTH).json()
    assert len(status["instance_id"]) == 32 and status["started_at"].endswith("+00:00")
    with make_client(admin_token=TOKEN) as other:
        assert other.get("/v1/status", headers=AUTH).json()["instance_id"] != status["instance_id"]
