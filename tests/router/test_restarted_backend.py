"""A daemon that restarts is ready again, with an empty cache, before the router's event
stream to it is back: from the moment the stream ends, the router predicts nothing of
that daemon's cache (not the blocks the stopped process held, nor its warm prompts) until
a snapshot of the new process says what it holds. Fake daemon (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from support.router import mocked_fleet
from warmfleet_router.backend import BackendSpec
from warmfleet_router.keys import RequestBlocks
from warmfleet_router.options import RouterOptions
from warmfleet_router.sync import SyncOptions

pytestmark = pytest.mark.asyncio
SYNC = SyncOptions(
    health_interval=0.05,
    models_interval=0.05,
    warm_sets_interval=0.05,
    heartbeat=0.1,
    retry=0.05,
    max_retry=0.1,
)
HEAD, NEXT = "ab" * 16, "cd" * 16
REQUEST = RequestBlocks((bytes.fromhex(HEAD), bytes.fromhex(NEXT)), (128, 256), tokens=300)


class Daemon:
    """Holds HEAD (cached, and a pinned warm prompt) until it restarts; its event stream
    answers only while `streams` is set."""

    def __init__(self) -> None:
        self.epoch, self.blocks = "e1", [HEAD]
        self.ended = asyncio.Event()
        self.streams = asyncio.Event()
        self.streams.set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/readyz":
            return httpx.Response(200, json={"status": "ready"})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if path == "/v1/status":
            return httpx.Response(200, json={"model": {"id": "m", "aliases": ["m"]}})
        if path == "/v1/warm-sets":
            prompt = {"name": "head", "state": "warm", "content_hash": "h", "tokens": 128,
                      "blocks": self.blocks}  # fmt: skip
            warm = {
                "namespace": "default", "name": "agents", "generation": 1, "content_hash": "c",
                "concurrency": 2, "pin": True, "prompts": [prompt], "warm": 1, "total": 1,
                "updated_at": 0.0,
            }  # fmt: skip
            return httpx.Response(200, json={"sets": [warm] if self.blocks else []})
        if path == "/v1/cache/snapshot":
            blocks = [{"key": k, "start": 0, "end": 128} for k in self.blocks]
            return httpx.Response(200, json={"epoch": self.epoch, "seq": 0, "blocks": blocks})
        if path == "/v1/cache/events":
            if not self.streams.is_set():
                raise httpx.ConnectError("the daemon is not listening for its stream yet")
            return httpx.Response(200, content=self._events())
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    async def _events(self) -> AsyncIterator[bytes]:
        yield json.dumps({"type": "hello", "epoch": self.epoch, "seq": 0}).encode() + b"\n"
        while not self.ended.is_set():
            await asyncio.sleep(SYNC.heartbeat)
            yield json.dumps({"type": "heartbeat", "seq": 0}).encode() + b"\n"

    def restart(self) -> None:
        """The process stops (its stream ends) and a new one, cold, answers /readyz."""
        self.streams.clear()
        self.epoch, self.blocks = "e2", []
        self.ended.set()


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)


async def test_a_restarted_daemon_is_predicted_cold_until_its_new_snapshot() -> None:
    daemon = Daemon()
    async with mocked_fleet(RouterOptions(sync=SYNC), daemon) as fleet:
        await fleet.members.apply([BackendSpec("d", "http://d")])
        await fleet.members.first_checks()
        backend = fleet.members.backends["d"]
        predicted: Callable[[], Any] = lambda: fleet.index.predict("d", REQUEST)  # noqa: E731
        await until(lambda: backend.index_mode == "following" and backend.warm_sets != [])
        assert predicted() == 128

        daemon.restart()
        await until(lambda: predicted() == 0)  # its stream ended: the old blocks are gone
        assert backend.usable and backend.index_mode == "resyncing"
        await asyncio.sleep(5 * SYNC.max_retry)  # ready, its stream not back: still nothing
        assert backend.usable and predicted() == 0

        daemon.ended.clear()
        daemon.streams.set()
        await until(lambda: backend.index_mode == "following" and backend.epoch == "e2")
        await until(lambda: backend.warm_sets == [])
        assert predicted() == 0
