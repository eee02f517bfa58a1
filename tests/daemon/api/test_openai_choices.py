"""`n` choices, logprobs on /v1/completions and `user`, in process on the tiny model."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from support.engine import model
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

MESSAGES = [
    {"role": "system", "content": "You summarize incident reports for the SRE team. " * 8},
    {"role": "user", "content": "Summarize: the checkout API returned 502s for 4 minutes."},
]


@pytest.fixture
def client() -> Iterator[TestClient]:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=1 << 28))
    with TestClient(create_app(DaemonSettings(model="tiny-random"), engine=engine)) as c:
        yield c


def events(text: str) -> list[dict]:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_n_choices_share_one_prefill_of_the_prompt(client) -> None:
    body = {"model": "tiny-random", "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    r = client.post("/v1/chat/completions", json={**body, "n": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in out["choices"]}) == 1  # greedy
    usage = out["usage"]
    assert usage["completion_tokens"] == 3 * 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 18
    engine = client.get("/v1/status").json()["engine"]
    assert engine["prefill_tokens_total"] == usage["prompt_tokens"]  # computed once

    # Sampled choices differ; streamed, each choice has its own deltas and finish.
    r = client.post(
        "/v1/chat/completions",
        json={**body, "n": 2, "temperature": 1.0, "seed": 7, "stream": True, "max_tokens": 8},
    )
    chunks = [c for e in events(r.text) for c in e["choices"]]
    texts = {
        i: "".join(c["delta"].get("content", "") for c in chunks if c["index"] == i) for i in (0, 1)
    }
    assert texts[0] != texts[1]
    assert sorted(c["index"] for c in chunks if c["finish_reason"]) == [0, 1]


def test_completion_logprobs_whole_and_streamed(client) -> None:
    body = {"model": "tiny-random", "prompt": "The incident began when", "max_tokens": 5}
    r = client.post("/v1/completions", json={**body, "temperature": 0, "logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    # The text is the tokens, leading space included: a completion continues its prompt.
    assert "".join(lp["tokens"]) == choice["text"]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == 5
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    r = client.post(
        "/v1/completions", json={**body, "temperature": 0, "logprobs": 0, "stream": True}
    )
    streamed = [c for e in events(r.text) for c in e["choices"] if c["logprobs"]]
    assert [t for c in streamed for t in c["logprobs"]["tokens"]] == lp["tokens"]


def test_user_is_recorded_in_the_logs(client, caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="warmfleet_daemon.engine.core"):
        r = client.post(
            "/v1/chat/completions",
            json={"model": "tiny-random", "messages": MESSAGES, "max_tokens": 2, "user": "agent-7"},
        )
        assert r.status_code == 200
    assert any("'agent-7'" in record.getMessage() for record in caplog.records)


def test_chat_logprobs_streamed_match_the_whole_response(client) -> None:
    body = {
        "model": "tiny-random",
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]
    r = client.post("/v1/chat/completions", json={**body, "stream": True})
    streamed = [
        entry
        for e in events(r.text)
        for c in e["choices"]
        if c["logprobs"]
        for entry in c["logprobs"]["content"]
    ]
    assert streamed == whole["content"] and len(streamed) == 6
    assert all(len(entry["top_logprobs"]) == 2 for entry in streamed)
