"""Per-tenant cache isolation on a daemon (tiny random model, real HTTP, the `openai`
SDK): a tenant's blocks are keyed with its salt, so another tenant's identical prompt
finds nothing cached (and so cannot time it); a request's own `cache_salt` isolates it
within its tenant; a fleet-wide warm set is hit by every tenant, a tenant-scoped one
only by its tenants; and every cached answer is token for token the cold one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from support.engine import model
from support.processes import serving
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, GenerationRequest
from warmfleet_daemon.settings import DaemonSettings

KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-fedcba9876543210"}
ADMIN = "admin-s3cret-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def system(name: str) -> dict[str, str]:
    return {"role": "system", "content": f"You are {name}, the on-call assistant. " * 12}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(model="tiny-random", api_keys_file=str(path), admin_token=ADMIN)
    with serving(create_app(settings, engine=engine)) as base:
        yield base


def ask(url: str, tenant: str, messages: list[dict[str, str]], **extra: Any) -> tuple[str, int]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0)
    r = client.chat.completions.create(
        model="tiny-random",
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=8,
        extra_body=extra or None,
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.choices[0].message.content or "", r.usage.prompt_tokens_details.cached_tokens or 0


def unseen(url: str, tenant: str) -> int:
    """What a prompt nobody sent before finds cached: at most the chat template's
    header (a few tokens: once the tenant sent anything, or a fleet-wide warm set
    shares it)."""
    messages = [system(f"N{time.monotonic_ns()}"), {"role": "user", "content": "?"}]
    return ask(url, tenant, messages)[1]


def put_and_wait(url: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.put(f"{url}/v1/warm-sets/fleet/{name}", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    got: dict[str, Any] = httpx.get(f"{url}/v1/warm-sets/fleet/{name}", headers=AUTH).json()
    return got


def test_a_tenant_never_hits_another_tenants_blocks(url: str) -> None:
    messages = [system("Ada"), {"role": "user", "content": "Why is the build red?"}]
    cold_a, cached = ask(url, "team-a", messages)
    assert cached <= unseen(url, "team-a") < 10
    again_a, cached = ask(url, "team-a", messages)
    assert cached > 100 and again_a == cold_a  # A's own blocks, and the same answer
    cold_b, cached = ask(url, "team-b", messages)
    # The same prompt, another tenant: nothing to hit, nothing to time.
    assert cached <= unseen(url, "team-b") < 10
    assert cold_b == cold_a
    assert ask(url, "team-b", messages)[1] > 100


def test_a_cache_salt_isolates_within_a_tenant(url: str) -> None:
    messages = [system("Bo"), {"role": "user", "content": "Summarise the incident."}]
    plain, _ = ask(url, "team-a", messages)
    salted, cached = ask(url, "team-a", messages, cache_salt="user-17")
    assert cached <= unseen(url, "team-a") < 10 and salted == plain
    assert ask(url, "team-a", messages, cache_salt="user-17")[1] > 100
    assert ask(url, "team-a", messages, cache_salt="user-18")[1] < 10
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "tiny-random", "messages": messages, "cache_salt": ""},
        headers={"Authorization": f"Bearer {KEYS['team-a']}"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_a_fleet_wide_warm_set_is_shared_and_a_scoped_one_is_not(url: str) -> None:
    shared, scoped = system("Cy"), system("Di")
    question = {"role": "user", "content": "What changed in the last deploy?"}
    # Cold answers first, isolated from everything by a salt of their own.
    cold_shared, _ = ask(url, "team-a", [shared, question], cache_salt="cold")
    cold_scoped, _ = ask(url, "team-a", [scoped, question], cache_salt="cold")

    held = put_and_wait(url, "agents", {"prompts": [{"name": "cy", "messages": [shared]}]})
    assert held["tenants"] is None and held["prompts"][0]["tenant"] is None
    prefix = held["prompts"][0]["tokens"]
    for tenant in KEYS:
        text, cached = ask(url, tenant, [shared, question])
        assert cached >= prefix and text == cold_shared  # every tenant hits it, unchanged
    # With a salt of its own too: the shared run is still shared.
    assert ask(url, "team-b", [shared, question], cache_salt="user-1")[1] >= prefix

    body = {"tenants": ["team-a"], "prompts": [{"name": "di", "messages": [scoped]}]}
    held = put_and_wait(url, "team-a-only", body)
    assert held["tenants"] == ["team-a"] and held["prompts"][0]["tenant"] == "team-a"
    text, cached = ask(url, "team-a", [scoped, question])
    assert cached >= held["prompts"][0]["tokens"] and text == cold_scoped
    text, cached = ask(url, "team-b", [scoped, question])
    assert cached <= unseen(url, "team-b") < 10 and text == cold_scoped


def test_a_warm_set_names_valid_tenants(url: str) -> None:
    prompts = [{"name": "x", "messages": [system("Ed")]}]
    for tenants in ([], ["bad tenant"], ["team-a", "team-a"]):
        body = {"tenants": tenants, "prompts": prompts}
        r = httpx.put(f"{url}/v1/warm-sets/fleet/bad", json=body, headers=AUTH)
        assert r.status_code == 400, (tenants, r.text)
        assert r.json()["error"]["param"].startswith("tenants")


def test_an_open_daemon_keeps_salted_requests_apart(tmp_path: Path) -> None:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=32 << 20))
    with serving(create_app(DaemonSettings(model="tiny-random"), engine=engine)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        messages = [system("Fay"), {"role": "user", "content": "hi"}]

        def cached(**extra: Any) -> int:
            r = client.chat.completions.create(
                model="tiny-random",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=2,
                extra_body=extra or None,
            )
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            return r.usage.prompt_tokens_details.cached_tokens or 0

        assert cached() == 0 and cached() > 100
        assert cached(cache_salt="mine") == 0 and cached(cache_salt="mine") > 100


def test_the_engine_is_told_each_requests_tenant(tmp_path: Path) -> None:
    """Its prefill scheduler takes turns between tenants (`prefill_order.next_tenant`):
    the chat route and the agent APIs' routes name the key's tenant on the request, and
    a tenant-scoped warm set's warm-up names its tenant (a fleet-wide one's, none)."""
    path = tmp_path / "api-keys"
    path.write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    seen: list[str | None] = []
    submit = engine.submit

    def spy(request: GenerationRequest, sink: Any, *, clears_seen: int | None = None) -> None:
        if not request.idle:  # a next turn's prefill runs only when nothing else does
            seen.append(request.tenant)
        submit(request, sink, clears_seen=clears_seen)

    engine.submit = spy  # type: ignore[method-assign]
    settings = DaemonSettings(model="tiny-random", api_keys_file=str(path), admin_token=ADMIN)
    with serving(create_app(settings, engine=engine)) as base:
        ask(base, "team-a", [{"role": "user", "content": "hi"}])
        answer = httpx.post(
            f"{base}/v1/messages",
            headers={"x-api-key": KEYS["team-b"], "anthropic-version": "2023-06-01"},
            json={"model": "tiny-random", "max_tokens": 4, "messages": [
                {"role": "user", "content": "hi"}]},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert seen[-2:] == ["team-a", "team-b"]
        seen.clear()
        put_and_wait(base, "b-only", {"tenants": ["team-b"], "prompts": [
            {"name": "b", "messages": [system("Gil")]}]})  # fmt: skip
        put_and_wait(base, "shared", {"prompts": [{"name": "s", "messages": [system("Hal")]}]})
    assert seen == ["team-b", None]
