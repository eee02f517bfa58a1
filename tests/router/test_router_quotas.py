"""Quotas per tenant through a real router in front of a real tiny-random daemon, driven
by the `openai` and `anthropic` SDKs: a tenant over a limit gets a 429 with Retry-After in
its API's shape while other tenants are served; a stream holds its concurrency slot to
its end; usage per tenant (tokens in, cached, out: a stream's too) and refusals are on
`/metrics`; the quotas file is read again when it changes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from support.processes import Daemon
from support.router import AUTH, TOKEN, start_router_for, tiny_daemons, wait_following

KEYS = {t: f"sk-{t}-0123456789abcdef" for t in ("team-a", "team-b", "team-c")}
QUOTAS = """
default: {concurrent_requests: 8}
tenants:
  team-a: {requests_per_minute: 2}
  team-b: {concurrent_requests: 1}
"""
ASK = [
    {"role": "system", "content": "You are Quota, the platform's budget bot. " * 6},
    {"role": "user", "content": "How much is left?"},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("quotas")
    (folder / "keys").write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    (folder / "quotas.yaml").write_text(QUOTAS)
    return {"keys": folder / "keys", "quotas": folder / "quotas.yaml", "dir": folder}


@pytest.fixture(scope="module")
def router(files: dict[str, Path]) -> Iterator[Daemon]:
    with tiny_daemons(tokens=[TOKEN]) as daemons:
        r = start_router_for(
            daemons,
            files["dir"],
            "--api-keys-file",
            str(files["keys"]),
            "--quotas",
            str(files["quotas"]),
        )
        wait_following(r, 1)
        yield r
        r.stop()


def client(router: Daemon, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key=KEYS[tenant], max_retries=0)


def chat(router: Daemon, tenant: str) -> None:
    client(router, tenant).chat.completions.create(
        model="default",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=3,
    )


def metric(router: Daemon, name: str, **labels: str) -> float:
    text = httpx.get(f"{router.url}/metrics", headers=AUTH).text  # metrics need a key or the token
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def tokens(router: Daemon, tenant: str) -> dict[str, float]:
    name = "warmfleet_router_tenant_tokens_total"
    return {
        kind: metric(router, name, warmfleet_tenant=tenant, gen_ai_token_type=kind)
        for kind in ("input", "cached", "output")
    }


def test_a_tenant_over_its_rate_gets_a_429_in_its_api_shape(router: Daemon) -> None:
    chat(router, "team-a")
    chat(router, "team-a")
    with pytest.raises(openai.RateLimitError) as refused:
        chat(router, "team-a")
    answer = refused.value.response
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"
    assert "requests per minute" in answer.json()["error"]["message"]
    bad = anthropic.Anthropic(base_url=router.url, api_key=KEYS["team-a"], max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as refused_a:
        bad.messages.create(model="default", max_tokens=2, messages=ASK[1:])  # type: ignore[arg-type]
    assert refused_a.value.response.json()["error"]["type"] == "rate_limit_error"
    assert int(refused_a.value.response.headers["retry-after"]) >= 1
    chat(router, "team-c")  # the others are served meanwhile
    throttled = metric(
        router, "warmfleet_router_tenant_throttled_total", warmfleet_tenant="team-a",
        warmfleet_quota_limit="requests_per_minute",
    )  # fmt: skip
    assert throttled >= 2


def test_a_stream_holds_its_concurrency_slot_to_its_end(router: Daemon) -> None:
    held = client(router, "team-b").chat.completions.create(
        model="default",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=64,
        stream=True,
    )
    next(iter(held))  # the stream has begun; the request is in flight until it ends
    with pytest.raises(openai.RateLimitError) as refused:
        chat(router, "team-b")
    assert "concurrent requests" in refused.value.response.json()["error"]["message"]
    for _ in held:
        pass
    deadline = time.monotonic() + 10
    while True:  # its end is counted a moment after the client read it
        try:
            chat(router, "team-b")
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_usage_per_tenant_is_on_the_metrics(router: Daemon) -> None:
    before = tokens(router, "team-c")
    # A stream without include_usage: the daemon tells the router in a comment.
    stream = client(router, "team-c").chat.completions.create(
        model="default",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=4,
        stream=True,
    )
    chunks = cast(list[ChatCompletionChunk], list(stream))  # ASK's ignore hides the overload
    assert all(c.usage is None for c in chunks)  # the client sees no usage it did not ask for
    chat(router, "team-c")
    time.sleep(0.5)
    after = tokens(router, "team-c")
    assert after["input"] - before["input"] >= 2 * 50
    assert after["cached"] > before["cached"]  # the second found the first's blocks
    assert after["output"] - before["output"] >= 2
    ok = metric(
        router, "warmfleet_router_tenant_requests_total", warmfleet_tenant="team-c",
        warmfleet_outcome="ok",
    )  # fmt: skip
    assert ok >= 2


def test_the_quotas_file_is_read_again(router: Daemon, files: dict[str, Path]) -> None:
    with pytest.raises(openai.RateLimitError):
        chat(router, "team-a")
    aside = files["dir"] / "quotas.new"
    aside.write_text("tenants: {team-a: {requests_per_minute: 1000}}\n")
    aside.replace(files["quotas"])
    deadline = time.monotonic() + 10
    while True:
        try:
            chat(router, "team-a")
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the new limit was never read"
            time.sleep(0.3)
