"""The fleet's members: the backends, each with the tasks that follow it (`BackendSync`:
health, models, cache events, warm sets), kept equal to what discovery says (`apply`,
`follow`); the layouts their block keys are in; passive failures.

A backend that leaves the fleet may stay a while, draining, so that its hottest sessions
are handed off first: membership asks its `Departures` (the drain handoff,
`warmfleet_router.drain`), which removes the backend once done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import httpx

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.heap import freeze_heap
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.discovery import Source
from warmfleet_router.index import BlockIndex
from warmfleet_router.keys import MESSAGE_KEYS
from warmfleet_router.layout_reads import LayoutReads
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.options import RouterOptions
from warmfleet_router.sync import BackendSync
from warmfleet_router.workers import KeyingPool

log = logging.getLogger(__name__)


class Departures(Protocol):
    """What membership asks before a backend goes (warmfleet_router.drain answers)."""

    def wants(self, backend: Backend) -> bool:
        """Whether `backend`, leaving the fleet, should stay until its sessions are
        handed off."""
        ...

    def start(self, backend: Backend) -> None:
        """Hand its sessions off (unless that runs already), then remove it if it is
        leaving."""
        ...

    def draining(self, backend: Backend) -> None:
        """Its /readyz says draining (a SIGTERM)."""
        ...

    def cancel(self, name: str) -> None:
        """Its handoff is no longer wanted (it is back, or removed)."""
        ...


class LeaveAtOnce:
    """No handoff: a backend that leaves the fleet is removed at once."""

    def wants(self, backend: Backend) -> bool:
        return False

    def start(self, backend: Backend) -> None:
        pass

    def draining(self, backend: Backend) -> None:
        pass

    def cancel(self, name: str) -> None:
        pass


class Membership:
    def __init__(
        self,
        options: RouterOptions,
        client: httpx.AsyncClient,
        metrics: RouterMetrics,
        index: BlockIndex,
        pool: KeyingPool,
    ) -> None:
        self.options = options
        self.client = client
        self.metrics = metrics
        self.index = index
        self.pool = pool
        self.layout_reads = LayoutReads(lambda fingerprint: fingerprint in pool.usable)
        self.backends: dict[str, Backend] = {}
        self.syncs: dict[str, BackendSync] = {}
        # The fleet attaches the drain handoff (which itself removes backends).
        self.departures: Departures = LeaveAtOnce()
        self.discovered = asyncio.Event()  # the source's first backend list is applied

    async def apply(self, specs: list[BackendSpec]) -> None:
        """Make the backend set exactly `specs` (new ones start syncing, gone ones stop)."""
        wanted = {s.name: s for s in specs}
        for name in list(self.backends):
            backend = self.backends[name]
            if name in wanted and backend.leaving:  # back in the fleet: it stays
                self.departures.cancel(name)
                backend.leaving = False
                backend.set_health("unknown", "back in the fleet")
            if name not in wanted and not backend.leaving and self.departures.wants(backend):
                backend.leaving = True  # removed once its sessions are handed off
                backend.set_health("draining")
                self.departures.start(backend)  # (one may run already: a SIGTERM's)
            elif (name not in wanted and not backend.leaving) or (
                name in wanted and wanted[name] != backend.spec
            ):
                await self.remove(name)
        for name, spec in wanted.items():
            if name in self.backends:
                self.backends[name].spec = spec  # labels do not restart its sync
            else:
                backend = Backend(spec)
                sync = BackendSync(
                    backend,
                    self.client,
                    self.index,
                    self.add_layout,
                    self.options.sync,
                    self.metrics.index_event,
                    self.metrics.read_error,
                    self._draining,
                    self.layout_reads,
                )
                self.backends[name], self.syncs[name] = backend, sync
                self.metrics.backend_added(backend)
                sync.start()
                log.info("backend %s at %s", name, spec.url)

    async def remove(self, name: str) -> None:
        log.info("backend %s removed", name)
        self.departures.cancel(name)
        sync = self.syncs.pop(name)
        self.backends.pop(name)
        await sync.stop()

    def _draining(self, backend: Backend) -> None:
        self.departures.draining(backend)

    async def follow(self, source: Source) -> None:
        """Apply the source's backend lists as they change (until cancelled); `discovered`
        is set once the first one is applied."""
        try:
            async for specs in source.changes():
                await self.apply(specs)
                self.discovered.set()
        except Exception:
            log.exception("backend discovery stopped; the backends stay as they are")
            raise

    async def first_checks(self, timeout: float = 30.0) -> None:
        """Until each backend's first health check, and each ready one's index (its
        snapshot read and its tokenizer loaded, or found without events), or `timeout`:
        a backend that fails ends its wait at once, so only a slow but working one waits
        this long (a busy machine took more than the 5 s this once was)."""
        await asyncio.gather(*(s.first_check(timeout) for s in self.syncs.values()))

    async def close(self) -> None:
        for name in list(self.backends):
            await self.remove(name)

    def usable(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.usable]

    def passive_failure(self, backend: Backend, detail: str) -> None:
        """A request to it failed (connect error, 5xx): no new requests until a probe
        says it is ready again."""
        backend.failures += 1
        backend.last_error = detail
        backend.set_health("down", detail)

    # -- layouts ------------------------------------------------------------------

    async def add_layout(self, layout: CacheLayout) -> None:
        """Returns once every worker can key requests for it."""
        await self.pool.add_layout(layout)
        if self.options.freeze_gc_heap:
            freeze_heap()

    def fingerprint_of(self, backend: Backend) -> str:
        """The keys its index entries are in: its own layout's (also without events), or
        for history estimates the keys of the one known layout (same model, same
        tokens), else message keys."""
        usable = self.pool.usable
        if backend.fingerprint in usable:
            return backend.fingerprint if usable[backend.fingerprint] else MESSAGE_KEYS
        if len(usable) == 1:
            only, ok = next(iter(usable.items()))
            return only if ok else MESSAGE_KEYS
        return MESSAGE_KEYS
