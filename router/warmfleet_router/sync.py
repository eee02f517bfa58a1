"""Keeping each backend's entry current: health checks, its cache events, its warm sets.

Health: `GET /readyz` every `health_interval`; a failed request or a 5xx seen by the
proxy marks it down at once (passive check), the next good probe brings it back.
Models: the names it answers to (`/v1/models`, plus a warmfleet daemon's aliases from
`/v1/status`), its context length and what a token costs it per tier (`tier_costs`,
also in its layout), read when it becomes ready and every `models_interval` while it is.
Cache events: the daemon's layout, then a snapshot, then the event stream from the
snapshot's sequence number; a gap (a sequence number skipped, a heartbeat ahead of the
last event), a `reset` line or the stream's end means fetch a new snapshot, and until
then nothing of its cache is known (a restarted daemon is ready, and cold, before its
stream is back). A backend without these routes (any OpenAI server) stays on history
estimates, and is asked again only every `no_events_retry` seconds.
Warm sets: a warmfleet daemon's `/v1/warm-sets` every `warm_sets_interval`; the blocks
of its warm prompts in pinned sets count as held there, with or without events.

Every read is bounded (`ReadLimits`: bytes per answer or per event line, and a deadline
per answer or per line) and parsed with its wire model. No payload stops a task: a bad
one (the wrong shape, too large, too slow) is logged once per kind of trouble with the
backend's name, counted (`on_trouble`), kept in `Backend.problems` for the status, and
the task goes on: a bad `/readyz` marks the backend down with the reason, a bad event
line or snapshot means a new snapshot after a backoff (up to `max_retry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
from pydantic import BaseModel

from warmfleet_common import bounded
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
from warmfleet_router.layout_reads import LAYOUT_PATH, LayoutReads
from warmfleet_router.sync_reads import (
    NoEvents,
    Unavailable,
    holders,
    indexed_tier,
    jitter,
    raise_for_events_status,
    status_field,
    within,
    woken,
)
from warmfleet_router.sync_reads import ReadLimits as ReadLimits
from warmfleet_router.sync_reads import SyncOptions as SyncOptions

log = logging.getLogger(__name__)

START_GRACE_S = 60.0  # a daemon loading its model answers 503 or not at all meanwhile
M = TypeVar("M", bound=BaseModel)


class ResyncNeeded(Exception):
    """The index has missed events: fetch a snapshot."""


# Registers a layout and returns when a keyer for it is ready (built off the loop).
LayoutSink = Callable[[CacheLayout], Awaitable[None]]
OnIndexEvent = Callable[[Backend, str], None]  # (backend, "resync" | "event")
OnTrouble = Callable[[Backend, str, str], None]  # (backend, what was read, error type)


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
        on_trouble: OnTrouble | None = None,
        on_draining: Callable[[Backend], None] | None = None,
        layout_reads: LayoutReads | None = None,
    ) -> None:
        self.backend = backend
        self._client = client
        self._index = index
        self._layouts = layouts
        self._layout_reads = layout_reads  # None: every layout read whole
        self._options = options
        self._limits = options.limits
        self._on_index = on_index
        self._on_trouble = on_trouble
        self._on_draining = on_draining  # it just started draining (handoff)
        self._tasks: list[asyncio.Task[None]] = []
        self._checked = asyncio.Event()
        # The events loop's first attempt ended: the index follows it (its tokenizer loaded,
        # so requests are keyed by blocks), or estimates from history, or failed for now.
        self._indexed = asyncio.Event()
        self._models_read = -math.inf  # loop time of the last read of its model names
        self._last_status: DaemonStatus | None = None  # its last readable /v1/status
        self._logged: dict[str, str] = {}  # what -> the error type logged for it
        # Until it was first ready (and for START_GRACE_S at most), failed reads are what a
        # daemon that is starting answers: said once at INFO, warned only if they last.
        self._created = time.monotonic()
        self._was_ready = False
        self._logged_starting: dict[str, str] = {}
        # What its event stream says (see SyncOptions.quiet_interval).
        self._heard_at = -math.inf  # monotonic time of the stream's last line
        self._beats_state = False  # its heartbeats say serving / draining
        self._warm_digest: str | None = None  # its heartbeats' digest of its warm sets
        self._wake_health = asyncio.Event()  # the stream ended, or the daemon restarted
        self._warm_changed = asyncio.Event()

    def start(self) -> None:
        name = self.backend.name
        loops = {
            "health": self._health_loop,
            "events": self._events_loop,
            "warm-sets": self._warm_sets_loop,
        }
        self._tasks = [
            asyncio.create_task(self._supervised(what, loop), name=f"{what}-{name}")
            for what, loop in loops.items()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._index.forget(self.backend.name)

    async def first_check(self, seconds: float) -> None:
        """Its first health check, then, if it is ready, its index: the router's first
        requests are then keyed by its blocks rather than routed by history."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._checked.wait(), seconds)
            if self.backend.health == "ready":
                await asyncio.wait_for(self._indexed.wait(), max(0.0, deadline - loop.time()))

    async def _supervised(self, what: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a loop for ever: whatever escapes it (a bug; the loops handle what they
        read) is logged, counted and the loop started again after a backoff."""
        delay = self._options.retry
        while True:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._trouble(what, exc, log_exception=True)
                await asyncio.sleep(jitter(delay))
                delay = min(delay * 2, self._options.max_retry)

    # -- trouble ------------------------------------------------------------------

    def _trouble(self, what: str, exc: BaseException, *, log_exception: bool = False) -> None:
        """A read of `what` failed: count it, keep the reason, log it once per kind."""
        kind = type(exc).__name__
        text = f"{kind}: {exc}"
        text = text if len(text) <= 500 else text[:497] + "..."
        self.backend.problems[what] = text
        if self._starting():
            if self._logged_starting.get(what) != kind:
                self._logged_starting[what] = kind
                log.info("backend %s: %s: %s (not ready yet)", self.backend.name, what, text)
        elif self._logged.get(what) != kind:
            self._logged[what] = kind
            log.warning(
                "backend %s: %s: %s (logged once; counted in "
                "warmfleet_router_backend_read_errors_total)",
                self.backend.name,
                what,
                text,
                exc_info=exc if log_exception else None,
            )
        if self._on_trouble:
            self._on_trouble(self.backend, what, kind)

    def _starting(self) -> bool:
        return not self._was_ready and time.monotonic() - self._created < START_GRACE_S

    def _fine(self, what: str) -> None:
        if self.backend.problems.pop(what, None) is not None:
            log.info("backend %s: %s: fine again", self.backend.name, what)
        self._logged.pop(what, None)

    async def _read(
        self,
        path: str,
        model: type[M],
        *,
        limit: int,
        deadline: float,
        admin: bool = False,
    ) -> M | None:
        """The parsed body of a 200 (None for another status); TooLarge, TooSlow,
        ValidationError or an httpx error when it cannot be read."""
        answer = await bounded.get(
            self._client,
            f"{self.backend.url}{path}",
            limit=limit,
            deadline=deadline,
            headers=self.backend.admin_headers() if admin else None,
        )
        if answer.status != 200:
            return None
        return model.model_validate_json(answer.content)

    # -- health -------------------------------------------------------------------

    async def check_health(self) -> None:
        try:
            await self._probe()
        finally:
            self._checked.set()

    async def _probe(self) -> None:
        backend = self.backend
        try:
            answer = await bounded.get(
                self._client,
                f"{backend.url}/readyz",
                limit=self._limits.small,
                deadline=min(self._limits.deadline, 5.0),
            )
        except (httpx.HTTPError, bounded.TooLarge, bounded.TooSlow) as exc:
            backend.set_health("down", f"{type(exc).__name__}: {exc}")
            return
        if answer.status == 200:
            now = asyncio.get_running_loop().time()
            every = self._options.quiet_interval if self.quiet() else self._options.models_interval
            stale = now - self._models_read >= every
            if backend.health != "ready" or stale:  # it may have restarted with another model
                await self.read_models()
                self._models_read = now
            backend.set_health("ready")
            self._was_ready = True
            return
        status = status_field(answer.content)
        detail = status or answer.content[:200].decode(errors="replace")
        was = backend.health
        backend.set_health("draining" if status == "draining" else "unready", detail)
        if backend.health == "draining" and was != "draining" and self._on_draining:
            self._on_draining(backend)

    async def read_models(self) -> None:
        """The names the backend answers to and its context length; kept as they were
        when it cannot say."""
        backend = self.backend
        limits = self._limits
        try:
            listed = await self._read(  # the admin token: a daemon with client keys wants one
                "/v1/models", ModelList, limit=limits.small, deadline=limits.deadline, admin=True
            )
        except (httpx.HTTPError, ValueError, bounded.TooSlow) as exc:
            self._trouble("models", exc)
            return
        if listed is None:
            return  # not 200: it cannot say (any OpenAI server may lack the route)
        self._fine("models")
        names = {m.id for m in listed.data}
        lengths = [m.max_model_len for m in listed.data if m.max_model_len]
        try:  # a warmfleet daemon also answers to its aliases (`default`, its --model)
            status = await self._read(
                "/v1/status",
                DaemonStatus,
                limit=limits.small,
                deadline=limits.deadline,
                admin=True,  # a daemon with client keys shows its status to keys or the token
            )
        except (httpx.HTTPError, ValueError, bounded.TooSlow) as exc:
            self._trouble("status", exc)
            # It cannot say now: what it said last (else a read that timed out would drop
            # its aliases, `default` among them, until the next good one), while it still
            # lists that model (a daemon restarted with another one has other aliases).
            kept = self._last_status
            model = kept.model if kept is not None else None
            status = kept if model is None or model.id is None or model.id in names else None
        else:
            self._fine("status")
            self._last_status = status  # None: it answered that it has no status
        if status is not None and status.model is not None:
            names.update(status.model.aliases)
            if status.model.context_length:
                lengths.append(status.model.context_length)
        if status is not None:  # measured at its start: a restart measures again
            backend.costs = status.tier_costs
        backend.models = frozenset(names) or None
        backend.context_length = max(lengths) if lengths else None

    def quiet(self) -> bool:
        """Whether its live event stream says what polling would (and so polls are rare)."""
        return (
            self._beats_state
            and self.backend.index_mode == "following"
            and time.monotonic() - self._heard_at < 3 * self._options.heartbeat
        )

    async def _health_loop(self) -> None:
        while True:
            self._wake_health.clear()
            await self.check_health()
            quiet = self.backend.health == "ready" and self.quiet()
            every = self._options.quiet_interval if quiet else self._options.health_interval
            await woken(self._wake_health, every)

    # -- warm sets ----------------------------------------------------------------

    async def _warm_sets_loop(self) -> None:
        while True:
            self._warm_changed.clear()
            if self.backend.usable:
                try:
                    await self.read_warm_sets()
                except (httpx.HTTPError, ValueError, bounded.TooSlow) as exc:
                    self._trouble("warm-sets", exc)
                else:
                    self._fine("warm-sets")
            every = self._options.warm_sets_interval
            quiet = self.quiet() and self._warm_digest is not None
            await woken(self._warm_changed, self._options.quiet_interval if quiet else every)

    async def read_warm_sets(self) -> None:
        """Its warm sets, and the blocks of their warm prompts where the set is pinned."""
        backend = self.backend
        limits = self._limits
        listed = await self._read(
            "/v1/warm-sets", WarmSetList, limit=limits.warm_sets, deadline=limits.deadline,
            admin=True,
        )  # fmt: skip
        if listed is None:
            return
        sets = listed.sets
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
        # As the daemon's engine shares them: every prompt of a pinned fleet-wide set.
        shared = [p for s in sets if s.pin and s.tenants is None for p in s.prompts]
        self._index.set_shared(backend.name, (bytes.fromhex(k) for p in shared for k in p.blocks))
        backend.shared_tokens = max((p.tokens for p in shared), default=0)
        backend.warm_tokens = {p.name: p.tokens for s in sets for p in s.prompts if p.tokens}

    # -- cache events ---------------------------------------------------------------

    async def _events_loop(self) -> None:
        backend = self.backend
        need_snapshot = True
        delay = self._options.retry
        while True:
            what = "snapshot" if need_snapshot else "events"
            try:
                if need_snapshot:
                    await self._resync()
                    self._indexed.set()
                    need_snapshot = False
                    delay = self._options.retry
                    what = "events"
                delivered = await self._follow()
                self._stream_lost()
                need_snapshot = True
                if delivered:
                    delay = self._options.retry  # it delivered: not a failing loop
            except ResyncNeeded as exc:
                log.info("%s: cache index resync (%s)", backend.name, exc)
                need_snapshot = True
                continue
            except NoEvents as exc:
                if backend.index_mode != "history":
                    log.warning(
                        "%s: no cache events (%s); estimating from history", backend.name, exc
                    )
                    self._index.forget(backend.name, keep_pinned=True)
                backend.index_mode = "history"
                backend.last_error = f"events: {exc}"
                # Its warm sets' blocks are keyed by its layout, when it serves one.
                with contextlib.suppress(
                    httpx.HTTPError, NoEvents, Unavailable, ValueError, bounded.TooSlow
                ):
                    await self._read_layout()
                self._indexed.set()
                await asyncio.sleep(self._options.no_events_retry)
                need_snapshot = True
                continue
            except (httpx.TransportError, bounded.TooSlow, Unavailable) as exc:
                # Connection lost, silent or trickling, or the daemon not ready: a new
                # snapshot once it answers (it may be another process by then).
                backend.last_error = f"{what}: {type(exc).__name__}: {exc}"
                self._trouble(what, exc)
                self._stream_lost()
                need_snapshot = True
            except (httpx.HTTPError, ValueError) as exc:
                # A payload of the wrong shape or too large: what the stream said can no
                # longer be trusted; a new snapshot, after a backoff.
                backend.last_error = f"{what}: {type(exc).__name__}: {exc}"
                self._trouble(what, exc)
                backend.index_mode = "resyncing"
                need_snapshot = True
            self._indexed.set()
            await asyncio.sleep(jitter(delay))
            delay = min(delay * 2, self._options.max_retry)

    def _stream_lost(self) -> None:
        """Its event stream ended or could not be opened: what it holds is no longer
        known. A restarted daemon answers /readyz, cold, before its stream is back (the
        health check wakes first), and the blocks of the process that stopped would route
        requests there as hits."""
        backend = self.backend
        if backend.index_mode == "following":
            self._index.forget_held(backend.name)
            backend.index_mode = "resyncing"

    async def _resync(self) -> None:
        backend = self.backend
        backend.index_mode = "resyncing"
        snap = await self._get("/v1/cache/snapshot", CacheSnapshot, self._limits.snapshot)
        if snap.fingerprint != backend.fingerprint:
            await self._read_layout(snap.fingerprint)
        self._index.load_snapshot(
            backend.name, ((bytes.fromhex(b.key), b.logits, holders(b)) for b in snap.blocks)
        )
        if snap.epoch != backend.epoch:  # another daemon process: read its models again
            self._models_read = -math.inf
            self._wake_health.set()
            self._warm_changed.set()  # and its warm sets: which are warm again
        backend.epoch, backend.seq = snap.epoch, snap.seq
        backend.index_mode = "following"
        backend.last_error = ""
        backend.resyncs += 1
        self._fine("snapshot")
        if self._on_index:
            self._on_index(backend, "resync")

    async def _read_layout(self, expected: str | None = None) -> None:
        """Its layout; when its snapshot said the `expected` fingerprint and the router
        holds that layout already, only what is its own (the costs), without the files."""
        reads, limit = self._layout_reads, self._limits.layout
        if expected is None or reads is None:
            layout = await self._get(LAYOUT_PATH, CacheLayout, limit)
            await self._layouts(layout)
        else:
            async with reads.lock(expected):
                light = None
                if reads.known(expected):
                    path = f"{LAYOUT_PATH}?tokenizer_files=false"
                    light = await self._get(path, CacheLayout, limit)
                if light is not None and light.fingerprint == expected:
                    layout = light
                else:  # new to the router, or changed since its snapshot
                    layout = await self._get(LAYOUT_PATH, CacheLayout, limit)
                    await self._layouts(layout)
        backend = self.backend
        backend.fingerprint, backend.model = layout.fingerprint, layout.model
        backend.costs = layout.costs

    async def _follow(self) -> bool:
        """Apply the event stream until it ends; whether any line was applied."""
        backend = self.backend
        params: dict[str, str | int | float] = {
            "after": backend.seq,
            "epoch": backend.epoch or "",
            "heartbeat": self._options.heartbeat,
        }
        silence = 3 * self._options.heartbeat  # no whole line for this long: dead
        timeout = httpx.Timeout(10.0, read=silence)
        try:
            return await self._stream(params, silence, limits=timeout)
        finally:  # whatever ended it: until it is back, the health check polls as usual,
            # from a moment on (a restart or a blip ends a stream too; the reconnect, or a
            # request's failure, often tells first)
            self._beats_state = False
            asyncio.get_running_loop().call_later(self._options.retry, self._wake_health.set)

    async def _stream(
        self, params: dict[str, str | int | float], silence: float, *, limits: httpx.Timeout
    ) -> bool:
        backend = self.backend
        applied = False
        async with self._client.stream(
            "GET",
            f"{backend.url}/v1/cache/events",
            params=params,
            headers=backend.admin_headers(),
            timeout=limits,
        ) as r:
            if r.status_code != 200:
                await bounded.read_body(r, self._limits.small)
                raise_for_events_status(r.request.url.path, r.status_code)
            what = f"{backend.name} /v1/cache/events"
            lines = bounded.lines(r.aiter_bytes(), self._limits.event_line, what=what)
            while True:
                line = await within(lines, silence)
                if line is None:
                    return applied
                self._heard_at = time.monotonic()
                if line.strip():
                    event = parse_event_line(line)
                    self.apply(event)
                    if not applied and not isinstance(event, EventsHello):
                        applied = True  # past the greeting: the stream delivers
                        self._fine("events")

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
            self._heard(event)
            return
        if event.seq != backend.seq + 1:
            raise ResyncNeeded(f"event {event.seq} after {backend.seq}")
        if isinstance(event, BlockStored):
            key, tier = bytes.fromhex(event.key), indexed_tier(event.tier)
            index.stored(backend.name, key, event.logits, tier)
        elif isinstance(event, BlockEvicted):  # a block may leave RAM and stay on disk
            index.evicted(backend.name, bytes.fromhex(event.key), indexed_tier(event.tier))
        else:
            index.cleared(backend.name)
        backend.seq = event.seq
        if self._on_index:
            self._on_index(backend, "event")

    def _heard(self, beat: EventsHeartbeat) -> None:
        """What a heartbeat says besides its number: the daemon's state, its warm sets."""
        backend = self.backend
        if beat.state is not None:
            self._beats_state = True
            if beat.state == "draining" and backend.health != "draining":
                backend.set_health("draining", "draining (its cache events say so)")
                if self._on_draining:
                    self._on_draining(backend)
        if beat.warm_sets is not None and beat.warm_sets != self._warm_digest:
            self._warm_digest = beat.warm_sets
            self._warm_changed.set()

    async def _get(self, path: str, model: type[M], limit: int) -> M:
        """An admin route's answer, parsed with its wire model."""
        answer = await bounded.get(
            self._client,
            f"{self.backend.url}{path}",
            limit=limit,
            deadline=self._limits.large_deadline,
            headers=self.backend.admin_headers(),
        )
        if answer.status != 200:
            raise_for_events_status(path, answer.status)
        return model.model_validate_json(answer.content)
