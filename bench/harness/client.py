"""A benchmark's client: streamed chat completions timed as a client sees them (time to
first token, the tokens' times, the usage the server reports), one at a time or several
at once."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def sse_data(line: str) -> dict[str, Any] | None:
    """The JSON of a server-sent `data:` line (None for other lines and `[DONE]`)."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    return dict(json.loads(line[6:]))


@dataclass
class Streamed:
    """One streamed chat completion: when it was sent, when content came (the first and
    the last piece), its text, and the usage and finish reason the server sent."""

    sent_at: float
    ended_at: float = 0.0
    first_at: float | None = None
    last_at: float | None = None
    pieces: int = 0
    text: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    backend: str = ""  # x-warmfleet-backend: where a router sent it

    @property
    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details") or {}
        return details.get("cached_tokens")


def stream_chat(
    url: str,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    headers: dict[str, str] | None = None,
    timeout: float = 600,
) -> Streamed:
    """POST /v1/chat/completions, streamed (greedy, with usage), read to its end."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = Streamed(time.perf_counter())
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout
    ) as r:
        r.raise_for_status()
        out.backend = r.headers.get("x-warmfleet-backend", "")
        for line in r.iter_lines():
            chunk = sse_data(line)
            if chunk is None:
                continue
            out.usage = chunk.get("usage") or out.usage
            for choice in chunk.get("choices") or []:
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    out.first_at = out.first_at or now
                    out.last_at = now
                    out.pieces += 1
                    out.text += piece
    out.ended_at = time.perf_counter()
    return out


@dataclass
class Result:
    ttft_s: float
    completion_tokens: int
    first_token_at: float
    last_token_at: float
    cached_tokens: int | None = None


def stream(url: str, model: str, messages: list[dict[str, Any]], max_tokens: int) -> Result:
    """A streamed request's TTFT and token times (it must stream some content)."""
    s = stream_chat(url, model, messages, max_tokens)
    assert s.first_at is not None and s.last_at is not None, "no content streamed"
    return Result(
        ttft_s=s.first_at - s.sent_at,
        completion_tokens=s.usage.get("completion_tokens", s.pieces),
        first_token_at=s.first_at,
        last_token_at=s.last_at,
        cached_tokens=s.cached_tokens,
    )


def decode_tok_s(r: Result) -> float:
    """One stream's decode rate: its tokens after the first / the time after the first."""
    return (r.completion_tokens - 1) / (r.last_token_at - r.first_token_at)


def aggregate_tok_s(results: list[Result]) -> float:
    """Streams sent together: their completion tokens / (the last token - the first request
    sent), the aggregate a client sees, prefills included."""
    start = min(r.first_token_at - r.ttft_s for r in results)
    end = max(r.last_token_at for r in results)
    return sum(r.completion_tokens for r in results) / (end - start)


def concurrent(
    url: str,
    model: str,
    conversations: list[list[dict[str, Any]]],
    max_tokens: int,
    delays: list[float] | None = None,
) -> list[Result]:
    """The conversations streamed at once (each after its delay, in seconds)."""
    results: list[Result | None] = [None] * len(conversations)

    def go(i: int) -> None:
        if delays:
            time.sleep(delays[i])
        results[i] = stream(url, model, conversations[i], max_tokens)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


@dataclass
class Turn:
    """A turn of a session: its TTFT, usage, answer, and where a router sent it."""

    ttft_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    text: str
    backend: str = ""  # x-warmfleet-backend: where the router sent it


def turn(
    url: str,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    headers: dict[str, str] | None = None,
) -> Turn:
    """A session's turn, streamed; an answer without a finish reason is an error."""
    s = stream_chat(url, model, messages, max_tokens, headers, timeout=1800)
    if s.finish_reason is None:  # the server gave up on the request (vllm-mlx: its --timeout)
        took = time.perf_counter() - s.sent_at
        raise RuntimeError(f"the stream ended without a finish_reason after {took:.0f} s")
    # Nothing streamed (an immediate EOS): the end is the first token.
    first = s.first_at if s.first_at is not None else s.ended_at
    return Turn(
        first - s.sent_at,
        int(s.usage.get("prompt_tokens", 0)),
        int(s.usage.get("completion_tokens", 0)),
        s.cached_tokens,
        s.text,
        s.backend,
    )
