"""Long conversations cost linear work: the template is rendered a bounded number of
times per request, the context length is checked before any cut is looked for, and
the work stops when the client goes away."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from support.engine import model
from support.processes import serving
from warmfleet_common.prompts import PromptBuilder, PromptCancelled, PromptTooLong
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings


class CountingTokenizer:
    """The tiny model's tokenizer, counting chat-template renders."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.renders = 0

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        self.renders += 1
        return self._inner.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def conversation(messages: int) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"turn {i}: ok"} for i in range(messages - 1)] + [
        {"role": "user", "content": "and now?"}
    ]


def builder() -> tuple[PromptBuilder, CountingTokenizer]:
    counting = CountingTokenizer(model("tiny-random").tokenizer)
    prompts = PromptBuilder(counting)
    counting.renders = 0  # the one that checks the piece memo, when the builder is made
    return prompts, counting


@pytest.mark.timeout(120)
def test_renders_are_bounded_whatever_the_message_count() -> None:
    prompts, counting = builder()
    rendered = prompts.chat(conversation(1500))
    # 64 head messages, the last 3 and the reply: not 12 per message
    assert counting.renders <= 1 + 12 * 68
    assert len(rendered.cuts) == 68  # the first 64 messages, the last 3 and the reply
    # The last cut is where the last message's content starts (what warm-up relies on).
    other = prompts.chat([*conversation(1500)[:-1], {"role": "user", "content": "Q"}]).tokens
    shared = next(i for i, (a, b) in enumerate(zip(rendered.tokens, other)) if a != b)
    assert rendered.content_start <= shared <= rendered.content_start + 2


def test_the_length_is_checked_before_any_cut() -> None:
    prompts, counting = builder()
    with pytest.raises(PromptTooLong) as info:
        prompts.chat(conversation(10_000), max_tokens=8192)
    assert info.value.tokens > 8192 and counting.renders == 1


def test_a_cancelled_render_stops() -> None:
    prompts, counting = builder()
    with pytest.raises(PromptCancelled):
        prompts.chat(conversation(200), cancelled=lambda: True)
    assert counting.renders == 1


def make_app() -> Any:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    return create_app(DaemonSettings(model="tiny-random"), engine=engine)


@pytest.mark.timeout(120)
def test_a_10000_message_conversation_is_refused_at_once() -> None:
    body = {"model": "tiny-random", "max_tokens": 2, "messages": conversation(10_000)}
    with TestClient(make_app()) as client:
        started = time.monotonic()
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "messages"
    print(f"refused in {time.monotonic() - started:.2f}s")


@pytest.mark.timeout(120)
def test_rendering_stops_when_the_client_goes_away(monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    stopped = threading.Event()

    def slow_chat(*args: Any, cancelled: Any = None, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if cancelled is not None and cancelled():
                stopped.set()
                raise PromptCancelled("gone")
            time.sleep(0.01)
        raise AssertionError("never told to stop")

    with serving(app) as url:
        monkeypatch.setattr(app.state.daemon.ready.prompts, "chat", slow_chat)
        body = {"model": "tiny-random", "max_tokens": 2, "messages": conversation(3)}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1.0)
        assert stopped.wait(10), "the render went on after the client left"
