"""What the proxy holds back of a stream: only the empty opening event, so a backend
that fails during prefill can still be retried; the first output passes at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from warmfleet_router.proxy import _first_progress
from warmfleet_router.routes import CHAT

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TEXT = b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
REST = b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def first(*parts: bytes) -> tuple[bytes, list[bytes]]:
    async def go() -> tuple[bytes, list[bytes]]:
        it = chunks(*parts)
        head = await _first_progress(it, CHAT)
        return head, [c async for c in it]

    return asyncio.run(go())


def test_the_opening_event_waits_for_the_first_output() -> None:
    assert first(ROLE, TEXT, REST) == (ROLE + TEXT, [REST])


def test_an_event_split_across_chunks_is_waited_for() -> None:
    assert first(ROLE + TEXT[:20], TEXT[20:], REST) == (ROLE + TEXT, [REST])


def test_output_in_the_first_chunk_passes_at_once() -> None:
    assert first(TEXT, REST) == (TEXT, [REST])


def test_errors_usage_finish_and_done_count_as_output() -> None:
    for event in (
        b'data: {"error":{"message":"boom"}}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\n',
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n',
        b'data: {"choices":[{"text":"x"}]}\n\n',  # /v1/completions
        b"data: [DONE]\n\n",
    ):
        assert first(ROLE, event, REST) == (ROLE + event, [REST])


def test_a_stream_that_ends_early_returns_what_it_had() -> None:
    assert first(ROLE) == (ROLE, [])
