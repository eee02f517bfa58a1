"""From engine output to Anthropic Messages API responses: content blocks (`thinking`,
`text`, `tool_use`), stop reasons, usage, and the stream's events (`message_start`,
`content_block_start`/`_delta`/`_stop`, `message_delta`, `message_stop`, `ping`,
`error`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from warmfleet_common.errors import anthropic_error_body, anthropic_type
from warmfleet_common.tiers import FASTEST, TierTokens
from warmfleet_daemon.api import agent_requests
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.output import Piece, Splitter, merge
from warmfleet_daemon.engine.requests import Event, Usage
from warmfleet_daemon.runtime.assembly import Ready

PING_EVERY_S = 5.0  # Anthropic clients wait for bytes; a long prefill sends pings


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def usage(
    request: agent_requests.AgentRequest, used: Usage | None, *, served: bool = True
) -> dict[str, Any]:
    """Anthropic's usage: prompt = input_tokens (computed after the last breakpoint)
    + cache_read_input_tokens + cache_creation_input_tokens; a served request's also
    says which tier its cached tokens came from (a warmfleet extension)."""
    prompt = len(request.prompt.tokens)
    cached = used.cached_tokens if used else 0
    created = agent_requests.cache_creation(request.breakpoints, cached)
    creation = sum(created.values())
    out: dict[str, Any] = {
        "input_tokens": prompt - cached - creation,
        "cache_creation_input_tokens": creation,
        "cache_read_input_tokens": cached,
        "cache_creation": {
            "ephemeral_5m_input_tokens": created["5m"],
            "ephemeral_1h_input_tokens": created["1h"],
        },
        "output_tokens": used.completion_tokens if used else 0,
    }
    if served and used is not None:
        out["cached_tokens_by_tier"] = gen.tiers_of(used)
    return out


def estimated_usage(ready: Ready, request: agent_requests.AgentRequest) -> dict[str, Any]:
    """The usage `message_start` carries, before the prompt is prefilled: what the
    cache holds of it now (`message_delta` carries the exact figures at the end)."""
    chunks = ready.engine.plan(request.prompt)
    held = ready.engine.cache.match(chunks).tokens if chunks else 0
    held = min(held, len(request.prompt.tokens) - 1)  # the last token is always computed
    cached = TierTokens({FASTEST: max(held, 0)})  # not served: every tier is counted at the end
    return usage(request, Usage(len(request.prompt.tokens), 0, cached), served=False)


def block_of(piece: Piece, thinking_shown: bool) -> dict[str, Any]:
    """A finished piece as a response content block."""
    if piece.kind == "thinking":
        return {
            "type": "thinking",
            "thinking": piece.text if thinking_shown else "",
            "signature": "",
        }
    if piece.kind == "tool_call":
        assert piece.call is not None
        return {
            "type": "tool_use",
            "id": tool_use_id(),
            "name": piece.call["function"]["name"],
            "input": _input(piece.call["function"]["arguments"]),
        }
    return {"type": "text", "text": piece.text}


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}


def message(
    ready: Ready,
    request: agent_requests.AgentRequest,
    model: str,
    text: str,
    final: Event,
    generated: list[int],
) -> dict[str, Any]:
    """The whole response (`POST /v1/messages` without streaming)."""
    splitter = request.splitter(ready)
    pieces = merge([*splitter.feed(text), *splitter.finish()])
    blocks = [block_of(p, request.options.thinking_shown) for p in pieces]
    calls = sum(p.kind == "tool_call" for p in pieces)
    reason, sequence = agent_requests.stop_reason_of(
        final, generated, request.client_stops, ready, calls
    )
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(request, final.usage),
    }


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class _Blocks:
    """The stream's content blocks: one open at a time, numbered in order."""

    def __init__(self, thinking_shown: bool) -> None:
        self.index = -1
        self.open: str | None = None
        self.thinking_shown = thinking_shown
        self.calls = 0
        self.content: list[dict[str, Any]] = []  # the blocks as sent, whole

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def piece(self, piece: Piece) -> list[bytes]:
        out: list[bytes] = []
        if piece.kind == "tool_call":
            assert piece.call is not None
            out += self.close()
            self.index += 1
            self.calls += 1
            block = block_of(piece, self.thinking_shown)
            self.content.append(block)
            arguments = json.dumps(block["input"], ensure_ascii=False)
            out.append(_start(self.index, {**block, "input": {}}))
            out.append(_delta(self.index, {"type": "input_json_delta", "partial_json": arguments}))
            out.append(
                sse("content_block_stop", {"type": "content_block_stop", "index": self.index})
            )
            return out
        if self.open != piece.kind:
            out += self.close()
            self.index += 1
            self.open = piece.kind
            empty = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if piece.kind == "thinking"
                else {"type": "text", "text": ""}
            )
            out.append(_start(self.index, empty))
            self.content.append(dict(empty))
        block = self.content[-1]
        if piece.kind == "thinking":
            block["thinking"] += piece.text if self.thinking_shown else ""
            if self.thinking_shown and piece.text:
                out.append(_delta(self.index, {"type": "thinking_delta", "thinking": piece.text}))
        elif piece.text:
            block["text"] += piece.text
            out.append(_delta(self.index, {"type": "text_delta", "text": piece.text}))
        return out


def _start(index: int, block: dict[str, Any]) -> bytes:
    return sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def error_event(status: int, message: str) -> bytes:
    return sse("error", anthropic_error_body(message, anthropic_type(status)))


async def stream(
    ready: Ready,
    request: agent_requests.AgentRequest,
    model: str,
    answered: Callable[[list[dict[str, Any]]], None] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The response as Anthropic's server-sent events; `answered` gets the content
    blocks as sent once the answer is complete."""
    start: dict[str, Any] = {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**estimated_usage(ready, request), "output_tokens": 0},
    }
    yield sse("message_start", {"type": "message_start", "message": start})
    splitter: Splitter = request.splitter(ready)
    blocks = _Blocks(request.options.thinking_shown)
    generated: list[int] = []
    final: Event | None = None
    events = gen.choice_events(ready, [request.generation])
    async with aclosing(events), aclosing(gen.heartbeat(events, PING_EVERY_S)) as beats:
        async for item in beats:
            if item is None:
                yield sse("ping", {"type": "ping"})
                continue
            _, event = item
            generated.extend(event.token_ids)
            if event.finish_reason in ("error", "abort"):
                yield error_event(500, f"generation failed: {event.error or event.finish_reason}")
                return
            for piece in splitter.feed(event.text):
                for chunk in blocks.piece(piece):
                    yield chunk
            if event.finish_reason is not None:
                final = event
    assert final is not None
    for piece in splitter.finish():
        for chunk in blocks.piece(piece):
            yield chunk
    for chunk in blocks.close():
        yield chunk
    agent_requests.hold_breakpoints(ready, request)
    reason, sequence = agent_requests.stop_reason_of(
        final, generated, request.client_stops, ready, blocks.calls
    )
    delta_usage = usage(request, final.usage)
    delta_usage.pop("cache_creation")
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": delta_usage,
        },
    )
    yield sse("message_stop", {"type": "message_stop"})
    if answered is not None and final.finish_reason in ("stop", "length"):
        answered(blocks.content)
