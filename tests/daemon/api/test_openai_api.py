"""The HTTP API in process (FastAPI TestClient, the tiny model): shapes, streaming,
usage, and bad input that gets a 4xx with an OpenAI error body and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from support.engine import model
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

SYSTEM = {"role": "system", "content": "You are the release bot of a payments team. " * 10}


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = DaemonSettings(model="tiny-random", max_request_bytes=64 * 1024)
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=1 << 28))
    with TestClient(create_app(settings, engine=engine)) as c:
        yield c


def chat(client: TestClient, **body: object) -> dict:
    body = {"model": "tiny-random", "messages": [SYSTEM, {"role": "user", "content": "hi"}], **body}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(text: str) -> list[object]:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_chat_completion_shape_and_cached_tokens_on_a_shared_system_prompt(client) -> None:
    first = chat(client, temperature=0, max_tokens=5)
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["message"]["role"] == "assistant"
    assert first["choices"][0]["finish_reason"] in ("stop", "length")
    usage = first["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    second = chat(
        client,
        messages=[SYSTEM, {"role": "user", "content": "a different question"}],
        temperature=0,
        max_tokens=5,
    )
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 100


def test_streaming_matches_non_streaming_and_reports_usage(client) -> None:
    full = chat(client, temperature=0, max_tokens=8)
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny-random",
            "messages": [SYSTEM, {"role": "user", "content": "hi"}],
            "temperature": 0,
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == full["choices"][0]["message"]["content"]
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    assert finishes[-1] == full["choices"][0]["finish_reason"]
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_completions_with_text_and_token_prompts(client) -> None:
    r = client.post(
        "/v1/completions",
        json={"model": "tiny-random", "prompt": "Once upon", "max_tokens": 4, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 4
    r = client.post(
        "/v1/completions",
        json={"model": "tiny-random", "prompt": [1, 2, 3], "max_tokens": 2, "stream": True},
    )
    assert r.status_code == 200
    assert all(e["object"] == "text_completion" for e in sse_events(r.text))


def test_models_status_health(client) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-random"
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    chat(client, max_tokens=2)
    status = client.get("/v1/status").json()
    assert status["engine"]["running"] == 0 and status["engine"]["waiting"] == 0
    cache = status["cache"]
    assert cache["entry_count"] > 0 and cache["bytes"] <= cache["budget_bytes"]
    assert 0 <= cache["hit_rate"] <= 1 and cache["queried_tokens"] > 0


BAD_BODIES = [
    pytest.param(b"{not json", 400, None, id="malformed-json"),
    pytest.param(
        {"model": "tiny-random", "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages.0.role",
        id="unknown-role",
    ),
    pytest.param({"model": "tiny-random", "messages": []}, 400, "messages", id="empty-messages"),
    pytest.param(
        {"model": "tiny-random", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        400,
        "max_tokens",
        id="max-tokens-zero",
    ),
    pytest.param(
        {"model": "tiny-random", "messages": [{"role": "user", "content": "x"}], "temperature": 5},
        400,
        "temperature",
        id="temperature-range",
    ),
    pytest.param(
        {"model": "tiny-random", "messages": [{"role": "user", "content": "x"}], "n": 17},
        400,
        "n",
        id="n-over-16",
    ),
    pytest.param(
        {
            "model": "tiny-random",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        400,
        None,
        id="image-part",
    ),
    pytest.param(
        {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        404,
        "model",
        id="unknown-model",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": "x"}]}, 400, "model", id="missing-model"
    ),
    pytest.param(
        {
            "model": "tiny-random",
            "messages": [{"role": "user", "content": "x"}],
            "stop": ["a"] * 20,
        },
        400,
        "stop",
        id="too-many-stops",
    ),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_BODIES)
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(
    client, body, status, param
) -> None:
    before = client.get("/v1/status").json()["engine"]["requests_total"]
    if isinstance(body, bytes):
        r = client.post(
            "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
        )
    else:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param
    assert client.get("/v1/status").json()["engine"]["requests_total"] == before
    chat(client, max_tokens=1)


def test_prompt_longer_than_the_context_is_rejected(client) -> None:
    long_text = "word " * 9000  # over the tiny model's 8192-token context
    r = client.post("/v1/completions", json={"model": "tiny-random", "prompt": long_text})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_body_over_the_size_limit_is_413(client) -> None:
    big = {"model": "tiny-random", "messages": [{"role": "user", "content": "x" * 100_000}]}
    r = client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"model": "tiny-random", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}]}'

    r = client.post(
        "/v1/chat/completions", content=chunked(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413
    chat(client, max_tokens=1)


def test_model_routes_answer_503_until_the_model_loads() -> None:
    settings = DaemonSettings(model="/nonexistent/model.gguf")
    with TestClient(create_app(settings)) as c:
        import time

        for _ in range(100):
            if c.get("/readyz").json()["status"] != "loading":
                break
            time.sleep(0.05)
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        r = c.post(
            "/v1/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
        assert c.get("/healthz").status_code == 200
