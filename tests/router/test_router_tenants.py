"""Client keys and tenants through a real router in front of two real tiny-random
daemons that hold the keys file too, driven by the `openai` and `anthropic` SDKs: no key,
no answer (router and daemons alike, in each API's shape), and only the probes answer
without a key (metrics, status and the API document need one, or the admin token); a
tenant's blocks are keyed with its salt and the router predicts exactly what each
tenant's request finds cached (another tenant's identical prompt: nothing but the
template's header); a fleet-wide warm set is predicted and hit for every tenant;
sessions are per tenant; a client cannot name a tenant itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from support.processes import Daemon
from support.router import AUTH, TOKEN, start_router_for, status, tiny_daemons, wait_following

USER = {"role": "user", "content": "x"}
KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-fedcba9876543210"}


def system(name: str) -> dict[str, str]:
    return {"role": "system", "content": f"You are {name}, the release team's assistant. " * 8}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    return path


@pytest.fixture(scope="module")
def daemons(keys_file: Path) -> Iterator[list[Daemon]]:
    with tiny_daemons("--api-keys-file", str(keys_file), tokens=[TOKEN] * 2) as started:
        yield started


@pytest.fixture(scope="module")
def router(
    daemons: list[Daemon], keys_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("router")
    r = start_router_for(daemons, folder, "--api-keys-file", str(keys_file))
    wait_following(r, 2)
    yield r
    r.stop()


def client(router: Daemon, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key=KEYS[tenant], max_retries=0)


def ask(router: Daemon, tenant: str, messages: list[dict[str, str]], **kw: Any) -> tuple[int, str]:
    raw = client(router, tenant).chat.completions.with_raw_response.create(
        model="default", messages=messages, temperature=0, max_tokens=4, **kw
    )
    r = raw.parse()
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    cached = r.usage.prompt_tokens_details.cached_tokens or 0
    decision = last_decision(router)
    assert decision["predicted_cached_tokens"] == cached, decision
    return cached, raw.headers["x-warmfleet-backend"]


def last_decision(router: Daemon) -> dict[str, Any]:
    seen = len(status(router)["decisions"])
    for _ in range(50):  # recorded when the response ends, a moment after the client has it
        decisions = status(router)["decisions"]
        if decisions and len(decisions) >= seen:
            return decisions[0]
        time.sleep(0.05)
    raise AssertionError("no decision recorded")


def test_no_key_no_answer(router: Daemon, daemons: list[Daemon]) -> None:
    wrong = openai.OpenAI(base_url=f"{router.url}/v1", api_key="sk-wrong-0000000000", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    assert refused.value.response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model="default", input="x")
    bad = anthropic.Anthropic(base_url=router.url, api_key="sk-wrong-0000000000", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused_a:
        bad.messages.create(model="default", max_tokens=2, messages=[USER])
    assert refused_a.value.response.json()["error"]["type"] == "authentication_error"
    missing = httpx.post(f"{router.url}/v1/completions", json={"model": "default", "prompt": "x"})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    for d in daemons:  # behind the router, and reached directly: the same
        direct = httpx.post(f"{d.url}/v1/completions", json={"model": "default", "prompt": "x"})
        assert direct.status_code == 401
    assert [m.id for m in client(router, "team-a").models.list()]
    good = anthropic.Anthropic(base_url=router.url, api_key=KEYS["team-b"], max_retries=0)
    ask_b = [{"role": "user", "content": "x"}]
    assert good.messages.create(model="default", max_tokens=2, messages=ask_b).role == "assistant"  # type: ignore[arg-type]


def test_only_the_probes_answer_without_a_key(router: Daemon, daemons: list[Daemon]) -> None:
    for url in [router.url, *(d.url for d in daemons)]:
        for path in ("/healthz", "/readyz"):
            assert httpx.get(f"{url}{path}").status_code == 200, (url, path)
        status_path = "/v1/router/status" if url == router.url else "/v1/status"
        for path in ("/metrics", "/openapi.json", "/docs", status_path):
            refused = httpx.get(f"{url}{path}")
            assert refused.status_code == 401, (url, path)
            assert refused.json()["error"]["code"] == "missing_api_key", (url, path)
            wrong = httpx.get(f"{url}{path}", headers={"x-api-key": "sk-wrong-0000000000"})
            assert wrong.status_code == 401, (url, path)
            for given in ({"x-api-key": KEYS["team-a"]}, {"Authorization": f"Bearer {TOKEN}"}):
                assert httpx.get(f"{url}{path}", headers=given).status_code == 200, (url, path)
    # A client key reads the router's counts, not its detail (backend URLs, decisions).
    counts = httpx.get(
        f"{router.url}/v1/router/status", headers={"Authorization": f"Bearer {KEYS['team-a']}"}
    ).json()
    assert isinstance(counts["decisions"], int) and isinstance(status(router)["decisions"], list)


def test_tenants_never_share_blocks_and_predictions_stay_exact(router: Daemon) -> None:
    messages = [system("Ada"), {"role": "user", "content": "Is the release green?"}]
    ask(router, "team-a", messages)
    cached, _ = ask(router, "team-a", messages)
    assert cached > 50
    time.sleep(0.5)  # the daemons' events reach the router within milliseconds
    cached, _ = ask(router, "team-b", messages)
    assert cached < 10  # at most the chat template's header
    time.sleep(0.5)
    assert ask(router, "team-b", messages)[0] > 50
    # A header naming a tenant is the router's alone: dropped, the key decides.
    cached, _ = ask(router, "team-a", messages, extra_headers={"x-warmfleet-tenant": "team-b"})
    assert cached > 50
    cached, _ = ask(router, "team-a", messages, extra_body={"cache_salt": "user-1"})
    assert cached < 10


def test_a_fleet_wide_warm_set_is_predicted_and_hit_for_every_tenant(
    router: Daemon, daemons: list[Daemon]
) -> None:
    shared = system("Cy")
    spec = {"generation": 1, "prompts": [{"name": "cy", "messages": [shared]}]}
    for d in daemons:
        r = httpx.put(f"{d.url}/v1/warm-sets/fleet/cy", json=spec, headers=AUTH, timeout=30)
        assert r.status_code == 202, r.text
    for d in daemons:
        deadline = time.monotonic() + 60
        while httpx.get(f"{d.url}/readyz", params={"warm": 1}).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    # The router reads the warm sets (and so what each daemon shares) every 10 s.
    deadline = time.monotonic() + 15
    while not all(b["warm_sets"] for b in status(router)["backends"]):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    prefix = httpx.get(f"{daemons[0].url}/v1/warm-sets/fleet/cy", headers=AUTH).json()
    tokens = prefix["prompts"][0]["tokens"]
    for i, tenant in enumerate(["team-a", "team-b", "team-a", "team-b"]):
        question = {"role": "user", "content": f"Deploy {i}: what changed?"}
        cached, _ = ask(router, tenant, [shared, question])  # predicted == served, asserted
        assert cached >= tokens


def test_sessions_are_per_tenant(router: Daemon) -> None:
    messages = [system("Di"), {"role": "user", "content": "hello"}]
    session = {"x-session-affinity": "shared-looking-session-id"}
    ask(router, "team-a", messages, extra_headers=session)
    a = last_decision(router)["session"]
    ask(router, "team-b", messages, extra_headers=session)
    b = last_decision(router)["session"]
    assert a and b and a != b


def test_a_tenant_over_its_share_stays_off_the_backend_another_tenant_uses(
    daemons: list[Daemon], keys_file: Path, tmp_path: Path
) -> None:
    # A router of its own: what the module's router saw of the tenants is not this test's.
    front = start_router_for(daemons, tmp_path, "--api-keys-file", str(keys_file))
    held: list[Any] = []
    try:
        wait_following(front, 2)
        steady = client(front, "team-a").chat.completions.with_raw_response.create(
            model="default", messages=[system("Steady"), USER], max_tokens=4
        )
        theirs = steady.headers["x-warmfleet-backend"]
        backends = []
        for i in range(4):  # each held open: team-b's requests stay in flight
            raw = client(front, "team-b").chat.completions.with_raw_response.create(
                model="default", messages=[system(f"Burst {i}"), USER], max_tokens=512, stream=True
            )
            backends.append(raw.headers["x-warmfleet-backend"])
            held.append(raw.parse())
            next(iter(held[-1]))
        # From its second request on, team-b holds its share (2 backends, 2 tenants): it
        # is kept off the backend team-a used a moment ago, although that one is idle.
        assert theirs not in backends[1:], (theirs, backends)
    finally:
        for stream in held:
            stream.close()
        front.stop()
