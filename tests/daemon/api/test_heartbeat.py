"""The keep-alive beat of a long prefill (Anthropic's `ping`, the Responses API's
`keepalive`): a client that goes away while the engine has not answered yet closes the
stream cleanly, the engine's events included, with no "already running" error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest

from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.engine.requests import Event

pytestmark = pytest.mark.asyncio


def engine_events(closed: list[str]) -> AsyncIterator[tuple[int, Event]]:
    """A request whose prefill has not produced an event yet (and is closed on cancel)."""

    async def events() -> AsyncIterator[tuple[int, Event]]:
        try:
            await asyncio.sleep(3600)
            yield 0, Event("never")
        finally:
            closed.append("events")

    return events()


async def stream(closed: list[str], beats_seen: list[None]) -> None:
    """What the agent routes do with the beat."""
    events = engine_events(closed)
    async with aclosing(events), aclosing(gen.heartbeat(events, 0.01)) as beats:
        async for item in beats:
            assert item is None
            beats_seen.append(item)


async def test_a_client_gone_during_the_prefill_closes_the_stream_cleanly() -> None:
    closed: list[str] = []
    beats: list[None] = []
    task = asyncio.create_task(stream(closed, beats))
    await asyncio.sleep(0.1)  # a few beats: the prefill goes on
    assert beats
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == ["events"]


async def test_the_same_under_the_cancel_scope_the_server_uses() -> None:
    closed: list[str] = []
    beats: list[None] = []
    with anyio.move_on_after(0.1):  # starlette cancels a request's scope when it goes
        await stream(closed, beats)
    assert beats and closed == ["events"]
