"""Several simultaneous streams through a real uvicorn server: each gets its own
output, disconnects free their batch slot, and the daemon shuts down cleanly."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx

QUESTIONS = [
    "What is a pod?",
    "Explain a Kubernetes Service in one sentence.",
    "What is Grafana used for?",
    "Why cache prompts?",
    "What is a readiness probe?",
    "Name three Helm commands.",
]


def body(question: str, stream: bool) -> dict:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 16,
        "stream": stream,
    }


def stream_text(url: str, question: str) -> str:
    parts = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body(question, True), timeout=120
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:])["choices"]
                if choices:
                    parts.append(choices[0]["delta"].get("content", ""))
    return "".join(parts)


def test_simultaneous_streams_each_get_their_own_output(embedded_daemon) -> None:
    url = embedded_daemon.url
    solo = [
        httpx.post(f"{url}/v1/chat/completions", json=body(q, False), timeout=120).json()[
            "choices"
        ][0]["message"]["content"]
        for q in QUESTIONS
    ]
    results: dict[int, str] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, stream_text(url, QUESTIONS[i])))
        for i in range(len(QUESTIONS))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [results[i] for i in range(len(QUESTIONS))] == solo
    assert len(set(solo)) == len(solo)


def test_client_disconnect_mid_stream_frees_the_slot(tiny_daemon) -> None:
    url = tiny_daemon.url
    request = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "go on forever"}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert httpx.get(f"{url}/v1/status").json()["engine"]["running"] == 1
    deadline = time.monotonic() + 20
    while httpx.get(f"{url}/v1/status").json()["engine"]["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    status = httpx.get(f"{url}/v1/status").json()["engine"]
    assert status["running"] == 0 and status["generated_tokens_total"] < 4000


def test_non_streaming_disconnect_frees_the_slot(tiny_daemon) -> None:
    url = tiny_daemon.url
    request = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 4000,
        "ignore_eos": True,
    }
    with contextlib.suppress(httpx.TimeoutException):  # the client gives up after 1 s
        httpx.post(f"{url}/v1/chat/completions", json=request, timeout=1.0)
    deadline = time.monotonic() + 20
    while httpx.get(f"{url}/v1/status").json()["engine"]["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(f"{url}/v1/status").json()["engine"]["running"] == 0


def test_daemon_exits_cleanly_on_interrupt(daemon_factory) -> None:
    daemon = daemon_factory("--model", "tiny-random")
    httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={
            "model": "tiny-random",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
        },
        timeout=60,
    )
    assert daemon.stop() == 0
