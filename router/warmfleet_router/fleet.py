"""The router's state: backends and their sync tasks, the block index, the keyers of the
daemons' layouts, sessions, and recent decisions. `plan()` is where a request meets the
policy; the proxy reports back with `finished()`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.discovery import Source
from warmfleet_router.index import BlockIndex, Flight
from warmfleet_router.keys import (
    EMPTY,
    MESSAGE_KEYS,
    Keyer,
    LayoutKeyer,
    MessageKeyer,
    RequestBlocks,
)
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.policy import (
    DEFAULT_EPSILON,
    Candidate,
    Decision,
    PolicyName,
    Reason,
    RoutingRequest,
    admit,
    build,
)
from warmfleet_router.routes import ProxiedRoute, Usage, request_blocks
from warmfleet_router.sessions import DEFAULT_SOURCES, SessionKeys, SessionTable
from warmfleet_router.sync import BackendSync, SyncOptions

log = logging.getLogger(__name__)

RECENT_DECISIONS = 100


@dataclass(frozen=True)
class RouterOptions:
    policy: PolicyName = "prefix"
    epsilon: float = DEFAULT_EPSILON
    sync: SyncOptions = field(default_factory=SyncOptions)
    session_keys: tuple[str, ...] = DEFAULT_SOURCES  # where a request's session key is


@dataclass
class Plan:
    decision: Decision
    blocks: dict[str, RequestBlocks]  # per backend name
    affinity: str | None
    started: float  # the request's arrival, before it was tokenized
    predicted: dict[str, int] = field(default_factory=dict)  # at decision time, per backend
    # What each prediction rests on: "events" (the daemon's cache events), "contended"
    # (events, but a request in flight there shares blocks not stored yet), "history"
    # (the router's own routing, and warm sets), "resyncing" (nothing yet).
    sources: dict[str, str] = field(default_factory=dict)
    flights: dict[str, Flight] = field(default_factory=dict)  # per backend tried


class Fleet:
    def __init__(
        self, options: RouterOptions, client: httpx.AsyncClient, metrics: RouterMetrics
    ) -> None:
        self.options = options
        self.client = client
        self.metrics = metrics
        self.index = BlockIndex()
        self.backends: dict[str, Backend] = {}
        self._syncs: dict[str, BackendSync] = {}
        self._keyers: dict[str, Keyer] = {MESSAGE_KEYS: MessageKeyer()}
        self._keyer_locks: dict[str, asyncio.Lock] = {}
        self.policy = build(options.policy, options.epsilon)
        self.session_keys = SessionKeys(options.session_keys)
        self._sessions = SessionTable()
        self.decisions: deque[dict[str, Any]] = deque(maxlen=RECENT_DECISIONS)
        self._turn = 0
        self.discovered = asyncio.Event()  # the source's first backend list is applied
        metrics.observe(lambda: list(self.backends.values()), self.index.size)

    # -- membership ---------------------------------------------------------------

    async def apply(self, specs: list[BackendSpec]) -> None:
        """Make the backend set exactly `specs` (new ones start syncing, gone ones stop)."""
        wanted = {s.name: s for s in specs}
        for name in list(self.backends):
            if name not in wanted or wanted[name] != self.backends[name].spec:
                await self._remove(name)
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
                )
                self.backends[name], self._syncs[name] = backend, sync
                self.metrics.backend_added(backend)
                sync.start()
                log.info("backend %s at %s", name, spec.url)

    async def _remove(self, name: str) -> None:
        log.info("backend %s removed", name)
        sync = self._syncs.pop(name)
        self.backends.pop(name)
        await sync.stop()

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

    async def first_checks(self, timeout: float = 5.0) -> None:
        await asyncio.gather(*(s.first_check(timeout) for s in self._syncs.values()))

    async def close(self) -> None:
        for name in list(self.backends):
            await self._remove(name)

    def passive_failure(self, backend: Backend, detail: str) -> None:
        """A request to it failed (connect error, 5xx): no new requests until a probe
        says it is ready again."""
        backend.failures += 1
        backend.last_error = detail
        backend.set_health("down", detail)

    # -- layouts ------------------------------------------------------------------

    async def add_layout(self, layout: CacheLayout) -> None:
        if layout.fingerprint in self._keyers:
            return
        lock = self._keyer_locks.setdefault(layout.fingerprint, asyncio.Lock())
        async with lock:
            if layout.fingerprint in self._keyers:
                return
            try:
                keyer: Keyer = await asyncio.to_thread(LayoutKeyer, layout)
            except (ValueError, OSError) as exc:
                log.warning("layout of %s not usable (%s): message keys instead", layout.model, exc)
                keyer = self._keyers[MESSAGE_KEYS]
            self._keyers[layout.fingerprint] = keyer

    def _keyer_of(self, backend: Backend) -> Keyer:
        if backend.fingerprint in self._keyers:  # its own layout (also without events)
            return self._keyers[backend.fingerprint]
        # History estimates use the keys of any known layout (same model, same tokens),
        # else message keys.
        layouts = [k for f, k in self._keyers.items() if f != MESSAGE_KEYS]
        return layouts[0] if len(layouts) == 1 else self._keyers[MESSAGE_KEYS]

    # -- routing ------------------------------------------------------------------

    def usable(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.usable]

    async def plan(
        self, route: ProxiedRoute, body: Mapping[str, Any] | None, headers: Mapping[str, str]
    ) -> Plan:
        """The decision for one request; a RoutingError when no ready backend serves it."""
        arrived = time.monotonic()
        model = body.get("model") if body is not None else None
        affinity = self.session_keys.of(headers, body)
        fleet = [_candidate(b) for b in self.backends.values()]
        request = RoutingRequest(
            model=model if isinstance(model, str) else None,
            affinity=affinity,
            session_backend=self._sessions.get(affinity) if affinity else None,
            fleet=fleet,
        )
        admitted = {c.name for c in admit(fleet, request)}
        backends = [b for b in self.backends.values() if b.name in admitted]
        blocks: dict[str, RequestBlocks] = {}
        by_keyer: dict[int, RequestBlocks] = {}
        for backend in backends:
            keyer = self._keyer_of(backend)
            if body is None or not self.policy.needs_cache:
                blocks[backend.name] = EMPTY
                continue
            if id(keyer) not in by_keyer:
                by_keyer[id(keyer)] = await asyncio.to_thread(request_blocks, keyer, route, body)
            blocks[backend.name] = by_keyer[id(keyer)]
        candidates = [
            Candidate(b.name, b.in_flight, self.index.predict(b.name, blocks[b.name]))
            for b in backends
        ]
        tie = next((r.last_key for r in blocks.values() if r.last_key), None)
        self._turn += 1
        request = RoutingRequest(
            model=request.model,
            tie_key=(affinity.encode() if affinity else tie) or str(self._turn).encode(),
            affinity=affinity,
            session_backend=request.session_backend,
            turn=self._turn,
        )
        decision = self.policy.decide(candidates, request)
        predicted = {c.name: c.cached_tokens for c in candidates}
        sources = {b.name: _source(b) for b in backends}
        return Plan(decision, blocks, affinity, arrived, predicted, sources)

    def started(self, plan: Plan, backend: Backend, reason: Reason) -> None:
        backend.in_flight += 1
        backend.requests += 1
        plan.flights[backend.name] = self.index.take_off(
            backend.name, plan.blocks.get(backend.name, EMPTY)
        )

    def prefilled(self, plan: Plan, backend: Backend) -> None:
        """Its first output arrived: the daemon has computed (and stored) its prompt."""
        flight = plan.flights.get(backend.name)
        if flight is not None:
            self.index.land(flight)

    def finished(
        self,
        plan: Plan,
        backend: Backend,
        reason: Reason,
        *,
        outcome: str,
        usage: Usage | None,
        first_byte: float | None,
    ) -> None:
        """A request left `backend` (any outcome): counters, index history, sessions."""
        backend.in_flight = max(0, backend.in_flight - 1)
        flight = plan.flights.get(backend.name)
        if flight is not None:
            self.index.land(flight)
        predicted = self.index_prediction(plan, backend, reason)
        prompt_tokens = usage.prompt_tokens if usage else None
        cached = usage.cached_tokens if usage else None
        if outcome == "ok":
            self.index.routed(backend.name, plan.blocks.get(backend.name, EMPTY))
            if plan.affinity:
                self._sessions.served(plan.affinity, backend.name)
        source = plan.sources.get(backend.name, _source(backend))
        if source == "events" and flight is not None and flight.contended:
            source = "contended"
        self.metrics.request_finished(
            backend, reason, outcome, predicted, source, prompt_tokens, cached, first_byte
        )
        self.decisions.append(
            {
                "time": time.time(),
                "arrived": time.time() - (time.monotonic() - plan.started),
                "backend": backend.name,
                "reason": reason,
                "outcome": outcome,
                "session": plan.affinity,
                "predicted_cached_tokens": predicted,
                "prediction_source": source if predicted is not None else None,
                "cached_tokens": cached,
                "prompt_tokens": prompt_tokens,
            }
        )

    def index_prediction(self, plan: Plan, backend: Backend, reason: Reason) -> int | None:
        """None when the router made none (the body could not be keyed, or the policy
        does not look at the cache)."""
        if not plan.blocks.get(backend.name, EMPTY).keys:
            return None
        # Decision time: by the end, the index holds what this request itself stored.
        return plan.predicted.get(backend.name)

    # -- status -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "policy": self.options.policy,
            "epsilon": self.options.epsilon,
            "backends": [
                {
                    "name": b.name,
                    "url": b.url,
                    "labels": b.spec.labels,
                    "health": b.health,
                    "health_detail": b.health_detail,
                    "in_flight": b.in_flight,
                    "requests": b.requests,
                    "failures": b.failures,
                    "index": {
                        "mode": b.index_mode,
                        "blocks": self.index.size(b.name),
                        "epoch": b.epoch,
                        "seq": b.seq,
                        "resyncs": b.resyncs,
                        "layout": b.fingerprint,
                    },
                    "models": sorted(b.models) if b.models is not None else None,
                    "warm_sets": b.warm_sets,
                    "last_error": b.last_error,
                }
                for b in sorted(self.backends.values(), key=lambda b: b.name)
            ],
            "sessions": len(self._sessions),
            "decisions": list(self.decisions)[::-1],
        }


def _candidate(backend: Backend) -> Candidate:
    return Candidate(backend.name, backend.in_flight, ready=backend.usable, models=backend.models)


def _source(backend: Backend) -> str:
    """What the index's prediction for this backend rests on right now."""
    return {"following": "events", "history": "history"}.get(backend.index_mode, "resyncing")
