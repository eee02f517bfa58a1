"""The agent APIs' routes in the router, without a daemon: a request's blocks are the
daemon's (the same translation and template switches), usage and stream progress are
read from each API's events, agent session ids are session keys."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.thinking import thinking_tokenizer
from warmfleet_common.agent_apis.anthropic import MessagesRequest
from warmfleet_common.agent_apis.shapes import SHAPES
from warmfleet_common.cache_layout import export_layout
from warmfleet_common.chunking import plan_chunks, root_key
from warmfleet_common.prompts import PromptBuilder
from warmfleet_common.tiers import TierTokens
from warmfleet_router.keys import LayoutKeyer
from warmfleet_router.prepare import Job, KeyerCache, Prepared, prepare
from warmfleet_router.routes import (
    BY_NAME,
    MESSAGES,
    RESPONSES,
    ROUTES,
    Usage,
    anthropic_output,
    anthropic_usage,
    openai_usage,
    request_blocks,
    responses_output,
    responses_usage,
)
from warmfleet_router.sessions import DEFAULT_SOURCES, SessionKeys, body_values

ROOT = root_key("router-agent-routes")
BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 16,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [{"name": "Bash", "description": "run it", "input_schema": {"type": "object"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the build"}]}],
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return thinking_tokenizer()


def _daemon_keys(tokenizer: Any, body: dict[str, Any]) -> tuple[bytes, ...]:
    """What the daemon computes: its translation, its prompt builder, its chunk plan."""
    request = MessagesRequest.model_validate(body)
    chat = request.chat()
    prompt = PromptBuilder(tokenizer).chat(
        chat.messages, chat.tools, template_kwargs=chat.template_kwargs(request.options())
    )
    chunks = plan_chunks(prompt.tokens, block_size=8, cuts=prompt.cuts, root=ROOT)
    return tuple(c.key for c in chunks)


@pytest.mark.parametrize(
    "thinking", [None, {"type": "disabled"}, {"type": "enabled", "budget_tokens": 64}]
)
def test_an_anthropic_request_has_the_daemons_blocks(tokenizer: Any, thinking: Any) -> None:
    body = {**BODY, **({"thinking": thinking} if thinking else {})}
    keyer = LayoutKeyer(export_layout(tokenizer, model="m", root=ROOT, block_size=8))
    assert request_blocks(keyer, MESSAGES, body).keys == _daemon_keys(tokenizer, body)


@pytest.mark.parametrize("session", [None, "s1"])
def test_the_routers_prepare_keys_the_thinking_switch_as_the_daemon(
    tokenizer: Any, session: str | None
) -> None:
    """The path a request takes (a key worker's `prepare`, with or without the session
    memo), not only `request_blocks`: it dropped the template arguments once."""
    layout = export_layout(tokenizer, model="m", root=ROOT, block_size=8)
    keyers = KeyerCache(None)
    keyers.add(layout)
    for thinking in ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 64}):
        body = {**BODY, "thinking": thinking}
        job = Job("messages", json.dumps(body).encode(), (layout.fingerprint,), session=session)
        prepared = prepare(job, keyers)
        assert isinstance(prepared, Prepared)
        assert prepared.blocks[layout.fingerprint].keys == _daemon_keys(tokenizer, body)


def test_the_thinking_switch_renders_another_prompt(tokenizer: Any) -> None:
    keyer = LayoutKeyer(export_layout(tokenizer, model="m", root=ROOT, block_size=8))
    off = request_blocks(keyer, MESSAGES, {**BODY, "thinking": {"type": "disabled"}})
    on = request_blocks(keyer, MESSAGES, BODY)
    assert off.keys[-1] != on.keys[-1] and off.tokens > on.tokens


def test_a_body_that_is_no_request_has_no_blocks(tokenizer: Any) -> None:
    keyer = LayoutKeyer(export_layout(tokenizer, model="m", root=ROOT, block_size=8))
    assert request_blocks(keyer, MESSAGES, {"model": "m", "messages": "nope"}).keys == ()
    assert request_blocks(keyer, RESPONSES, {"model": "m", "input": 5}).keys == ()


def test_anthropic_usage_from_the_body_and_the_stream() -> None:
    usage = {"input_tokens": 7, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 3}
    assert anthropic_usage({"type": "message", "usage": usage}) == Usage(100, 90)
    start = {"type": "message_start", "message": {"usage": {**usage, "output_tokens": 1}}}
    assert anthropic_usage(start) == Usage(100, 90, completion_tokens=1)
    done = {"type": "message_delta", "usage": {**usage, "output_tokens": 12}}
    assert anthropic_usage(done) == Usage(100, 90, completion_tokens=12)  # what quotas count
    assert anthropic_usage({"type": "message_delta", "usage": {"output_tokens": 5}}) is None
    assert anthropic_usage({"type": "message_delta", "usage": usage}) == Usage(100, 90)
    assert anthropic_usage({"usage": {"input_tokens": True, "cache_read_input_tokens": 1}}) is None


def test_responses_usage_from_the_body_and_the_completed_event() -> None:
    usage = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 96}}
    assert responses_usage({"object": "response", "usage": usage}) == Usage(120, 96)
    generated = {**usage, "output_tokens": 7}
    assert responses_usage({"usage": generated}) == Usage(120, 96, completion_tokens=7)
    done = {"type": "response.completed", "response": {"usage": usage}}
    assert responses_usage(done) == Usage(120, 96)
    assert responses_usage({"type": "response.created", "response": {"usage": None}}) is None


def test_usage_says_the_served_tiers_when_they_add_up() -> None:
    tiers = {"cached_tokens_by_tier": {"ram": 64, "disk": 32}}
    chat = {"prompt_tokens": 120, "prompt_tokens_details": {"cached_tokens": 96}}
    read_back = Usage(120, 96, TierTokens(ram=64, disk=32))
    assert openai_usage({"usage": {**chat, **tiers}}) == read_back
    assert openai_usage({"usage": chat}) == Usage(120, 96, None)  # another server
    messages = {"input_tokens": 24, "cache_read_input_tokens": 96, **tiers}
    assert anthropic_usage({"type": "message", "usage": messages}) == read_back
    responses = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 96}, **tiers}
    assert responses_usage({"usage": responses}) == read_back
    spilled = {**chat, "cached_tokens_by_tier": {"ram": 32, "disk": 32, "peer": 32}}
    copied = Usage(120, 96, TierTokens(ram=32, disk=32, peer=32))  # 32 copied from a peer
    assert openai_usage({"usage": spilled}) == copied
    for bad in ({"ram": 64, "disk": 0}, {"ram": 64, "disk": -32}, {"ram": "64", "disk": 32}, []):
        wrong = {**chat, "cached_tokens_by_tier": bad}
        assert openai_usage({"usage": wrong}) == Usage(120, 96, None)  # ignored, not trusted


def test_stream_progress_holds_back_only_the_opening() -> None:
    assert not anthropic_output({"type": "message_start", "message": {}})
    assert anthropic_output({"type": "ping"})  # a long prefill: the client hears from us
    assert anthropic_output({"type": "content_block_delta"})
    assert not responses_output({"type": "response.created"})
    assert not responses_output({"type": "response.in_progress"})
    assert responses_output({"type": "keepalive"})  # a long prefill, as with ping
    assert responses_output({"type": "response.output_text.delta"})


def test_agent_session_ids_are_session_keys() -> None:
    keys = SessionKeys(DEFAULT_SOURCES)
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-1"})
    assert keys.of({"x-claude-code-session-id": "cc-1"}, ()) == "cc-1"
    values = body_values({"metadata": {"user_id": user_id}}, keys.body_paths)
    assert keys.of({}, values) == "s-1"  # the session, not the device every session shares
    values = body_values({"metadata": {"user_id": "alice"}}, keys.body_paths)
    assert keys.of({}, values) == "alice"
    values = body_values({"prompt_cache_key": "thread-9"}, keys.body_paths)
    assert keys.of({}, values) == "thread-9"
    # Explicit affinity first.
    assert keys.of({"x-session-affinity": "a", "x-claude-code-session-id": "cc-1"}, ()) == "a"


def test_every_api_shape_has_its_route_answering_in_its_shape() -> None:
    by_path = {r.path: r for r in ROUTES}
    for shape in SHAPES.values():
        assert by_path[shape.path].api == shape.name
    assert {r.api for r in ROUTES} == set(SHAPES)
    assert BY_NAME["completion"].api == BY_NAME["chat"].api == "chat"  # OpenAI's errors
    assert BY_NAME["count_tokens"].api == "anthropic"
