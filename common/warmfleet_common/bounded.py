"""Reads from another process, bounded in bytes and in time: a body larger than its
limit, a line longer than its limit, or an answer slower than its deadline is an error
the caller handles, never memory or a task that grows or waits without end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

# How long a server (daemon, router) keeps an idle keep-alive connection, and how long
# warmfleet's own clients reuse one. A client that reuses a connection the server is
# closing gets a reset on a request it cannot retry: servers wait longer than the
# clients agents use (httpx and the OpenAI SDK 5 s, Node's undici 4 s, aiohttp 15 s),
# as nginx's 75 s does, and warmfleet's clients give up first.
SERVER_KEEP_ALIVE_S = 75
CLIENT_KEEP_ALIVE_S = 4.0


class TooLarge(ValueError):
    """The other side sent more than the limit."""


class TooSlow(TimeoutError):
    """The other side did not finish within the deadline."""


@dataclass(frozen=True)
class Answer:
    status: int
    content: bytes
    headers: httpx.Headers


async def read_body(response: httpx.Response, limit: int) -> bytes:
    """The (decoded) body of a streamed response, at most `limit` bytes (TooLarge past
    it)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"{response.request.url.path}: {declared} bytes, over the {limit} limit")
    try:
        content = response.content  # read already (httpx.MockTransport's answers are)
    except httpx.ResponseNotRead:
        pass
    else:
        if len(content) > limit:
            raise TooLarge(f"{response.request.url.path}: over the {limit} byte limit")
        return content
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():  # decoded: a compressed bomb counts in full
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"{response.request.url.path}: over the {limit} byte limit")
        parts.append(chunk)
    return b"".join(parts)


async def get(
    client: httpx.AsyncClient,
    url: str,
    *,
    limit: int,
    deadline: float,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str | int | float] | None = None,
) -> Answer:
    """GET `url` whole within `deadline` seconds and `limit` bytes of body."""
    try:
        with anyio.fail_after(deadline):  # asyncio.timeout is Python 3.11+
            async with client.stream(
                "GET", url, headers=headers, params=params, timeout=deadline
            ) as r:
                return Answer(r.status_code, await read_body(r, limit), r.headers)
    except TimeoutError as exc:
        if isinstance(exc, TooSlow):
            raise
        raise TooSlow(f"{httpx.URL(url).path}: no whole answer within {deadline:g}s") from exc


async def post(
    client: httpx.AsyncClient,
    url: str,
    *,
    json: Any,
    limit: int,
    deadline: float,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """POST `json` to `url`, its answer whole within `deadline` seconds and `limit` bytes."""
    try:
        with anyio.fail_after(deadline):
            async with client.stream(
                "POST", url, json=json, headers=headers, timeout=deadline
            ) as r:
                return Answer(r.status_code, await read_body(r, limit), r.headers)
    except TimeoutError as exc:
        if isinstance(exc, TooSlow):
            raise
        raise TooSlow(f"{httpx.URL(url).path}: no whole answer within {deadline:g}s") from exc


async def lines(
    chunks: AsyncIterator[bytes], max_line: int, *, what: str = "stream"
) -> AsyncIterator[bytes]:
    """The lines of a byte stream (without their newline), none longer than `max_line`
    bytes (TooLarge: one longer line, however slowly it arrives)."""
    partial = bytearray()
    async for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                partial += chunk[start:]
                if len(partial) > max_line:
                    raise TooLarge(f"{what}: a line over {max_line} bytes")
                break
            partial += chunk[start:end]
            if len(partial) > max_line:
                raise TooLarge(f"{what}: a line over {max_line} bytes")
            yield bytes(partial.rstrip(b"\r"))
            partial.clear()
            start = end + 1
    if partial:
        yield bytes(partial)
