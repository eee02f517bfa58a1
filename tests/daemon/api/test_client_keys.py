"""`--api-keys-file` on a daemon, over real HTTP with the official `openai` and
`anthropic` SDKs (tiny random model): every inference route needs a key in its API's
header (401 in that API's shape otherwise), keys kept hashed work, the file is read
again when it changes, no key is ever logged, and only the router's signature names a
tenant; metrics, status and the API document need a key or the admin token, and only
the liveness and readiness probes stay open."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from support.engine import model
from support.processes import serving
from warmfleet_common.client_keys import hashed_line
from warmfleet_common.tenancy import TENANT_HEADER, TENANT_SIGNATURE_HEADER, sign_tenant
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-team-b-fedcba9876543210"
ADMIN = "admin-s3cret-token"
ASK = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    # B's key is kept hashed at rest.
    path.write_text(f"# tenants\nteam-a {KEY_A}\n\n{hashed_line('team-b', KEY_B)}\n")
    return path


@pytest.fixture(scope="module")
def url(keys_file: Path) -> Iterator[str]:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(
        model="tiny-random", api_keys_file=str(keys_file), admin_token=ADMIN, max_output_tokens=4
    )
    with serving(create_app(settings, engine=engine)) as base:
        yield base


def oa(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def an(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def test_openai_routes_need_a_key(url: str) -> None:
    client = oa(url, "sk-wrong-wrong-wrong-wrong")
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="tiny-random", messages=ASK)  # type: ignore[arg-type]
    assert refused.value.response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model="tiny-random", prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        client.responses.create(model="tiny-random", input="hi")
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        missing = httpx.post(f"{url}{path}", json={"model": "tiny-random"})
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "missing_api_key"
    answer = oa(url, KEY_A).chat.completions.create(model="tiny-random", messages=ASK)  # type: ignore[arg-type]
    assert answer.choices[0].message.role == "assistant"
    assert oa(url, KEY_B).responses.create(model="tiny-random", input="hi").output
    assert [m.id for m in oa(url, KEY_A).models.list()] == ["tiny-random"]
    # The router reads /v1/models with the admin token.
    assert [m.id for m in oa(url, ADMIN).models.list()] == ["tiny-random"]


def test_anthropic_routes_take_x_api_key_and_answer_in_anthropic_shape(url: str) -> None:
    with pytest.raises(anthropic.AuthenticationError) as refused:
        an(url, "sk-wrong-wrong-wrong-wrong").messages.create(
            model="tiny-random",
            max_tokens=4,
            messages=ASK,  # type: ignore[arg-type]
        )
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    r = httpx.post(f"{url}/v1/messages", json={"model": "tiny-random", "max_tokens": 2})
    assert r.status_code == 401 and r.json()["type"] == "error"
    message = an(url, KEY_B).messages.create(model="tiny-random", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    assert message.role == "assistant"
    counted = an(url, KEY_A).messages.count_tokens(model="tiny-random", messages=ASK)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    # Claude Code's ANTHROPIC_AUTH_TOKEN arrives as a Bearer token.
    bearer = anthropic.Anthropic(base_url=url, auth_token=KEY_A, max_retries=0)
    assert bearer.messages.create(model="tiny-random", max_tokens=2, messages=ASK).role  # type: ignore[arg-type]


def test_every_route_that_shows_data_needs_a_key_but_the_probes(url: str) -> None:
    for path in ("/healthz", "/readyz"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    bearer_a = {"Authorization": f"Bearer {KEY_A}"}
    for path in ("/metrics", "/v1/status", "/openapi.json", "/docs", "/redoc"):
        refused = httpx.get(f"{url}{path}")
        assert refused.status_code == 401, path
        assert refused.json()["error"]["code"] == "missing_api_key", path
        wrong = httpx.get(f"{url}{path}", headers={"Authorization": "Bearer sk-nobody-000000000"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{url}{path}", headers=bearer_a).status_code == 200, path
        assert httpx.get(f"{url}{path}", headers={"x-api-key": KEY_B}).status_code == 200, path
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.get(f"{url}{path}", headers=admin).status_code == 200, path
    # A client key reads the status's public view; the admin token its detail.
    public = httpx.get(f"{url}/v1/status", headers=bearer_a).json()
    detail = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert public != detail and len(str(public)) < len(str(detail))
    # Admin routes keep the admin token: a client key is no admin token.
    assert httpx.get(f"{url}/v1/warm-sets", headers=bearer_a).status_code == 403


def test_only_the_router_names_a_tenant(url: str) -> None:
    body = {"model": "tiny-random", "messages": ASK, "max_tokens": 2}
    named = {TENANT_HEADER: "team-a"}
    unsigned = httpx.post(f"{url}/v1/chat/completions", json=body, headers=named)
    assert unsigned.status_code == 401 and unsigned.json()["error"]["code"] == "invalid_tenant"
    forged = {TENANT_HEADER: "team-a", TENANT_SIGNATURE_HEADER: sign_tenant("not-admin", "team-a")}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=forged).status_code == 401
    stale = sign_tenant(ADMIN, "team-a", now=time.time() - 600)
    expired = {TENANT_HEADER: "team-a", TENANT_SIGNATURE_HEADER: stale}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=expired).status_code == 401
    signed = {TENANT_HEADER: "team-a", TENANT_SIGNATURE_HEADER: sign_tenant(ADMIN, "team-a")}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=signed).status_code == 200


def test_keys_are_never_logged(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "sk-this-key-must-not-appear-9876"
    with pytest.raises(openai.AuthenticationError) as refused:
        oa(url, wrong).chat.completions.create(model="tiny-random", messages=ASK)  # type: ignore[arg-type]
    oa(url, KEY_A).chat.completions.create(model="tiny-random", messages=ASK)  # type: ignore[arg-type]
    assert wrong not in refused.value.response.text
    for secret in (wrong, KEY_A, KEY_B):
        assert secret not in caplog.text


def test_the_keys_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"team-a {KEY_A}\n")
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=32 << 20))
    settings = DaemonSettings(model="tiny-random", api_keys_file=str(path), max_output_tokens=2)
    rotated = "sk-team-a-rotated-00000000"
    with serving(create_app(settings, engine=engine)) as base:
        assert len(oa(base, KEY_A).models.list().data) == 1
        # A Secret volume swaps the file: write it aside, then move it in place.
        aside = tmp_path / "keys.new"
        aside.write_text(f"team-a {rotated}\n")
        aside.replace(path)
        deadline = time.monotonic() + 10
        while True:
            try:
                oa(base, rotated).models.list()
                break
            except openai.AuthenticationError:
                assert time.monotonic() < deadline, "the new key was never read"
                time.sleep(0.2)
        with pytest.raises(openai.AuthenticationError):
            oa(base, KEY_A).models.list()
        # A file that no longer parses keeps the keys read before.
        path.write_text("team-a\n")
        time.sleep(1.5)
        assert len(oa(base, rotated).models.list().data) == 1
