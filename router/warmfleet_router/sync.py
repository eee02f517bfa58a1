"""Keeping each backend's entry current: health checks, its cache events, its warm sets.

Health: `GET /readyz` every `health_interval`; a failed request or a 5xx seen by the
proxy marks it down at once (passive check), the next good probe brings it back.
Models: the names it answers to (`/v1/models`, plus a warmfleet daemon's aliases from
`/v1/status`), read when it becomes ready and every `models_interval` while it is.
Cache events: the daemon's layout, then a snapshot, then the event stream from the
snapshot's sequence number; a gap (a sequence number skipped, a heartbeat ahead of the
last event) or a `reset` line means fetch a new snapshot; a dropped connection means
reconnect after the last event seen (the daemon replays what it still buffers). A
backend without these routes (any OpenAI server) stays on history estimates, and is
asked again only every `no_events_retry` seconds.
Warm sets: a warmfleet daemon's `/v1/warm-sets` every `warm_sets_interval`; the blocks
of its warm prompts in pinned sets count as held there, with or without events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.contract import PromptState, WarmSetList
from warmfleet_common.wire import (
    BlockEvicted,
    BlockStored,
    CacheEventLine,
    CacheSnapshot,
    DaemonStatus,
    EventsHeartbeat,
    EventsHello,
    EventsReset,
    ModelList,
    parse_event_line,
)
from warmfleet_router.backend import Backend
from warmfleet_router.index import BlockIndex

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class SyncOptions:
    health_interval: float = 2.0
    models_interval: float = 10.0
    warm_sets_interval: float = 10.0
    heartbeat: float = 5.0  # asked of the daemon; a stream silent for 3x this is dead
    retry: float = 2.0
    no_events_retry: float = 60.0  # a backend known to serve no events is asked this often


class ResyncNeeded(Exception):
    """The index has missed events: fetch a snapshot."""


# Registers a layout and returns when a keyer for it is ready (built off the loop).
LayoutSink = Callable[[CacheLayout], Awaitable[None]]
OnIndexEvent = Callable[[Backend, str], None]  # (backend, "resync" | "event")


class BackendSync:
    """The tasks that follow one backend."""

    def __init__(
        self,
        backend: Backend,
        client: httpx.AsyncClient,
        index: BlockIndex,
        layouts: LayoutSink,
        options: SyncOptions,
        on_index: OnIndexEvent | None = None,
    ) -> None:
        self.backend = backend
        self._client = client
        self._index = index
        self._layouts = layouts
        self._options = options
        self._on_index = on_index
        self._tasks: list[asyncio.Task[None]] = []
        self._checked = asyncio.Event()
        self._models_read = -math.inf  # loop time of the last read of its model names

    def start(self) -> None:
        name = self.backend.name
        self._tasks = [
            asyncio.create_task(self._health_loop(), name=f"health-{name}"),
            asyncio.create_task(self._events_loop(), name=f"events-{name}"),
            asyncio.create_task(self._warm_sets_loop(), name=f"warm-sets-{name}"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._index.forget(self.backend.name)

    async def first_check(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._checked.wait(), timeout)

    # -- health -------------------------------------------------------------------

    async def check_health(self) -> None:
        try:
            await self._probe()
        finally:
            self._checked.set()

    async def _probe(self) -> None:
        backend = self.backend
        try:
            r = await self._client.get(f"{backend.url}/readyz", timeout=5.0)
        except httpx.HTTPError as exc:
            backend.set_health("down", f"{type(exc).__name__}: {exc}")
            return
        if r.status_code == 200:
            now = asyncio.get_running_loop().time()
            stale = now - self._models_read >= self._options.models_interval
            if backend.health != "ready" or stale:  # it may have restarted with another model
                await self.read_models()
                self._models_read = now
            backend.set_health("ready")
            return
        status = _json_field(r, "status")
        backend.set_health(
            "draining" if status == "draining" else "unready", status or r.text[:200]
        )

    async def read_models(self) -> None:
        """The names the backend answers to; kept as they were when it cannot say."""
        backend = self.backend
        try:
            r = await self._client.get(f"{backend.url}/v1/models", timeout=5.0)
            listed = ModelList.model_validate_json(r.content) if r.status_code == 200 else None
        except (httpx.HTTPError, ValidationError):
            return
        if listed is None:
            return
        names = {m.id for m in listed.data if m.id}
        try:  # a warmfleet daemon also answers to its aliases (`default`, its --model)
            r = await self._client.get(f"{backend.url}/v1/status", timeout=5.0)
            if r.status_code == 200:
                status = DaemonStatus.model_validate_json(r.content)
                if status.model is not None:
                    names.update(status.model.aliases)
        except (httpx.HTTPError, ValidationError):
            pass
        backend.models = frozenset(names) or None

    async def _health_loop(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self._options.health_interval)

    # -- warm sets ----------------------------------------------------------------

    async def _warm_sets_loop(self) -> None:
        while True:
            if self.backend.usable:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    await self.read_warm_sets()
            await asyncio.sleep(self._options.warm_sets_interval)

    async def read_warm_sets(self) -> None:
        """Its warm sets, and the blocks of their warm prompts where the set is pinned."""
        backend = self.backend
        r = await self._client.get(
            f"{backend.url}/v1/warm-sets", headers=backend.admin_headers(), timeout=5.0
        )
        if r.status_code != 200:
            return
        sets = WarmSetList.model_validate_json(r.content).sets
        backend.warm_sets = [
            {"namespace": s.namespace, "name": s.name, "warm": s.warm, "total": s.total,
             "pin": s.pin}
            for s in sets
        ]  # fmt: skip
        self._index.set_pinned(
            backend.name,
            (
                bytes.fromhex(key)
                for s in sets
                if s.pin
                for p in s.prompts
                if p.state is PromptState.WARM
                for key in p.blocks
            ),
        )

    # -- cache events ---------------------------------------------------------------

    async def _events_loop(self) -> None:
        backend = self.backend
        need_snapshot = True
        while True:
            try:
                if need_snapshot:
                    await self._resync()
                    need_snapshot = False
                await self._follow()
            except ResyncNeeded as exc:
                log.info("%s: cache index resync (%s)", backend.name, exc)
                need_snapshot = True
                continue
            except _NoEvents as exc:
                if backend.index_mode != "history":
                    log.warning(
                        "%s: no cache events (%s); estimating from history", backend.name, exc
                    )
                    self._index.forget(backend.name, keep_pinned=True)
                backend.index_mode = "history"
                backend.last_error = f"events: {exc}"
                # Its warm sets' blocks are keyed by its layout, when it serves one.
                with contextlib.suppress(httpx.HTTPError, _NoEvents, ValueError, ValidationError):
                    await self._read_layout()
                await asyncio.sleep(self._options.no_events_retry)
                need_snapshot = True
                continue
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                # Connection lost: keep what is known, reconnect after the last event.
                backend.last_error = f"events: {type(exc).__name__}: {exc}"
                if backend.index_mode == "resyncing":
                    need_snapshot = True
            await asyncio.sleep(self._options.retry)

    async def _resync(self) -> None:
        backend = self.backend
        backend.index_mode = "resyncing"
        snap = await self._get("/v1/cache/snapshot", CacheSnapshot)
        if snap.fingerprint != backend.fingerprint:
            await self._read_layout()
        self._index.load_snapshot(
            backend.name, ((bytes.fromhex(b.key), b.logits) for b in snap.blocks)
        )
        backend.epoch, backend.seq = snap.epoch, snap.seq
        backend.index_mode = "following"
        backend.last_error = ""
        backend.resyncs += 1
        if self._on_index:
            self._on_index(backend, "resync")

    async def _read_layout(self) -> None:
        backend = self.backend
        layout = await self._get("/v1/cache/layout", CacheLayout)
        await self._layouts(layout)
        backend.fingerprint, backend.model = layout.fingerprint, layout.model

    async def _follow(self) -> None:
        backend = self.backend
        params: dict[str, str | int | float] = {
            "after": backend.seq,
            "epoch": backend.epoch or "",
            "heartbeat": self._options.heartbeat,
        }
        timeout = httpx.Timeout(10.0, read=3 * self._options.heartbeat)
        async with self._client.stream(
            "GET",
            f"{backend.url}/v1/cache/events",
            params=params,
            headers=backend.admin_headers(),
            timeout=timeout,
        ) as r:
            if r.status_code != 200:
                await r.aread()
                _raise_for_events(r)
            async for line in r.aiter_lines():
                if line.strip():
                    self.apply(parse_event_line(line))

    def apply(self, event: CacheEventLine) -> None:
        """Apply one line of the event stream (raises ResyncNeeded on a gap)."""
        backend, index = self.backend, self._index
        if isinstance(event, EventsHello):
            if event.epoch != backend.epoch:
                raise ResyncNeeded("the daemon restarted")
            return
        if isinstance(event, EventsReset):
            raise ResyncNeeded(f"daemon says reset: {event.reason}")
        if isinstance(event, EventsHeartbeat):
            if event.seq != backend.seq:
                raise ResyncNeeded(f"heartbeat at {event.seq}, index at {backend.seq}")
            return
        if event.seq != backend.seq + 1:
            raise ResyncNeeded(f"event {event.seq} after {backend.seq}")
        if isinstance(event, BlockStored):
            index.stored(backend.name, bytes.fromhex(event.key), event.logits)
        elif isinstance(event, BlockEvicted):
            index.evicted(backend.name, bytes.fromhex(event.key))
        else:
            index.cleared(backend.name)
        backend.seq = event.seq
        if self._on_index:
            self._on_index(backend, "event")

    async def _get(self, path: str, model: type[M]) -> M:
        """An admin route's answer, parsed with its wire model."""
        headers = self.backend.admin_headers()
        r = await self._client.get(f"{self.backend.url}{path}", headers=headers, timeout=30.0)
        if r.status_code != 200:
            _raise_for_events(r)
        return model.model_validate_json(r.content)


class _NoEvents(Exception):
    """This backend serves no cache events to us (not a warmfleet daemon, no token...)."""


def _raise_for_events(r: httpx.Response) -> None:
    if r.status_code in (404, 405):
        raise _NoEvents(f"{r.request.url.path}: {r.status_code} (not a warmfleet daemon?)")
    if r.status_code in (401, 403):
        raise _NoEvents(
            f"{r.request.url.path}: {r.status_code}: the admin token is missing or wrong"
        )
    raise httpx.HTTPStatusError(
        f"{r.request.url.path}: HTTP {r.status_code}", request=r.request, response=r
    )


def _json_field(r: httpx.Response, key: str) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return None
    value = body.get(key) if isinstance(body, dict) else None
    return str(value) if value is not None else None
