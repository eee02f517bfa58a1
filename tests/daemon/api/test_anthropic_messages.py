"""Anthropic's Messages API (what Claude Code speaks) through the official `anthropic`
SDK: a scripted model's tool call round trip, the stream's event sequence, usage with
cache reads and breakpoints, count_tokens, Claude Code's own fields, errors in
Anthropic's shape, and the cache invariant on a tiny random model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from support.engine import model
from support.processes import Daemon, serving
from support.scripted import scripted_engine, serve
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, Event
from warmfleet_daemon.settings import DaemonSettings

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
SYSTEM = [
    {"type": "text", "text": "You are a weather bot for the whole of Europe. " * 8},
    {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def scripted_url() -> Iterator[str]:
    with serve(scripted_engine(model("tiny-random").tokenizer, f"Let me check.\n{CALL}")) as url:
        yield url


@pytest.fixture
def client(scripted_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=scripted_url, api_key="unused", max_retries=0)


def total_input(usage: Any) -> int:
    return int(
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    )


def test_a_tool_round_trip_reuses_the_first_turn(client: anthropic.Anthropic) -> None:
    first = client.messages.create(
        model="scripted", max_tokens=200, system=SYSTEM, messages=ASK, tools=[WEATHER]
    )
    assert first.stop_reason == "tool_use" and first.stop_sequence is None
    text, call = first.content
    assert text.type == "text" and text.text == "Let me check.\n"
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    # The breakpoint (the end of the system prompt) stored what the cache lacked.
    assert first.usage.cache_creation_input_tokens > 0
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == (
        first.usage.cache_creation_input_tokens
    )
    assert first.usage.output_tokens > 0

    history = [
        *ASK,
        first.to_param(),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "18°C, sunny"},
                {"type": "text", "text": "Thanks!"},
            ],
        },
    ]
    second = client.messages.create(
        model="scripted", max_tokens=200, system=SYSTEM, messages=history, tools=[WEATHER]
    )
    assert second.stop_reason == "tool_use"
    # The system prompt, tools and first turn came from the cache, nothing was created
    # again, and the three parts add up to the whole prompt.
    assert second.usage.cache_read_input_tokens >= total_input(first.usage) - 1
    assert second.usage.cache_creation_input_tokens == 0
    counted = client.messages.count_tokens(
        model="scripted", system=SYSTEM, messages=history, tools=[WEATHER]
    )
    assert total_input(second.usage) == counted.input_tokens


def test_the_stream_follows_anthropics_event_sequence(scripted_url: str) -> None:
    body = {
        "model": "scripted",
        "max_tokens": 200,
        "stream": True,
        "messages": ASK,
        "tools": [WEATHER],
    }
    with httpx.stream("POST", f"{scripted_url}/v1/messages?beta=true", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == name
                events.append(data)
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    blocks = [e for e in events if e["type"] == "content_block_start"]
    assert [b["index"] for b in blocks] == [0, 1]
    assert [b["content_block"]["type"] for b in blocks] == ["text", "tool_use"]
    assert blocks[1]["content_block"]["input"] == {}
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "Let me check.\n"
    (arguments,) = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert json.loads(arguments) == {"city": "Paris"}
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    final = events[-2]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] > 0


def test_the_sdks_stream_gives_the_same_message_as_create(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {"model": "scripted", "max_tokens": 200, "messages": ASK}
    with client.messages.stream(**kwargs, tools=[WEATHER]) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    created = client.messages.create(**kwargs, tools=[WEATHER])
    assert "".join(texts) == "Let me check.\n"
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in created.content
    ]
    assert streamed.stop_reason == created.stop_reason == "tool_use"
    assert total_input(streamed.usage) == total_input(created.usage)


def test_what_claude_code_sends_is_accepted(scripted_url: str) -> None:
    """Claude Code 2.1's request: system blocks with cache_control, a system-role message
    in `messages`, thinking passed back, adaptive thinking, effort, context management,
    metadata, its headers and `?beta=true`."""
    body = {
        "model": "scripted",
        "max_tokens": 128000,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "Be careful.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>hi</system-reminder>"},
                    {
                        "type": "text",
                        "text": "List the files.",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {"role": "system", "content": "The user is in /work."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Use ls.", "signature": "abc"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Sure."},
                ],
            },
            {"role": "user", "content": "Go on."},
        ],
        "tools": [{**WEATHER, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": json.dumps({"session_id": "5f1c"})},
        "temperature": 1,
        "stream": False,
    }
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
        "context-management-2025-06-27",
        "x-api-key": "unused",
        "X-Claude-Code-Session-Id": "5f1c",
        "anthropic-dangerous-direct-browser-access": "true",
        "x-app": "cli",
    }
    r = httpx.post(f"{scripted_url}/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    message = r.json()
    assert message["type"] == "message" and message["stop_reason"] == "tool_use"
    usage = message["usage"]
    # 128000 tokens do not fit: served up to the context's end (here the script ends first).
    assert usage["cache_creation"]["ephemeral_1h_input_tokens"] > 0
    assert usage["cache_creation"]["ephemeral_5m_input_tokens"] > 0
    counted = httpx.post(
        f"{scripted_url}/v1/messages/count_tokens?beta=true",
        json={
            k: body[k] for k in ("model", "system", "messages", "tools", "thinking", "tool_choice")
        },
        headers=headers,
    ).json()
    assert counted["input_tokens"] == sum(
        usage[k] for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )


@pytest.mark.parametrize(
    ("body", "status", "type_", "words"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "AA==",
                                },
                            }
                        ],
                    }
                ]
            },
            400,
            "invalid_request_error",
            "text only",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            400,
            "invalid_request_error",
            "text only",
        ),
        ({"service_tier": "auto"}, 400, "invalid_request_error", "service_tier"),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            400,
            "invalid_request_error",
            "server tools",
        ),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            400,
            "invalid_request_error",
            "clear_tool_uses_20250919",
        ),
        (
            {"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]},
            400,
            "invalid_request_error",
            "nope",
        ),
        ({"model": "claude-opus-4"}, 404, "not_found_error", "claude-opus-4"),
        (
            {"messages": [{"role": "user", "content": "x" * 40000}]},
            400,
            "invalid_request_error",
            "prompt is too long",
        ),
    ],
)
def test_bad_requests_get_anthropic_errors(
    scripted_url: str, body: dict[str, Any], status: int, type_: str, words: str
) -> None:
    full = {"model": "scripted", "max_tokens": 10, "messages": ASK, **body}
    r = httpx.post(f"{scripted_url}/v1/messages", json=full, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == type_
    assert words in error["error"]["message"]


def test_the_sdk_raises_its_own_error_classes(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=5, messages=ASK)
    with pytest.raises(anthropic.BadRequestError, match="frobnicate"):
        client.messages.create(
            model="scripted", max_tokens=5, messages=ASK, extra_body={"frobnicate": True}
        )


def test_a_stop_sequence_is_reported(client: anthropic.Anthropic) -> None:
    r = client.messages.create(
        model="scripted", max_tokens=50, messages=ASK, stop_sequences=["zzz", "check"]
    )
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "check"
    assert r.content[0].text == "Let me "


def test_max_tokens_zero_only_fills_the_cache(client: anthropic.Anthropic) -> None:
    prompt = [{"role": "user", "content": "Warm me up, a unique prompt 7741."}]
    warm = client.messages.create(model="scripted", max_tokens=0, system=SYSTEM, messages=prompt)
    assert warm.content == [] and warm.stop_reason == "max_tokens"
    assert warm.usage.output_tokens == 0
    after = client.messages.create(model="scripted", max_tokens=5, system=SYSTEM, messages=prompt)
    assert after.usage.cache_read_input_tokens > warm.usage.cache_read_input_tokens


# -- a tiny random model: the cache changes nothing, the context bounds max_tokens -------


@pytest.fixture(scope="module")
def tiny_url() -> Iterator[str]:
    """tiny-random with a 384-token context, greedy unless asked otherwise."""
    loaded = dataclasses.replace(model("tiny-random"), context_length=384)
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(model="tiny-random", default_temperature=0.0)
    with serving(create_app(settings, engine=engine)) as url:
        yield url


def test_a_cached_response_is_the_uncached_one(tiny_url: str) -> None:
    client = anthropic.Anthropic(base_url=tiny_url, api_key="unused", max_retries=0)
    system = "You review Go code for a payments team; cite the line you mean. " * 3
    asks = ["Is this loop correct?", "Why would this leak a goroutine?"]
    answers = []
    for ask in asks:
        r = client.messages.create(
            model="tiny-random",
            max_tokens=24,
            system=system,
            messages=[{"role": "user", "content": ask}],
        )
        answers.append((r.content[0].text, r.usage))
    # The second request found the system prompt cached ...
    assert answers[1][1].cache_read_input_tokens > 0
    # ... and says exactly what a cold engine says.
    cold_engine = Engine(
        dataclasses.replace(model("tiny-random"), context_length=384),
        EngineConfig(block_size=32, cache_budget_bytes=0),
    )
    settings = DaemonSettings(model="tiny-random", default_temperature=0.0)
    with serving(create_app(settings, engine=cold_engine)) as cold_url:
        cold = anthropic.Anthropic(base_url=cold_url, api_key="unused", max_retries=0)
        r = cold.messages.create(
            model="tiny-random",
            max_tokens=24,
            system=system,
            messages=[{"role": "user", "content": asks[1]}],
        )
    assert r.usage.cache_read_input_tokens == 0
    assert r.content[0].text == answers[1][0]


def test_max_tokens_beyond_the_context_runs_to_its_end(tiny_url: str) -> None:
    client = anthropic.Anthropic(base_url=tiny_url, api_key="unused", max_retries=0)
    with client.messages.stream(
        model="tiny-random",
        max_tokens=128000,
        messages=[{"role": "user", "content": "Tell me everything."}],
        extra_body={"temperature": 0.7, "top_k": 20, "top_p": 0.9},
    ) as stream:
        r = stream.get_final_message()
    assert r.stop_reason == "max_tokens"
    assert total_input(r.usage) + r.usage.output_tokens == 384


def test_a_breakpoint_pins_its_prefix_for_its_ttl(tiny_url: str) -> None:
    client = anthropic.Anthropic(base_url=tiny_url, api_key="unused", max_retries=0)
    before = httpx.get(f"{tiny_url}/v1/status").json()["cache"]
    client.messages.create(
        model="tiny-random",
        max_tokens=2,
        system=[
            {
                "type": "text",
                "text": "Pin me 31337. " * 10,
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            }
        ],
        messages=[{"role": "user", "content": "hello"}],
    )
    after = httpx.get(f"{tiny_url}/v1/status").json()["cache"]
    assert after["pinned_bytes"] > before["pinned_bytes"]


# -- the pieces, without a server ---------------------------------------------------------


def test_pings_fill_the_silence_of_a_long_prefill() -> None:
    async def slow() -> Any:
        await asyncio.sleep(0.35)
        yield 0, Event("a")
        yield 0, Event("", finish_reason="stop")

    async def run() -> list[Any]:
        return [item async for item in gen.heartbeat(slow(), 0.1)]

    items = asyncio.run(run())
    assert items[:3] == [None, None, None]
    assert [i[1].text for i in items if i is not None] == ["a", ""]


def test_the_real_daemon_speaks_anthropic(tiny_daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=tiny_daemon.url, api_key="unused", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "default",
        "max_tokens": 8,
        "system": [
            {"type": "text", "text": "You are terse. " * 20, "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "Say hi."}],
        "extra_body": {"temperature": 0},
    }
    first = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        second = stream.get_final_message()
    assert second.content[0].text == first.content[0].text
    assert second.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens > 0
    counted = client.messages.count_tokens(
        model="default", system=kwargs["system"], messages=kwargs["messages"]
    )
    assert counted.input_tokens == total_input(first.usage)
