"""From engine events to OpenAI choices: content, tool calls (parsed by the model's
format), finish reasons and logprobs, whole (`collect`) or as stream deltas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from warmfleet_daemon.api.generation import Collected
from warmfleet_daemon.api.output import Piece, Splitter
from warmfleet_daemon.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    TokenLogprobInfo,
    ToolCall,
    TopLogprob,
)
from warmfleet_daemon.engine.processors import TokenLogprob
from warmfleet_daemon.engine.requests import Event

TokenBytes = Callable[[int], bytes]
ParserFactory = Callable[[], Splitter]
Renderer = Callable[[Event], list[dict[str, Any]]]
# Finish reasons of an answer the client will send back on its next turn.
ANSWERED = frozenset({"stop", "length"})


def _parts(pieces: list[Piece]) -> tuple[str, str, list[dict[str, Any]]]:
    """(reasoning, content, tool calls) of some output."""
    reasoning = "".join(p.text for p in pieces if p.kind == "thinking")
    content = "".join(p.text for p in pieces if p.kind == "text")
    return reasoning, content, [p.call for p in pieces if p.call is not None]


def _finish_reason(reason: str | None, calls: int) -> str | None:
    return "tool_calls" if reason == "stop" and calls else reason


def _token_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def chat_logprobs(entries: list[TokenLogprob], token_bytes: TokenBytes) -> ChoiceLogprobs:
    def top(token: int, logprob: float) -> TopLogprob:
        data = token_bytes(token)
        return TopLogprob(token=_token_text(data), logprob=logprob, bytes=list(data))

    return ChoiceLogprobs(
        content=[
            TokenLogprobInfo(
                **top(e.token, e.logprob).model_dump(),
                top_logprobs=[top(t, lp) for t, lp in e.top],
            )
            for e in entries
        ]
    )


def completion_logprobs(
    entries: list[TokenLogprob], token_bytes: TokenBytes, offset: int = 0
) -> CompletionLogprobs:
    tokens = [_token_text(token_bytes(e.token)) for e in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{_token_text(token_bytes(t)): lp for t, lp in e.top} for e in entries],
        text_offset=offsets,
    )


def chat_choice(
    index: int,
    collected: Collected,
    splitter: Splitter,
    token_bytes: TokenBytes | None,
) -> ChatChoice:
    reasoning, content, calls = _parts([*splitter.feed(collected.text), *splitter.finish()])
    message = AssistantMessage(
        content=None if calls and not content.strip() else content,
        reasoning_content=reasoning or None,
        tool_calls=[ToolCall.model_validate(c) for c in calls] or None,
    )
    return ChatChoice(
        index=index,
        message=message,
        finish_reason=_finish_reason(collected.final.finish_reason, len(calls)),
        logprobs=chat_logprobs(collected.logprobs, token_bytes) if token_bytes else None,
    )


def completion_choice(
    index: int, collected: Collected, token_bytes: TokenBytes | None
) -> CompletionChoice:
    return CompletionChoice(
        index=index,
        text=collected.text,
        finish_reason=collected.final.finish_reason,
        logprobs=completion_logprobs(collected.logprobs, token_bytes) if token_bytes else None,
    )


def chat_deltas(
    index: int, splitter: Splitter, token_bytes: TokenBytes | None
) -> Callable[[Event], list[dict[str, Any]]]:
    """Choice `index`'s stream: reasoning and content deltas as the text comes (held
    back only while it may be the start of a marker or a tool call), a `tool_calls`
    delta per parsed call, and the finish reason (`tool_calls` when there were calls)."""

    def render(event: Event) -> list[dict[str, Any]]:
        pieces = splitter.feed(event.text)
        if event.finish_reason is not None:
            pieces += splitter.finish()
        reasoning, content, calls = _parts(pieces)
        out = []
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            first = splitter.calls - len(calls)
            delta["tool_calls"] = [{"index": first + i, **c} for i, c in enumerate(calls)]
        logprobs = (
            chat_logprobs(list(event.logprobs), token_bytes).model_dump()
            if token_bytes and event.logprobs
            else None
        )
        if delta or logprobs:
            out.append(
                {"index": index, "delta": delta, "finish_reason": None, "logprobs": logprobs}
            )
        if event.finish_reason is not None:
            reason = _finish_reason(event.finish_reason, splitter.calls)
            out.append({"index": index, "delta": {}, "finish_reason": reason, "logprobs": None})
        return out

    return render


def completion_deltas(
    index: int, token_bytes: TokenBytes | None
) -> Callable[[Event], list[dict[str, Any]]]:
    offset = 0

    def render(event: Event) -> list[dict[str, Any]]:
        nonlocal offset
        out = []
        if event.text or (token_bytes and event.logprobs):
            logprobs = (
                completion_logprobs(list(event.logprobs), token_bytes, offset).model_dump()
                if token_bytes
                else None
            )
            offset += len(event.text)
            out.append(
                {"index": index, "text": event.text, "finish_reason": None, "logprobs": logprobs}
            )
        if event.finish_reason is not None:
            out.append(
                {"index": index, "text": "", "finish_reason": event.finish_reason, "logprobs": None}
            )
        return out

    return render
