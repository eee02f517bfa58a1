"""`warmfleet warm-prompts capture` against the official `anthropic` and `openai` SDKs:
each API's first request is answered with a short reply the SDK reads as a normal
response (streamed or not), and its static part is written as a warm prompt of that
API's shape, plus the WarmPromptSet printed on stdout; what cannot be captured gets
the API's own error and an exit status saying so; reads are bounded."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from support.processes import free_port
from warmfleet_cli.main import main
from warmfleet_cli.warm_prompts import capture
from warmfleet_common.agent_apis.prefix import warm_prompt

SYSTEM = "You are Quill, the docs team's writing assistant. Prefer short sentences."
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
FUNCTION = {
    "type": "function",
    "name": "run_tests",
    "description": "Run the test suite",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


CAPTURED = "warmfleet captured the warm prompt"  # what the reply says when it captured


def said_captured(text: str | None) -> bool:
    """The reply says its request was captured (and not that it was "not captured")."""
    return text is not None and text.startswith(CAPTURED) and "not captured" not in text


class Run:
    def __init__(self, port: int, out: Path) -> None:
        self.port, self.out = port, out
        self.code: int | None = None
        self.ended: float | None = None  # time.monotonic() when the command returned
        self.url = f"http://127.0.0.1:{port}"

    def entries(self) -> list[dict[str, Any]]:
        return list(json.loads(self.out.read_text()))


@contextmanager
def capturing(tmp_path: Path, *args: str, out: str = "agents.json") -> Iterator[Run]:
    """`warmfleet warm-prompts capture --out FILE ARGS` in a thread, listening."""
    run = Run(free_port(), tmp_path / out)
    argv = ["warm-prompts", "capture", "--port", str(run.port), "--out", str(run.out)]
    argv += ["--timeout", "60", *args]

    def target() -> None:
        run.code = main(argv)
        run.ended = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", run.port), timeout=1).close()
            break
        except OSError:
            assert thread.is_alive() and time.monotonic() < deadline, "capture did not listen"
            time.sleep(0.02)
    yield run
    thread.join(timeout=30)
    assert not thread.is_alive(), "the capture did not stop"


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request without tools waits this long for one with tools, the endpoint lingers
    this long after its capture (5 s each in use)."""
    monkeypatch.setattr(capture, "SIDE_REQUEST_WAIT_S", 0.5)
    monkeypatch.setattr(capture, "LINGER_S", 0.3)


def claude(run: Run) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=run.url, api_key="unused", max_retries=0)


def oai(run: Run) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{run.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_the_anthropic_sdk_gets_a_reply_and_its_prompt_is_written(
    tmp_path: Path, stream: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    request: dict[str, Any] = {
        "model": "claude-opus-5-5",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": "Fix the typo in README.md"}],
        "tools": [WEATHER],
        "thinking": {"type": "adaptive"},
    }
    with capturing(tmp_path) as run:
        if stream:
            with claude(run).messages.stream(**request) as events:
                message = events.get_final_message()
        else:
            message = claude(run).messages.create(**request)
    assert message.stop_reason == "end_turn"
    (block,) = message.content
    assert block.type == "text" and said_captured(block.text) and str(run.out) in block.text
    assert run.code == 0
    expected = warm_prompt("anthropic", request, "anthropic-agent")
    assert run.entries() == [expected.model_dump(mode="json", exclude_none=True)]
    assert run.entries()[0]["anthropic"] == {
        "system": SYSTEM,  # the billing header left out, as every request's
        "tools": [WEATHER],
        "thinking": {"type": "adaptive"},
    }
    wps = yaml.safe_load(capsys.readouterr().out)
    assert wps["kind"] == "WarmPromptSet" and wps["spec"]["prompts"] == run.entries()


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_sdks_responses_and_chat_get_replies(tmp_path: Path, stream: bool) -> None:
    responses_request: dict[str, Any] = {
        "model": "gpt-5",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": SYSTEM}],
            },
            {"type": "message", "role": "user", "content": "Run the tests"},
        ],
        "tools": [FUNCTION, {"type": "web_search"}],
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": False,
    }
    with capturing(tmp_path, "--name", "codex-like") as run:
        if stream:
            with oai(run).responses.stream(**responses_request) as events:
                response = events.get_final_response()
        else:
            response = oai(run).responses.create(**responses_request)
    assert response.status == "completed" and said_captured(response.output_text)
    assert run.code == 0
    (entry,) = run.entries()
    assert entry == {
        "name": "codex-like",
        "responses": {
            "input": [{"type": "message", "role": "developer", "content": SYSTEM}],
            "tools": [FUNCTION],  # the hosted web_search is not part of the prompt
            "reasoning": {"effort": "low"},
        },
    }

    chat_request: dict[str, Any] = {
        "model": "any",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "run_tests", "parameters": {}}}],
    }
    with capturing(tmp_path) as run:  # the same file: the entry is added
        if stream:
            chunks = list(oai(run).chat.completions.create(**chat_request, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            text = oai(run).chat.completions.create(**chat_request).choices[0].message.content
    assert said_captured(text) and run.code == 0
    assert [e["name"] for e in run.entries()] == ["codex-like", "chat-agent"]
    assert run.entries()[1] == {
        "name": "chat-agent",
        "messages": [{"role": "system", "content": SYSTEM}],
        "tools": chat_request["tools"],
    }


def test_what_is_not_captured_is_answered_and_the_capture_goes_on(tmp_path: Path) -> None:
    with capturing(tmp_path, "--format", "yaml", out="agents.yaml") as run:
        lost = httpx.post(f"{run.url}/v1/v1/messages", json={})  # a base URL ending in /v1
        assert lost.status_code == 404 and "/v1/v1/messages" in lost.json()["error"]["message"]
        first = claude(run).messages.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": "quota"}]
        )
        (block,) = first.content
        assert block.type == "text" and block.text.startswith("warmfleet capture: not captured")
        assert not run.out.exists()
        claude(run).messages.create(
            model="m", max_tokens=5, system=SYSTEM, messages=[{"role": "user", "content": "Hi"}]
        )
    assert run.code == 0
    assert yaml.safe_load(run.out.read_text()) == [
        {"name": "anthropic-agent", "anthropic": {"system": SYSTEM}}
    ]


def test_a_side_request_sent_along_is_answered_and_the_agents_own_is_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """opencode sends its title request (a system prompt, no tools) a few ms before its
    own (system prompt and tools): the capture keeps its own, named after it."""
    monkeypatch.setattr(capture, "SIDE_REQUEST_WAIT_S", 5.0)
    agent = "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14"
    title: dict[str, Any] = {
        "model": "default",
        "messages": [
            {"role": "system", "content": "You are a title generator."},
            {"role": "user", "content": "Generate a title for this conversation:"},
        ],
    }
    own: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
    }
    replies: dict[str, str] = {}
    with capturing(tmp_path) as run:
        client = openai.OpenAI(
            base_url=f"{run.url}/v1", api_key="unused", max_retries=0,
            default_headers={"User-Agent": agent},
        )  # fmt: skip

        def send(name: str, request: dict[str, Any]) -> None:
            reply = client.chat.completions.create(**request)
            replies[name] = str(reply.choices[0].message.content)

        side = threading.Thread(target=send, args=("title", title))
        side.start()
        time.sleep(0.2)
        send("own", own)
        side.join(timeout=10)
    assert "not captured" in replies["title"] and said_captured(replies["own"])
    assert run.code == 0
    assert run.entries() == [
        {"name": "opencode", "messages": own["messages"][:1], "tools": own["tools"]}
    ]


@pytest.mark.parametrize(
    ("agent", "name"),
    [
        ("claude-cli/2.1.332 (external, sdk-cli)", "claude-code"),
        ("codex_exec/0.171.0 (Ubuntu 24.4.0; x86_64)", "codex"),
        ("opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14", "opencode"),
        ("QwenCode/0.15.10 (linux; x64)", "qwen-code"),
        ("OpenAI/Python 2.8.1", "chat-agent"),
    ],
)
def test_the_agent_is_named_from_its_user_agent(agent: str, name: str) -> None:
    assert capture.default_name("chat", agent) == name


def test_requests_after_the_capture_are_answered_until_the_endpoint_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen Code sends its memory extraction ~4 s after its turn ends: answered, not
    captured, and the endpoint stops LINGER_S after the last request: the late request
    re-arms the linger, so the endpoint outlives the first linger by the time between."""
    linger = 1.0
    monkeypatch.setattr(capture, "LINGER_S", linger)
    request: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
    }
    with capturing(tmp_path) as run:
        first = oai(run).chat.completions.create(**request)
        time.sleep(linger / 2)
        late_sent = time.monotonic()
        later = oai(run).chat.completions.create(
            **{**request, "messages": [{"role": "system", "content": "Extract memories."}]}
        )
    assert said_captured(first.choices[0].message.content)
    assert "already took its request" in str(later.choices[0].message.content)
    assert run.ended is not None and run.code == 0
    # Stopped a whole linger after the late request (not at the first one's linger, which
    # ended linger / 2 after it), and not much later.
    assert linger <= run.ended - late_sent < linger + 3
    (entry,) = run.entries()
    assert entry["messages"] == request["messages"][:1]


def test_the_same_name_is_replaced_and_a_foreign_file_refused(tmp_path: Path) -> None:
    out = tmp_path / "agents.json"
    out.write_text(
        json.dumps(
            [
                {"name": "anthropic-agent", "messages": [{"role": "system", "content": "old"}]},
                {"name": "other", "messages": [{"role": "system", "content": "kept"}]},
            ]
        )
    )
    with capturing(tmp_path) as run:
        claude(run).messages.create(
            model="m", max_tokens=5, system=SYSTEM, messages=[{"role": "user", "content": "Hi"}]
        )
    assert [(e["name"], "anthropic" in e) for e in run.entries()] == [
        ("anthropic-agent", True),
        ("other", False),
    ]

    foreign = tmp_path / "notes.json"
    foreign.write_text('{"not": "a list"}')
    code = main(["warm-prompts", "capture", "--port", "0", "--out", str(foreign)])
    assert code == 2 and foreign.read_text() == '{"not": "a list"}'


def test_an_invalid_request_gets_the_apis_error_and_ends_the_capture(tmp_path: Path) -> None:
    with capturing(tmp_path) as run, pytest.raises(anthropic.BadRequestError) as caught:
        claude(run).messages.create(model="m", max_tokens=5, messages=[])
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert "messages" in caught.value.message
    assert run.code == 1 and not run.out.exists()


def test_reads_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "MAX_BODY_BYTES", 1000)
    monkeypatch.setattr(capture, "BODY_TIMEOUT_S", 0.5)
    with capturing(tmp_path) as run, pytest.raises(openai.APIStatusError) as caught:
        oai(run).chat.completions.create(
            model="m", messages=[{"role": "system", "content": "x" * 2000}]
        )
    assert caught.value.status_code == 413 and run.code == 1

    with capturing(tmp_path) as run:  # a body that never comes
        answer = _send_half_a_body(run.port)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer
    assert run.code == 1

    started = time.monotonic()
    code = main(
        [
            "warm-prompts",
            "capture",
            "--port",
            "0",
            "--out",
            str(tmp_path / "x.json"),
            "--timeout",
            "0.3",
        ]
    )
    assert code == 1 and time.monotonic() - started < 10


def _send_half_a_body(port: int) -> bytes:
    """What the server answers a request whose body stops coming."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 500\r\n\r\n{"
        )
        sock.settimeout(10)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out
