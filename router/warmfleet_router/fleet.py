"""The router's state: backends and their sync tasks, the block index, the keyers of the
daemons' layouts, sessions, and recent decisions. `plan()` is where a request meets the
policy; the proxy reports back with `finished()`."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.heap import freeze_heap
from warmfleet_common.tiers import TierTokens
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.discovery import Source
from warmfleet_router.handoff import HotSession, HotSessions, hand_off
from warmfleet_router.index import DEFAULT_BUDGET_BYTES as DEFAULT_INDEX_BUDGET
from warmfleet_router.index import BlockIndex, Flight
from warmfleet_router.keys import (
    EMPTY,
    MESSAGE_KEYS,
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
from warmfleet_router.prepare import Invalid, Job, RequestInvalid
from warmfleet_router.routes import ProxiedRoute, Usage
from warmfleet_router.sessions import DEFAULT_BUDGET_BYTES as DEFAULT_SESSIONS_BUDGET
from warmfleet_router.sessions import DEFAULT_SOURCES, SessionKeys, SessionTable
from warmfleet_router.sync import BackendSync, SyncOptions
from warmfleet_router.workers import KeyingPool

log = logging.getLogger(__name__)

RECENT_DECISIONS = 100


@dataclass(frozen=True)
class ProxyOptions:
    request_timeout: float = 900.0  # seconds from arrival to the response's last byte
    max_response_bytes: int = 64 << 20  # a non-streamed response body
    buffer_bytes: int = 256 << 10  # held to read a body's usage; larger ones pass on
    max_error_bytes: int = 64 << 10  # the part of a 5xx body kept for the log


@dataclass(frozen=True)
class RouterOptions:
    policy: PolicyName = "prefix"
    epsilon: float = DEFAULT_EPSILON
    sync: SyncOptions = field(default_factory=SyncOptions)
    session_keys: tuple[str, ...] = DEFAULT_SOURCES  # where a request's session key is
    proxy: ProxyOptions = field(default_factory=ProxyOptions)
    index_budget_bytes: int = DEFAULT_INDEX_BUDGET
    sessions_budget_bytes: int = DEFAULT_SESSIONS_BUDGET
    key_workers: int = 0  # processes that prepare requests; 0: threads of this one
    # The daemons' admin token, also asked of callers of the status's detail.
    admin_token: str | None = field(default=None, repr=False)
    # A draining backend's hottest sessions copied to where they go next: how many, and
    # the time the whole handoff may take (then the rest prefill when they come back).
    handoff_sessions: int = 16
    handoff_seconds: float = 20.0
    # Freeze the GC heap once started and after each new tokenizer (warmfleet_common.heap):
    # the command's choice for its process, not a test's.
    freeze_gc_heap: bool = False


@dataclass
class Plan:
    decision: Decision
    blocks: dict[str, RequestBlocks]  # per backend name
    affinity: str | None
    started: float  # the request's arrival, before it was tokenized
    predicted: dict[str, int] = field(default_factory=dict)  # at decision time, per backend
    tiers: dict[str, TierTokens] = field(default_factory=dict)  # the same, by tier
    # What each prediction rests on: "events" (the daemon's cache events), "contended"
    # (events, but a request in flight there shares blocks not stored yet), "history"
    # (the router's own routing, and warm sets), "resyncing" (nothing yet).
    sources: dict[str, str] = field(default_factory=dict)
    flights: dict[str, Flight] = field(default_factory=dict)  # per backend tried
    # Cached tokens predicted on every backend a spill may copy from (ready or draining,
    # in the same key space): where the request's blocks are, whoever serves it.
    holders: dict[str, int] = field(default_factory=dict)
    peers: dict[str, str] = field(default_factory=dict)  # per backend tried: its spill peer


class Fleet:
    def __init__(
        self,
        options: RouterOptions,
        client: httpx.AsyncClient,
        metrics: RouterMetrics,
        pool: KeyingPool | None = None,
    ) -> None:
        self.options = options
        self.client = client
        self.metrics = metrics
        self.index = BlockIndex(budget_bytes=options.index_budget_bytes)
        self.backends: dict[str, Backend] = {}
        self._syncs: dict[str, BackendSync] = {}
        self.pool = pool if pool is not None else KeyingPool(options.key_workers)
        self.policy = build(options.policy, options.epsilon)
        self.session_keys = SessionKeys(options.session_keys)
        self._sessions = SessionTable(budget_bytes=options.sessions_budget_bytes)
        self.hot = HotSessions()
        self._handoffs: dict[str, asyncio.Task[None]] = {}
        self.handoffs: deque[dict[str, Any]] = deque(maxlen=RECENT_DECISIONS)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=RECENT_DECISIONS)
        self._turn = 0
        self._secret = os.urandom(16)  # keys the session hashes the status shows
        self.discovered = asyncio.Event()  # the source's first backend list is applied
        metrics.observe(lambda: list(self.backends.values()), self.index.size)

    # -- membership ---------------------------------------------------------------

    async def apply(self, specs: list[BackendSpec]) -> None:
        """Make the backend set exactly `specs` (new ones start syncing, gone ones stop)."""
        wanted = {s.name: s for s in specs}
        for name in list(self.backends):
            backend = self.backends[name]
            if name in wanted and backend.leaving:  # back in the fleet: it stays
                task = self._handoffs.pop(name, None)
                if task is not None:
                    task.cancel()
                backend.leaving = False
                backend.set_health("unknown", "back in the fleet")
            if name not in wanted and not backend.leaving and self._should_hand_off(backend):
                backend.leaving = True  # removed once its sessions are handed off
                backend.set_health("draining")
                if name not in self._handoffs:  # (one may run already: a SIGTERM's)
                    self._start_handoff(backend)
            elif (name not in wanted and not backend.leaving) or (
                name in wanted and wanted[name] != backend.spec
            ):
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
                    self.metrics.read_error,
                    self._draining,
                )
                self.backends[name], self._syncs[name] = backend, sync
                self.metrics.backend_added(backend)
                sync.start()
                log.info("backend %s at %s", name, spec.url)

    async def _remove(self, name: str) -> None:
        log.info("backend %s removed", name)
        task = self._handoffs.pop(name, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
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
        for task in list(self._handoffs.values()):
            task.cancel()
        for name in list(self.backends):
            await self._remove(name)
        await self.pool.close()

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

    def _fingerprint_of(self, backend: Backend) -> str:
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

    # -- routing ------------------------------------------------------------------

    def usable(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.usable]

    async def plan(self, route: ProxiedRoute, raw: bytes, headers: Mapping[str, str]) -> Plan:
        """The decision for one request: a RoutingError when no ready backend serves it,
        RequestInvalid when the daemons would refuse it (and the router cannot key it)."""
        arrived = time.monotonic()
        ready = self.usable()
        keyed = self.policy.needs_cache
        fingerprints = sorted({self._fingerprint_of(b) for b in ready}) if keyed else []
        contexts = [b.context_length for b in ready if b.context_length]
        job = Job(
            route.name,
            raw,
            tuple(fingerprints),
            self.session_keys.body_paths,
            max(contexts) if ready and len(contexts) == len(ready) else None,
        )
        prepared = await self.pool.prepare(job)
        if isinstance(prepared, Invalid):
            raise RequestInvalid(prepared)
        cpu_started = time.thread_time()
        self.metrics.request_cpu(route.name, "prepare", prepared.cpu_seconds)
        affinity = self.session_keys.of(headers, prepared.session_values)
        fleet = [_candidate(b) for b in self.backends.values()]
        admitted = {c.name for c in admit(fleet, RoutingRequest(prepared.model, fleet=fleet))}
        if prepared.invalid is not None:  # the daemons check the model first, and so do we
            raise RequestInvalid(prepared.invalid)
        backends = [b for b in self.backends.values() if b.name in admitted]
        blocks = {
            b.name: prepared.blocks.get(self._fingerprint_of(b), EMPTY) if keyed else EMPTY
            for b in backends
        }
        hits = {b.name: self.index.predict_tiers(b.name, blocks[b.name]) for b in backends}
        candidates = [_scored(b, hits[b.name]) for b in backends]
        tie = next((r.last_key for r in blocks.values() if r.last_key), None)
        self._turn += 1
        request = RoutingRequest(
            model=prepared.model,
            tie_key=(affinity.encode() if affinity else tie) or str(self._turn).encode(),
            affinity=affinity,
            session_backend=self._sessions.get(affinity) if affinity else None,
            turn=self._turn,
        )
        decision = self.policy.decide(candidates, request)
        predicted = {c.name: c.cached_tokens for c in candidates}
        sources = {b.name: _source(b) for b in backends}
        holders = self._holders(prepared.blocks) if keyed else {}
        self.metrics.request_cpu(route.name, "route", time.thread_time() - cpu_started)
        return Plan(decision, blocks, affinity, arrived, predicted, hits, sources, holders=holders)

    def _holders(self, keyed: Mapping[str, RequestBlocks]) -> dict[str, int]:
        """Cached tokens predicted on each backend a peer copy may come from: ready or
        draining (a draining daemon still serves its blocks), with a layout of its own."""
        out: dict[str, int] = {}
        for b in self.backends.values():
            if b.health not in ("ready", "draining") or b.fingerprint is None:
                continue
            fingerprint = self._fingerprint_of(b)
            request = keyed.get(fingerprint) if fingerprint != MESSAGE_KEYS else None
            if request is not None and request.keys:
                out[b.name] = self.index.predict(b.name, request)
        return out

    def spill_peer(self, plan: Plan, backend: Backend) -> Backend | None:
        """The backend holding more of this request's blocks than `backend` does (the
        most), in the same layout: the peer `backend` may copy them from. Only for a
        backend the router can sign for (its admin token)."""
        if not backend.spec.token or backend.fingerprint is None:
            return None
        here = plan.holders.get(backend.name, 0)
        best: Backend | None = None
        for name, tokens in plan.holders.items():
            other = self.backends.get(name)
            if other is None or name == backend.name or other.fingerprint != backend.fingerprint:
                continue
            if tokens > here and (best is None or tokens > plan.holders[best.name]):
                best = other
        return best

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
                self.hot.served(plan.affinity, backend.name, plan.blocks.get(backend.name, EMPTY))
        source = plan.sources.get(backend.name, _source(backend))
        if source == "events" and flight is not None and flight.contended:
            source = "contended"
        self.metrics.request_finished(
            backend,
            reason,
            outcome,
            predicted,
            source,
            prompt_tokens,
            cached,
            first_byte,
            plan.tiers.get(backend.name),
            usage.tiers if usage is not None else None,
        )
        self.decisions.append(
            {
                "time": time.time(),
                "peer": plan.peers.get(backend.name),
                "arrived": time.time() - (time.monotonic() - plan.started),
                "backend": backend.name,
                "reason": reason,
                "outcome": outcome,
                "session": self._session_hash(plan.affinity),
                "predicted_cached_tokens": predicted,
                "predicted_by_tier": plan.tiers[backend.name].as_dict()
                if predicted is not None and backend.name in plan.tiers
                else None,
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

    # -- drain handoff ------------------------------------------------------------

    def _should_hand_off(self, backend: Backend) -> bool:
        reachable = backend.health in ("ready", "draining")
        return (
            reachable and self.options.handoff_sessions > 0 and bool(self.hot.on(backend.name, 1))
        )

    def _draining(self, backend: Backend) -> None:
        """Its /readyz says draining (a SIGTERM): hand its hottest sessions off while it
        still serves its blocks."""
        if self.options.handoff_sessions > 0 and backend.name not in self._handoffs:
            self._start_handoff(backend)

    def _start_handoff(self, backend: Backend) -> None:
        task = asyncio.create_task(self._hand_off(backend), name=f"handoff-{backend.name}")
        self._handoffs[backend.name] = task

    async def _hand_off(self, draining: Backend) -> None:
        sessions = self.hot.on(draining.name, self.options.handoff_sessions)
        started = time.monotonic()
        try:
            outcomes = await hand_off(
                self.client,
                draining,
                sessions,
                lambda s: self._next_backend(s, draining),
                self.options.handoff_seconds,
            )
            for o in outcomes:
                self.metrics.handoff(draining, o.outcome)
                if o.outcome == "copied" and o.target is not None:
                    self.hot.moved(o.session, o.target)
                else:
                    log.info(
                        "handoff of a session from %s: %s (%s)", draining.name, o.outcome, o.detail
                    )
            copied = [o for o in outcomes if o.outcome == "copied"]
            log.info(
                "backend %s drains: %d of %d hot session(s) copied to the backends they go to "
                "next (%d tokens) in %.1fs",
                draining.name,
                len(copied),
                len(outcomes),
                sum(o.copied_tokens for o in outcomes),
                time.monotonic() - started,
            )
            self.handoffs.append(
                {
                    "time": time.time(),
                    "backend": draining.name,
                    "seconds": round(time.monotonic() - started, 3),
                    "sessions": [
                        {
                            "session": self._session_hash(o.session),
                            "to": o.target,
                            "outcome": o.outcome,
                            "detail": o.detail,
                            "copied_tokens": o.copied_tokens,
                        }
                        for o in outcomes
                    ],
                }
            )
        except Exception:  # never take the router down: the sessions just prefill
            log.exception("the handoff of %s failed", draining.name)
        finally:
            if draining.leaving and self.backends.get(draining.name) is draining:
                await self._remove(draining.name)
            elif self._handoffs.get(draining.name) is asyncio.current_task():
                del self._handoffs[draining.name]

    def _next_backend(self, session: HotSession, draining: Backend) -> Backend | None:
        """Where the policy sends the session's next request now that `draining` takes
        none: among ready backends with its layout (the blocks' keys are theirs too)."""
        ready = [
            b
            for b in self.usable()
            if b.name != draining.name and b.fingerprint == draining.fingerprint
        ]
        if not ready or draining.fingerprint is None:
            return None
        candidates = [_scored(b, self.index.predict_tiers(b.name, session.blocks)) for b in ready]
        self._turn += 1
        request = RoutingRequest(
            tie_key=session.key.encode(), affinity=session.key, turn=self._turn
        )
        return self.backends.get(self.policy.decide(candidates, request).backend)

    # -- status -------------------------------------------------------------------

    def _session_hash(self, key: str | None) -> str | None:
        """A session key as the status shows it: keyed per process, so it tells two
        decisions' sessions apart without saying (or confirming a guess of) the key."""
        if key is None:
            return None
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), key=self._secret)
        return digest.hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        """The status without the admin token: counts only."""
        backends = list(self.backends.values())
        return {
            "policy": self.options.policy,
            "backends": len(backends),
            "ready_backends": sum(b.usable for b in backends),
            "in_flight": sum(b.in_flight for b in backends),
            "index_blocks": sum(self.index.size(b.name) for b in backends),
            "sessions": len(self._sessions),
            "decisions": len(self.decisions),
        }

    def status(self) -> dict[str, Any]:
        return {
            "policy": self.options.policy,
            "epsilon": self.options.epsilon,
            "index": {
                "estimated_bytes": self.index.estimated_bytes(),
                "budget_bytes": self.index.budget_bytes,
            },
            "sessions_table": {
                "bytes": self._sessions.size_bytes,
                "budget_bytes": self._sessions.budget_bytes,
                "forgotten": self._sessions.forgotten,
            },
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
                        "dropped_for_budget": self.index.dropped_blocks(b.name),
                    },
                    "models": sorted(b.models) if b.models is not None else None,
                    "context_length": b.context_length,
                    "tier_costs": b.costs.model_dump() if b.costs is not None else None,
                    "warm_sets": b.warm_sets,
                    "last_error": b.last_error,
                    "problems": dict(b.problems),
                }
                for b in sorted(self.backends.values(), key=lambda b: b.name)
            ],
            "sessions": len(self._sessions),
            "decisions": list(self.decisions)[::-1],
            "handoffs": list(self.handoffs)[::-1],
        }


def _candidate(backend: Backend) -> Candidate:
    return Candidate(backend.name, backend.in_flight, ready=backend.usable, models=backend.models)


def _source(backend: Backend) -> str:
    """What the index's prediction for this backend rests on right now."""
    return {"following": "events", "history": "history"}.get(backend.index_mode, "resyncing")


def _scored(backend: Backend, hit: TierTokens) -> Candidate:
    """The backend as the policy sees it: its load and its predicted hit by tier."""
    return Candidate(backend.name, backend.in_flight, hit, costs=backend.costs)
