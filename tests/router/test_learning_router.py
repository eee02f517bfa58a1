"""Learned warm prompts through a real router (uvicorn in a thread) with client keys in
front of a fake backend: three sessions of Claude Code's recorded first request learn
its static head for their tenant; the listing is the admin token's only and says the
API shape, sessions, first and last seen and the first requests' hit rate; another
tenant never sees it; and a secret in every session's first user message is in no
learned prompt, listing, status, metric or log line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from support.agents import claude_code, codex
from support.processes import serving
from warmfleet_common.agent_apis.prefix import warm_prompt
from warmfleet_router.app import create_app
from warmfleet_router.discovery import StaticSource
from warmfleet_router.learning import LearnOptions
from warmfleet_router.options import RouterOptions

TOKEN = "learning-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-fedcba9876543210"}
SECRET = "AKIA-SECRET-7d41c0ffee"


def backend_app() -> Starlette:
    """Answers every request at once, 900 of its 1000 prompt tokens cached."""

    async def readyz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ready"})

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "default"}]})

    async def messages(_: Request) -> JSONResponse:
        usage = {"input_tokens": 100, "cache_read_input_tokens": 900, "output_tokens": 1}
        content = [{"type": "text", "text": "ok"}]
        return JSONResponse({"type": "message", "role": "assistant", "content": content,
                             "usage": usage})  # fmt: skip

    async def responses(_: Request) -> JSONResponse:
        usage = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 500},
                 "output_tokens": 1}  # fmt: skip
        return JSONResponse({"object": "response", "output": [], "usage": usage})

    return Starlette(
        routes=[
            Route("/readyz", readyz),
            Route("/v1/models", models),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    with serving(backend_app()) as url:  # type: ignore[arg-type]
        yield url


@pytest.fixture(scope="module")
def router(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    options = RouterOptions(
        admin_token=TOKEN, api_keys_file=str(keys), learn=LearnOptions(min_sessions=3)
    )
    with serving(create_app(StaticSource([backend], None), options)) as url:
        yield url


def claude(router: str, tenant: str, prompt: str) -> httpx.Response:
    recorded = claude_code(prompt, model="default")
    headers = {**recorded.headers, "x-api-key": KEYS[tenant]}
    headers = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "host")}
    return httpx.post(f"{router}/v1/messages", json=recorded.body, headers=headers, timeout=10)


def learned(router: str, **params: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{router}/v1/router/learned", params=params, headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text
    data: list[dict[str, Any]] = answer.json()["data"]
    return data


def test_three_sessions_learn_the_head_and_no_secret_is_kept(
    router: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for n in range(2):
        assert claude(router, "team-a", f"session {n}: use {SECRET}").status_code == 200
    assert learned(router) == []  # two sessions: only digests so far
    assert claude(router, "team-a", f"session 2: use {SECRET}").status_code == 200
    [prompt] = learned(router)
    assert prompt["tenant"] == "team-a" and prompt["api"] == "anthropic"
    assert prompt["client"] == "claude-code" and prompt["name"].startswith("claude-code-")
    assert prompt["sessions"] == 3 and prompt["first_seen"] <= prompt["last_seen"]
    assert prompt["first_requests"] == 0 and prompt["first_request_hit_rate"] is None
    assert prompt["tokens"] is None  # no daemon holds it warm (nothing warms it here)
    captured = warm_prompt("anthropic", claude_code().body, prompt["name"])  # as capture keeps it
    assert prompt["prompt"] == captured.model_dump(mode="json", exclude_none=True)
    assert "x-anthropic-billing-header" not in prompt["prompt"]["anthropic"]["system"]
    # A fourth session's first request uses it: its hit rate is counted, once.
    assert claude(router, "team-a", f"session 3: use {SECRET}").status_code == 200
    [prompt] = learned(router)
    assert prompt["sessions"] == 4 and prompt["first_requests"] == 1
    assert prompt["first_request_hit_rate"] == 0.9
    metrics = httpx.get(f"{router}/metrics", headers=AUTH, timeout=10).text
    gauge = [line for line in metrics.splitlines() if "learned_prompts{" in line]
    assert any('warmfleet_tenant="team-a"' in line and line.endswith(" 1.0") for line in gauge)
    first = [line for line in metrics.splitlines() if "first_requests_total{" in line]
    assert any('warmfleet_learned="true"' in line and line.endswith(" 1.0") for line in first)
    assert any('warmfleet_client="claude-code"' in line for line in first)
    everything = [
        httpx.get(f"{router}/v1/router/learned", headers=AUTH, timeout=10).text,
        httpx.get(f"{router}/v1/router/status", headers=AUTH, timeout=10).text,
        metrics,
        caplog.text,
    ]
    for text in everything:
        assert SECRET not in text
        assert "session 2" not in text


def test_a_tenants_learned_head_is_its_own(router: str) -> None:
    for n in range(3):
        assert claude(router, "team-a", f"a {n}").status_code == 200
    assert learned(router, tenant="team-b") == []
    for n in range(2):  # team-b's own sessions: two, not enough on their own
        assert claude(router, "team-b", f"b {n}").status_code == 200
    assert learned(router, tenant="team-b") == []
    assert [p["tenant"] for p in learned(router, tenant="team-a")] == ["team-a"]
    assert claude(router, "team-b", "b 2").status_code == 200
    [own] = learned(router, tenant="team-b")
    assert own["sessions"] == 3 and own["first_requests"] == 0


def test_the_listing_is_the_admin_tokens_only(router: str) -> None:
    url = f"{router}/v1/router/learned"
    assert httpx.get(url, timeout=10).status_code == 401
    as_client = {"Authorization": f"Bearer {KEYS['team-a']}"}
    assert httpx.get(url, headers=as_client, timeout=10).status_code == 403
    assert httpx.get(url, headers={"x-api-key": KEYS["team-a"]}, timeout=10).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "invalid_token"
    bad = httpx.get(url, params={"tenant": "no such/tenant"}, headers=AUTH, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_tenant"
    listing = httpx.get(url, headers=AUTH, timeout=10).json()
    assert listing["min_sessions"] == 3 and listing["ttl_seconds"] == 7 * 86400


def test_codex_sessions_and_a_router_that_does_not_learn(backend: str, tmp_path: Path) -> None:
    options = RouterOptions(admin_token=TOKEN, learn=LearnOptions(min_sessions=2))
    with serving(create_app(StaticSource([backend], None), options)) as url:
        for n in range(2):
            recorded = codex(f"thread {n} {SECRET}", model="default")
            sent = httpx.post(f"{url}/v1/responses", json=recorded.body, timeout=10)
            assert sent.status_code == 200
        [prompt] = learned(url, tenant="-")
        assert prompt["api"] == "responses" and prompt["tenant"] is None
        assert prompt["client"] == "responses-agent"  # no User-Agent sent
        assert SECRET not in str(prompt)
    off = RouterOptions(admin_token=TOKEN, learn=LearnOptions(min_sessions=0))
    with serving(create_app(StaticSource([backend], None), off)) as url:
        for n in range(3):
            recorded = codex(f"thread {n}", model="default")
            assert httpx.post(f"{url}/v1/responses", json=recorded.body, timeout=10).is_success
        assert learned(url) == []
    untokened = RouterOptions(learn=LearnOptions(min_sessions=1))
    with serving(create_app(StaticSource([backend], None), untokened)) as url:
        refused = httpx.get(f"{url}/v1/router/learned", headers=AUTH, timeout=10)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "no_admin_token"
