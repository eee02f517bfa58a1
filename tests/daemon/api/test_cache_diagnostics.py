"""Live cache diagnostics (in process, tiny model): requests that miss because their
system prompt carries a timestamp are reported at the timestamp's token, with the text
there, against the warmed prefix; /v1/status gets a summary without any prompt text."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from support.engine import model
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

TOKEN = "diag-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RULES = "You are Scout, the SRE team's log analyst. Answer in three lines at most. " * 6


@pytest.fixture
def client() -> Iterator[TestClient]:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(model="tiny-random", admin_token=TOKEN)
    with TestClient(create_app(settings, engine=engine)) as c:
        yield c


def ask(client: TestClient, system: str, question: str) -> dict:
    body = {
        "model": "tiny-random",
        "max_tokens": 2,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_misses_are_traced_to_the_timestamp_in_the_system_prompt(client: TestClient) -> None:
    warm = {
        "generation": 1,
        "prompts": [{"name": "scout", "messages": [{"role": "system", "content": RULES}]}],
    }
    assert client.put("/v1/warm-sets/sre/scout", json=warm, headers=AUTH).status_code == 202
    deadline = time.monotonic() + 60
    while client.get("/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    for n in range(3):  # the warmed prompt as intended: hits
        assert (
            ask(client, RULES, f"errors in shard {n}?")["usage"]["prompt_tokens_details"][
                "cached_tokens"
            ]
            > 0
        )
    stamped = [f"Now: 2025-05-{day:02d}T0{day % 10}:15:00Z. {RULES}" for day in range(1, 9)]
    for n, system in enumerate(stamped):
        ask(client, system, f"what broke at {n}?")

    assert client.get("/v1/cache/diagnostics").status_code == 401
    report = client.get("/v1/cache/diagnostics", headers=AUTH).json()
    assert report["window"]["requests"] == 11 and report["window"]["misses"] == 8
    assert report["window"]["warm_prefixes"] == 1
    top = report["points"][0]
    builder = PromptBuilder(model("tiny-random").tokenizer)
    rendered = builder.chat(
        [{"role": "system", "content": stamped[0]}, {"role": "user", "content": "x"}]
    )
    assert rendered.text is not None
    offset = rendered.text.index("2025-05-")
    expected = next(
        k
        for k in range(len(rendered.tokens))
        if len(builder.decode(rendered.tokens[: k + 1])) > offset
    )
    assert (top["kind"], top["position"]) == ("date/time", expected)
    # Each stamped request differs from the previous one at the timestamp; the first
    # one differs from the warmed prefix where its "Now: ..." was inserted.
    assert top["requests"] == 7
    assert {p["kind"] for p in report["points"]} == {"date/time"}
    assert sum(p["requests"] for p in report["points"]) == 8
    assert top["reference"].startswith("2025-05-") or top["variants"][0].startswith("2025-05-")
    assert "Now: ⟦2025-05-" in top["excerpt"] and "date/time at token" in top["message"]
    assert any(f["topic"] == "date/time" for f in report["findings"])

    summary = client.get("/v1/status").json()["diagnostics"]
    assert summary["misses"] == 8
    assert summary["divergences"][0] == {"token": expected, "kind": "date/time", "requests": 7}
    assert "2025" not in json.dumps(summary)  # no prompt text on the unauthenticated route


def test_no_traffic_no_findings(client: TestClient) -> None:
    report = client.get("/v1/cache/diagnostics", headers=AUTH).json()
    assert report["window"] == {
        "size": 256,
        "requests": 0,
        "misses": 0,
        "warm_prefixes": 0,
        "hit_rate": 0.0,
    }
    assert report["points"] == [] and report["analysis"] is None
    assert client.get("/v1/status").json()["diagnostics"]["divergences"] == []
