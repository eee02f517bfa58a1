"""Bad input and unexpected errors over real HTTP (uvicorn in a thread, tiny model):
out-of-range seeds and lone surrogates are 400s naming the parameter; an unexpected
error is an OpenAI-style 500 that leaves the keep-alive connection usable, and a
stream that fails ends with an error event and [DONE]."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from support.engine import model
from support.processes import serving
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.api.errors import error_body
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings


@pytest.fixture(scope="module")
def app() -> FastAPI:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    return create_app(DaemonSettings(model="tiny-random"), engine=engine)


@pytest.fixture(scope="module")
def url(app: FastAPI) -> Iterator[str]:
    with serving(app) as base:
        yield base


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-random",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "hello"}],
        **extra,
    }


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps escapes lone surrogates as \ud800, as a hostile client would send them
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=60)


@pytest.mark.parametrize("seed", [-1, 2**64, -(2**70)])
@pytest.mark.parametrize("stream", [False, True])
def test_seeds_out_of_range_are_refused(url: str, seed: int, stream: bool) -> None:
    r = post(url, "/v1/chat/completions", chat(seed=seed, stream=stream))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "seed"


def test_the_largest_seed_is_served(url: str) -> None:
    r = post(url, "/v1/chat/completions", chat(seed=2**64 - 1, temperature=1.0))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": "\ud800x"}]),
            "messages",
        ),
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]),
            "messages",
        ),
        (
            "/v1/completions",
            {"model": "tiny-random", "prompt": "x\ud800", "max_tokens": 2},
            "prompt",
        ),
    ],
)
def test_lone_surrogates_are_refused(url: str, path: str, body: dict, param: str) -> None:
    r = post(url, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"]


def test_an_unexpected_error_keeps_the_connection(
    app: FastAPI, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app.state.daemon.ready.prompts, "chat", broken)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(chat()),
        headers={"content-type": "application/json"},
    )
    first = conn.getresponse()
    body = json.loads(first.read())
    assert first.status == 500
    assert body["error"]["type"] == "server_error" and "RuntimeError" in body["error"]["message"]
    sock = conn.sock
    conn.request("GET", "/v1/models")  # on the same connection
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["data"]
    assert conn.sock is sock
    conn.close()


def test_a_stream_that_fails_ends_with_an_error_event_and_done(
    app: FastAPI, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = app.state.daemon.ready.engine

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("sampler exploded")

    monkeypatch.setattr(engine, "submit", broken)
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=chat(stream=True), timeout=60
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["error"]["type"] == "server_error"


def test_image_parts_say_images_are_not_supported(url: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    content = [{"type": "text", "text": "What is in it?"}, image]
    r = post(url, "/v1/chat/completions", chat(messages=[{"role": "user", "content": content}]))
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "'image_url' are not supported" in message and "text only" in message


def test_error_bodies_can_quote_lone_surrogates() -> None:
    body = error_body("no model `gpt-\ud800`", "invalid_request_error", "model")
    assert json.dumps(body, ensure_ascii=False).encode()  # a 500 if this raised
    assert "gpt-\\ud800" in body["error"]["message"]
