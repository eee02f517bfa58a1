"""GET /v1/status without the admin token shows counts, not what the warm sets are
(names, uids, prompt names, content hashes: the admin routes guard them); with the
token, or on a daemon without one (loopback only), the full detail."""

from __future__ import annotations

import hashlib
import json
import time

from fastapi.testclient import TestClient

from support.engine import model
from warmfleet_common.prompts import PromptBuilder
from warmfleet_common.wire import DaemonStatus
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

TOKEN = "status-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = "You are Quill, the payments team's reviewer. Be terse. " * 8
BODY = {
    "generation": 3,
    "uid": "uid-4711",
    "prompts": [{"name": "quill-review", "messages": [{"role": "system", "content": SYSTEM}]}],
}


def make_client(**settings: object) -> TestClient:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    return TestClient(create_app(DaemonSettings(model="tiny-random", **settings), engine=engine))


def put_and_wait(client: TestClient, headers: dict[str, str]) -> dict:
    r = client.put("/v1/warm-sets/payments/quill", json=BODY, headers=headers)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while client.get("/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return client.get("/v1/warm-sets/payments/quill", headers=headers).json()


def test_public_status_has_counts_only() -> None:
    with make_client(admin_token=TOKEN) as client:
        held = put_and_wait(client, AUTH)
        public = client.get("/v1/status")
        assert public.status_code == 200
        text = public.text
        for secret in ("payments", "quill", "uid-4711", held["content_hash"]):
            assert secret not in text
        assert held["prompts"][0]["content_hash"] not in text
        doc = public.json()
        DaemonStatus.model_validate(doc)  # the wire model other components read
        assert "warm_sets" not in doc
        assert doc["warm_set_counts"] == {"sets": 1, "prompts": 1, "warm": 1, "failed": 0}

        full = client.get("/v1/status", headers=AUTH).json()
        assert full["warm_sets"] == client.get("/v1/warm-sets", headers=AUTH).json()["sets"]
        assert full["warm_set_counts"] == doc["warm_set_counts"]
        wrong = client.get("/v1/status", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "invalid_token"


def test_without_a_token_the_detail_stays_public() -> None:
    with make_client() as client:
        put_and_wait(client, {})
        assert client.get("/v1/status").json()["warm_sets"][0]["name"] == "quill"


def test_content_hashes_cannot_confirm_a_guessed_prompt() -> None:
    """An unkeyed hash of the tokens a guess renders to would match; a keyed one not."""
    with make_client() as client:
        held = put_and_wait(client, {})
    guess = PromptBuilder(model("tiny-random").tokenizer).shared_prefix(
        [{"role": "system", "content": SYSTEM}]
    )
    unkeyed = hashlib.blake2b(
        json.dumps([list(guess.tokens), list(guess.cuts)], sort_keys=True).encode(),
        digest_size=12,
    ).hexdigest()
    assert held["prompts"][0]["content_hash"] != unkeyed
