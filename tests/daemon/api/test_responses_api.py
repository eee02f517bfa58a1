"""OpenAI's Responses API (what Codex speaks), stateless, through the official `openai`
SDK: what Codex sends (developer messages, function and namespace tools, a hosted tool,
store: false, include, prompt_cache_key, client_metadata), a tool round trip driven by
a scripted model, the stream's events and sequence numbers, cached tokens on a second
request, and the cache invariant on a tiny random model."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from support.engine import model
from support.processes import Daemon, serving
from support.scripted import scripted_engine, serve
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

CALL = '<tool_call>\n{"name": "shell.exec", "arguments": {"cmd": "ls"}}\n</tool_call>'
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Edit files",
        "parameters": {"type": "object", "properties": {"patch": {"type": "string"}}},
        "strict": False,
    },
    {
        "type": "namespace",
        "name": "shell",
        "description": "Tools in the shell namespace.",
        "tools": [
            {
                "type": "function",
                "name": "exec",
                "description": "Run a command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
                "strict": False,
            }
        ],
    },
    {"type": "web_search", "external_web_access": False},
]
CODEX = {
    "instructions": "You are Codex, a coding agent. " * 20,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [
                {"type": "input_text", "text": "<permissions>workspace-write</permissions>"}
            ],
        },
        {
            "type": "message",
            "role": "developer",
            "content": [
                {"type": "input_text", "text": "<environment_context>/work</environment_context>"}
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "List the files."}],
        },
    ],
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "019a-thread",
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(scripted_engine(model("tiny-random").tokenizer, f"On it.\n{CALL}")) as base:
        yield base


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_codexs_request_and_a_tool_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="scripted", **CODEX, extra_body={"client_metadata": {"x-codex-turn": "1"}}
    )
    assert first.status == "completed" and first.object == "response"
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "On it.\n"
    assert call.type == "function_call"
    assert (call.namespace, call.name, json.loads(call.arguments)) == (
        "shell",
        "exec",
        {"cmd": "ls"},
    )
    assert first.model_extra["tools_left_out"] == ["web_search"]
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0

    items = [
        *CODEX["input"],
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "On it.\n"}],
        },
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": "exec",
            "namespace": "shell",
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "README.md\nsrc/"},
    ]
    second = client.responses.create(model="scripted", **{**CODEX, "input": items})
    assert second.status == "completed"
    # The instructions, tools and first turn were read from the cache.
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2


def test_the_stream_numbers_every_event_and_ends_completed(url: str, client: openai.OpenAI) -> None:
    with client.responses.stream(model="scripted", **CODEX) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed"
    assert {
        "response.output_text.delta",
        "response.output_text.done",
        "response.function_call_arguments.done",
    } <= set(kinds)
    assert [i.type for i in final.output] == ["message", "function_call"]
    assert final.usage.input_tokens_details.cached_tokens > 0  # the same request ran before
    # The raw stream: named events, and the hosted tool named in a header.
    with httpx.stream(
        "POST", f"{url}/v1/responses", json={"model": "scripted", "stream": True, **CODEX}
    ) as r:
        assert r.headers["x-warmfleet-tools-left-out"] == "web_search"
        names = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] == "response.completed"


def test_keepalive_events_fill_the_silence_of_a_long_prefill(
    client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events, not SSE comments: Codex gives up on a stream after 300 s without an event
    (stream_idle_timeout_ms); the SDK's stream helper passes them by."""
    from warmfleet_daemon.api import responses

    monkeypatch.setattr(responses, "KEEP_ALIVE_S", 0.0005)
    with client.responses.stream(model="scripted", **CODEX) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "keepalive" in kinds and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [i.type for i in final.output] == ["message", "function_call"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
        ),
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_it(
    url: str, body: dict[str, Any], param: str
) -> None:
    r = httpx.post(f"{url}/v1/responses", json={"model": "scripted", "input": "hi", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)


def test_json_schema_output_follows_the_schema(url: str) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = httpx.post(
        f"{url}/v1/responses",
        json={
            "model": "scripted",
            "input": "Is it?",
            "max_output_tokens": 40,
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "verdict",
                    "schema": schema,
                    "strict": True,
                }
            },
        },
    )
    assert r.status_code == 200, r.text
    text = r.json()["output"][0]["content"][0]["text"]
    assert json.loads(text) in ({"ok": True}, {"ok": False})


@pytest.fixture(scope="module")
def tiny_url() -> Iterator[str]:
    loaded = dataclasses.replace(model("tiny-random"), context_length=512)
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    with serving(create_app(DaemonSettings(model="tiny-random"), engine=engine)) as base:
        yield base


def test_a_cached_response_is_the_uncached_one(tiny_url: str) -> None:
    client = openai.OpenAI(base_url=f"{tiny_url}/v1", api_key="unused", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "tiny-random",
        "instructions": "You refactor Rust. " * 12,
        "temperature": 0,
        "max_output_tokens": 16,
    }
    client.responses.create(**kwargs, input="Rename this function.")
    warm = client.responses.create(**kwargs, input="Split this module.")
    assert warm.usage.input_tokens_details.cached_tokens > 0
    cold_engine = Engine(
        dataclasses.replace(model("tiny-random"), context_length=512),
        EngineConfig(block_size=32, cache_budget_bytes=0),
    )
    with serving(create_app(DaemonSettings(model="tiny-random"), engine=cold_engine)) as cold_url:
        cold = openai.OpenAI(base_url=f"{cold_url}/v1", api_key="unused", max_retries=0)
        r = cold.responses.create(**kwargs, input="Split this module.")
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.output_text == warm.output_text
    # max_output_tokens cut it: incomplete, as OpenAI says.
    assert warm.status == "incomplete" and warm.incomplete_details.reason == "max_output_tokens"


def test_the_real_daemon_speaks_responses(tiny_daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{tiny_daemon.url}/v1", api_key="unused", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "default",
        "instructions": "You are terse. " * 20,
        "input": "Say hi.",
        "temperature": 0,
        "max_output_tokens": 6,
        "store": False,
    }
    first = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        second = stream.get_final_response()
    assert second.output_text == first.output_text
    assert second.usage.input_tokens_details.cached_tokens > 0
