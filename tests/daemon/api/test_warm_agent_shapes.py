"""Warm exactly what the agent sends: warm prompts in the Anthropic and Responses
request shapes, taken from the recorded first requests of Claude Code 2.1.332 and Codex
0.171.0 (trimmed copies in tests/support/data), are rendered as `/v1/messages` and
`/v1/responses` render requests, so another session of the same agent (another user
prompt, another billing fingerprint, session and item ids) finds every warmed token
cached on its first request; from a warm-prompts file and from a push alike."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from support.agents import Recorded, claude_code, codex
from support.engine import model
from warmfleet_cli.warm_prompts.files import write
from warmfleet_common.agent_apis.anthropic import MessagesRequest
from warmfleet_common.agent_apis.prefix import warm_prompt
from warmfleet_common.agent_apis.responses import ResponsesRequest
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

ASK = "Find the flaky test under ci/ and tell me why it fails."


def captured() -> list[dict[str, Any]]:
    """The warm-prompts entries `warmfleet warm-prompts capture` writes for both agents."""
    return [
        warm_prompt("anthropic", claude_code().body, "claude-code").model_dump(
            mode="json", exclude_none=True
        ),
        warm_prompt("responses", codex().body, "codex").model_dump(mode="json", exclude_none=True),
    ]


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_warm_prompt_is_a_strict_prefix_token_for_token(agent: str) -> None:
    """The captured prefix, rendered for warm-up, is the first tokens of the next
    session's request as its route renders it, and ends where that request's first user
    message starts (a cut: the engine reuses it in whole blocks)."""
    builder = PromptBuilder(model("tiny-random").tokenizer)
    if agent == "claude-code":
        prompt = warm_prompt("anthropic", claude_code().body, agent)
        request: Any = MessagesRequest.model_validate(claude_code(ASK).body)
    else:
        prompt = warm_prompt("responses", codex().body, agent)
        request = ResponsesRequest.model_validate(codex(ASK).body)
    chat, options = prompt.chat()
    warm = builder.shared_prefix(chat.messages, chat.tools, chat.template_kwargs(options))
    live_chat = request.chat()
    live = builder.chat(
        live_chat.messages,
        live_chat.tools,
        template_kwargs=live_chat.template_kwargs(request.options()),
    )
    n = len(warm.tokens)
    assert live.tokens[:n] == warm.tokens and n < len(live.tokens)
    first_user = next(i for i, m in enumerate(live_chat.messages) if m["role"] == "user")
    assert live.message_starts[first_user] == n and n in live.cuts
    # The whole system prompt and every tool are in it; nothing of the session is.
    text = builder.decode(warm.tokens)
    assert "x-anthropic-billing-header" not in text and "cc_version" not in text
    assert "2026-12-01" not in text and "/tmp" not in text.split("</tools>")[-1]
    assert all(t["function"]["name"] in text for t in live_chat.tools or [])


def test_claude_codes_billing_header_is_left_out_of_every_prompt() -> None:
    """Its fingerprint changes with every session's first prompt: two sessions render
    the same system prompt (it would otherwise differ from the first token)."""
    one = MessagesRequest.model_validate(claude_code(ASK).body).chat()
    other = MessagesRequest.model_validate(claude_code("Say hi.").body).chat()
    assert (
        claude_code(ASK).body["system"][0]["text"]
        != claude_code("Say hi.").body["system"][0]["text"]
    )
    assert one.messages[0] == other.messages[0]
    assert one.messages[0]["content"].startswith("You are a Claude agent")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """tiny-random with the captured prompts of both agents in its --warm-prompts file
    (YAML, as `capture --format yaml` writes it)."""
    path = tmp_path_factory.mktemp("warm") / "agents.yaml"
    write(path, captured(), "yaml")
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=256 << 20))
    settings = DaemonSettings(model="tiny-random", warm_prompts=str(path))
    with TestClient(create_app(settings, engine=engine)) as c:
        wait_warm(c)
        yield c


def wait_warm(client: TestClient) -> None:
    deadline = time.monotonic() + 120
    while client.get("/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline, client.get("/v1/warm-sets").json()
        time.sleep(0.05)


def warm_tokens(client: TestClient, name: str = "warm-prompts") -> dict[str, int]:
    found = next(s for s in client.get("/v1/warm-sets").json()["sets"] if s["name"] == name)
    assert found["warm"] == found["total"] == 2, found
    return {p["name"]: p["tokens"] for p in found["prompts"]}


def events(client: TestClient, rec: Recorded, **changes: Any) -> list[dict[str, Any]]:
    """The recorded request (streamed, as the agents ask) and its events' data."""
    with client.stream(
        rec.method, rec.path, json={**rec.body, **changes}, headers=rec.headers
    ) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_the_next_session_finds_the_warm_prompt_cached(client: TestClient) -> None:
    tokens = warm_tokens(client)
    assert tokens["claude-code"] > 2000 and tokens["codex"] > 1500

    stream = events(client, claude_code(ASK, model="tiny-random"), max_tokens=1)
    usage = next(e["usage"] for e in stream if e["type"] == "message_delta")
    assert usage["cache_read_input_tokens"] == tokens["claude-code"]
    assert usage["input_tokens"] + usage["cache_creation_input_tokens"] > 0  # the rest

    stream = events(client, codex(ASK, model="tiny-random"), max_output_tokens=1)
    done = next(e["response"] for e in stream if e["type"] == "response.completed")
    assert done["usage"]["input_tokens_details"]["cached_tokens"] == tokens["codex"]
    assert done["usage"]["input_tokens"] > tokens["codex"]


def test_a_push_of_the_same_prompts_warms_the_same_prefix(client: TestClient) -> None:
    """The push API takes the entries the file holds; they render to the same tokens
    (same content hashes) and, already cached, compute nothing."""
    sets = client.get("/v1/warm-sets").json()["sets"]
    from_file = {p["name"]: p for s in sets if s["name"] == "warm-prompts" for p in s["prompts"]}
    r = client.put("/v1/warm-sets/team/agents", json={"generation": 1, "prompts": captured()})
    assert r.status_code == 202, r.text
    wait_warm(client)
    pushed = {p["name"]: p for p in client.get("/v1/warm-sets/team/agents").json()["prompts"]}
    for name, prompt in pushed.items():
        assert prompt["content_hash"] == from_file[name]["content_hash"]
        assert prompt["tokens"] == from_file[name]["tokens"] and prompt["computed_tokens"] == 0


@pytest.mark.parametrize(
    ("prompt", "param", "words"),
    [
        ({"name": "a", "anthropic": {}}, "prompts.0.anthropic", "at least one of system"),
        ({"name": "a", "responses": {"input": []}}, "prompts.0.responses", "at least one of"),
        (
            {"name": "a", "anthropic": {"system": "x"}, "responses": {"instructions": "y"}},
            "prompts.0",
            "exactly one of",
        ),
        (
            {
                "name": "a",
                "anthropic": {"system": "x"},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "prompts.0",
            "tools belong inside anthropic",
        ),
        (
            {"name": "a", "anthropic": {"system": "x", "max_tokens": 5}},
            "prompts.0.anthropic.max_tokens",
            "not supported",
        ),
        (
            {"name": "a", "responses": {"instructions": "x", "tools": [{"type": "custom"}]}},
            "prompts.0.responses.tools",
            "'custom'",
        ),
        (
            {"name": "a", "anthropic": {"system": "x" * 200_001}},
            "prompts.0.anthropic",
            "the limit is 200000",
        ),
    ],
)
def test_bad_agent_prompts_are_refused_naming_the_field(
    client: TestClient, prompt: dict[str, Any], param: str, words: str
) -> None:
    r = client.put("/v1/warm-sets/team/bad", json={"prompts": [prompt]})
    assert r.status_code in (400, 413, 422), r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert client.get("/v1/warm-sets/team/bad").status_code == 404
