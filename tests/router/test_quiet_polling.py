"""A quiet fleet costs the router little (issue 45): while a daemon's event stream is live
and its heartbeats say its state and a digest of its warm sets, the router reads
/readyz, its models and its warm sets every `quiet_interval` instead of every few
seconds; a new digest reads its warm sets at once, a `draining` beat marks it draining at
once, and the stream's end brings the health checks back. A daemon whose heartbeats say
nothing of the kind (an older one) is polled as before. Fake daemons
(httpx.MockTransport), counted reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from support.router import mocked_fleet
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.fleet import Fleet
from warmfleet_router.options import RouterOptions
from warmfleet_router.sync import SyncOptions

pytestmark = pytest.mark.asyncio
HELLO = {"type": "hello", "epoch": "e1", "seq": 0}
SYNC = SyncOptions(
    health_interval=0.05,
    models_interval=0.05,
    warm_sets_interval=0.05,
    heartbeat=0.1,
    retry=0.05,
    max_retry=0.1,
    quiet_interval=60.0,
)


class Daemon:
    """A fake daemon: `beats` says what each heartbeat carries (None: an older daemon's
    bare heartbeat); `ended` ends the event stream."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.beat: dict[str, Any] | None = {"state": "serving", "warm_sets": "d1"}
        self.ended = asyncio.Event()
        self.readyz: dict[str, Any] = {"status": "ready"}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.asked[path] = self.asked.get(path, 0) + 1
        if path == "/readyz":
            return httpx.Response(
                200 if self.readyz["status"] == "ready" else 503, json=self.readyz
            )
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if path == "/v1/status":
            return httpx.Response(200, json={"model": {"aliases": ["m"]}})
        if path == "/v1/warm-sets":
            return httpx.Response(200, json={"sets": []})
        if path == "/v1/cache/snapshot":
            return httpx.Response(200, json={"epoch": "e1", "seq": 0, "blocks": []})
        if path == "/v1/cache/events":
            return httpx.Response(200, content=self._events())
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    async def _events(self) -> AsyncIterator[bytes]:
        yield json.dumps(HELLO).encode() + b"\n"
        while not self.ended.is_set():
            await asyncio.sleep(SYNC.heartbeat)
            yield json.dumps({"type": "heartbeat", "seq": 0, **(self.beat or {})}).encode() + b"\n"

    def count(self, path: str) -> int:
        return self.asked.get(path, 0)


async def start(daemon: Daemon) -> tuple[Fleet, Backend, Callable[[], Any]]:
    context = mocked_fleet(RouterOptions(sync=SYNC), daemon)
    fleet = await context.__aenter__()
    await fleet.members.apply([BackendSpec("d", "http://d")])
    await fleet.members.first_checks()
    backend = fleet.members.backends["d"]
    await until(lambda: backend.index_mode == "following")
    await asyncio.sleep(3 * SYNC.heartbeat)  # its first beats
    return fleet, backend, lambda: context.__aexit__(None, None, None)


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)


async def reads_in(daemon: Daemon, seconds: float) -> dict[str, int]:
    before = dict(daemon.asked)
    await asyncio.sleep(seconds)
    paths = ("/readyz", "/v1/models", "/v1/warm-sets")
    return {p: daemon.count(p) - before.get(p, 0) for p in paths}


async def test_a_daemon_whose_heartbeats_say_its_state_is_rarely_polled() -> None:
    quiet, older = Daemon(), Daemon()
    older.beat = None  # a daemon from before the heartbeats said anything
    stops = []
    for daemon in (quiet, older):
        stops.append((await start(daemon))[2])
    try:
        quiet_reads, older_reads = await asyncio.gather(reads_in(quiet, 1.0), reads_in(older, 1.0))
    finally:
        for stop in stops:
            await stop()
    assert quiet_reads == {"/readyz": 0, "/v1/models": 0, "/v1/warm-sets": 0}
    assert older_reads["/readyz"] >= 5 and older_reads["/v1/warm-sets"] >= 5  # as before


async def test_a_new_warm_set_digest_reads_the_warm_sets_at_once() -> None:
    daemon = Daemon()
    _, _, stop = await start(daemon)
    try:
        read = daemon.count("/v1/warm-sets")
        daemon.beat = {"state": "serving", "warm_sets": "d2"}
        await until(lambda: daemon.count("/v1/warm-sets") > read, seconds=2.0)
        assert daemon.count("/v1/warm-sets") == read + 1  # once for the change, then quiet
        assert (await reads_in(daemon, 0.5))["/v1/warm-sets"] == 0
    finally:
        await stop()


async def test_a_draining_beat_marks_it_draining_without_a_poll() -> None:
    daemon = Daemon()
    _, backend, stop = await start(daemon)
    try:
        polls = daemon.count("/readyz")
        daemon.beat = {"state": "draining", "warm_sets": "d1"}
        await until(lambda: backend.health == "draining", seconds=2.0)
        assert daemon.count("/readyz") == polls  # the stream said it
        assert not backend.usable
    finally:
        await stop()


async def test_the_streams_end_brings_the_health_checks_back() -> None:
    daemon = Daemon()
    _, backend, stop = await start(daemon)
    try:
        polls = daemon.count("/readyz")
        daemon.readyz = {"status": "unready", "reason": "gone"}
        daemon.ended.set()  # its stream ends (then it is back, still unready)
        await until(lambda: backend.health == "unready", seconds=3.0)
        assert daemon.count("/readyz") > polls
    finally:
        await stop()
