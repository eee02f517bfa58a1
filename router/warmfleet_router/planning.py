"""Request planning: where a request meets the policy. `Planner.plan` prepares the
request (parsed, checked and keyed in a key worker), predicts each backend's cached
tokens by tier from the index, and asks the policy; the proxy then reports each attempt
back (`started`, `prefilled`, `finished`), which keeps the in-flight counts, the index's
requests in prefill and its history, the session table, the hot sessions a drain hands
off, the metrics and the recent decisions the status shows."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warmfleet_common.tiers import NO_TOKENS, TierTokens
from warmfleet_router.backend import Backend
from warmfleet_router.handoff import HotSessions
from warmfleet_router.index import BlockIndex, Flight
from warmfleet_router.keys import EMPTY, RequestBlocks
from warmfleet_router.learning import Head
from warmfleet_router.membership import Membership
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.options import RouterOptions
from warmfleet_router.policy import Candidate, Decision, Reason, RoutingRequest, build
from warmfleet_router.prepare import Invalid, Job, RequestInvalid
from warmfleet_router.routes import ProxiedRoute, Usage
from warmfleet_router.sessions import SessionDigest, SessionKeys, SessionTable
from warmfleet_router.shortlist import FleetView, fleet_view, shortlist
from warmfleet_router.tenant_share import TenantShare

RECENT_DECISIONS = 100


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
    usage: Usage | None = None  # the answering backend's, once the response has ended
    head: Head | None = None  # its static head, when the router learns (`learning`)
    tenant: str | None = None  # its client key's (`tenant_share` counts it)


class Planner:
    def __init__(
        self,
        options: RouterOptions,
        members: Membership,
        metrics: RouterMetrics,
        hot: HotSessions,
        session_digest: SessionDigest,
    ) -> None:
        self.members = members
        self.index: BlockIndex = members.index
        self.metrics = metrics
        self.hot = hot
        self.policy = build(options.policy, options.epsilon)
        self.session_keys = SessionKeys(options.session_keys)
        self.sessions = SessionTable(budget_bytes=options.sessions_budget_bytes)
        self.tenant_share = TenantShare(options.tenant_share_window_s)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=RECENT_DECISIONS)
        self._session_digest = session_digest
        self._turn = 0
        self._learn = options.learn.on
        self._fleet_view: FleetView | None = None
        self._in_flight = 0  # on every backend: the mean bounded load takes over a sample
        self._fleet_view_key: tuple[int, ...] = ()

    def next_turn(self) -> int:
        """Counts the policy's decisions (round-robin takes turns by it)."""
        self._turn += 1
        return self._turn

    async def plan(
        self,
        route: ProxiedRoute,
        raw: bytes,
        headers: Mapping[str, str],
        tenant: str | None = None,
    ) -> Plan:
        """The decision for one request: a RoutingError when no ready backend serves it,
        RequestInvalid when the daemons would refuse it (and the router cannot key it).
        A tenant's request is keyed with its salt and its session is its own."""
        arrived = time.monotonic()
        members = self.members
        view = self._view()
        keyed = self.policy.needs_cache
        job = Job(
            route.name,
            raw,
            view.layouts if keyed else (),
            self.session_keys.body_paths,
            view.max_context,
            tenant,
            view.shared_tokens,
            self._learn,
            self.session_keys.of(headers),  # the body's keys are read while it is prepared
        )
        prepared = await members.pool.prepare(job)
        if isinstance(prepared, Invalid):
            raise RequestInvalid(prepared)
        cpu_started = time.thread_time()
        self.metrics.request_cpu(route.name, "prepare", prepared.cpu_seconds)
        affinity = self.session_keys.of(headers, prepared.session_values)
        if affinity is not None and tenant is not None:
            affinity = f"{tenant}/{affinity}"  # one tenant cannot steer another's session
        view = self._view()  # the fleet may have changed while the body was keyed
        admitted = view.admitted(prepared.model)
        if prepared.invalid is not None:  # the daemons check the model first, and so do we
            raise RequestInvalid(prepared.invalid)
        session_backend = self.sessions.get(affinity) if affinity else None
        turn = self.next_turn()
        if keyed:
            # One walk of the request's blocks per keying for the whole fleet (the
            # backends a peer copy may come from included), and only a sample of each
            # group of alike backends scored (`shortlist`).
            last = next((r.last_key for r in prepared.blocks.values() if r.last_key), None)
            sample = (affinity.encode() if affinity else last) or str(turn).encode()
            short = shortlist(view, self.index, prepared.blocks, admitted, sample, session_backend)
            backends, holders = short.backends, short.holders
            blocks = {name: p.blocks for name, p in short.predictions.items()}
            hits = {name: p.hit for name, p in short.predictions.items()}
        else:
            backends, holders = admitted[0], {}
            blocks = dict.fromkeys((b.name for b in backends), EMPTY)
            hits = dict.fromkeys((b.name for b in backends), NO_TOKENS)
        over_share = self.tenant_share.over_share(tenant, len(admitted[0]))
        others = self.tenant_share.others(tenant, hits) if over_share else {}
        candidates = [scored(b, hits[b.name], others.get(b.name, 0)) for b in backends]
        tie = next((r.last_key for r in blocks.values() if r.last_key), None)
        request = RoutingRequest(
            model=prepared.model,
            tie_key=(affinity.encode() if affinity else tie) or str(turn).encode(),
            affinity=affinity,
            session_backend=session_backend,
            turn=turn,
            fleet_load=(self._in_flight, len(admitted[0]))
            if len(backends) < len(admitted[0])
            else None,
            over_share=over_share,
        )
        decision = self.policy.decide(candidates, request)
        predicted = {c.name: c.cached_tokens for c in candidates}
        sources = {b.name: source(b) for b in backends}
        self.metrics.request_cpu(route.name, "route", time.thread_time() - cpu_started)
        self.metrics.decision(route.name, time.monotonic() - arrived)
        return Plan(
            decision, blocks, affinity, arrived, predicted, hits, sources, holders=holders,
            head=prepared.head, tenant=tenant,
        )  # fmt: skip

    def _view(self) -> FleetView:
        """The fleet as admission and keying see it, rebuilt when it changed."""
        members = self.members
        changed = (
            Backend.revision, self.index.revision, len(members.backends), len(members.pool.usable)
        )  # fmt: skip
        if self._fleet_view is None or changed != self._fleet_view_key:
            backends = list(members.backends.values())
            fingerprints = {b.name: members.fingerprint_of(b) for b in backends}
            self._fleet_view = fleet_view(backends, self.index, fingerprints)
            # fleet_view may give backends their slots: the key is read after it
            self._fleet_view_key = (
                Backend.revision, self.index.revision, len(members.backends),
                len(members.pool.usable),
            )  # fmt: skip
        return self._fleet_view

    def spill_peer(self, plan: Plan, backend: Backend) -> Backend | None:
        """The backend holding more of this request's blocks than `backend` does (the
        most), in the same layout: the peer `backend` may copy them from. Only for a
        backend the router can sign for (its admin token)."""
        if not backend.spec.token or backend.fingerprint is None:
            return None
        here = plan.holders.get(backend.name, 0)
        best: Backend | None = None
        for name, tokens in plan.holders.items():
            other = self.members.backends.get(name)
            if other is None or name == backend.name or other.fingerprint != backend.fingerprint:
                continue
            if tokens > here and (best is None or tokens > plan.holders[best.name]):
                best = other
        return best

    # -- in flight: what the proxy reports of each attempt --------------------------

    def started(self, plan: Plan, backend: Backend, reason: Reason) -> None:
        backend.in_flight += 1
        self._in_flight += 1
        backend.requests += 1
        self.tenant_share.started(plan.tenant, backend.name)
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
        if backend.in_flight > 0:
            self._in_flight -= 1
        backend.in_flight = max(0, backend.in_flight - 1)
        self.tenant_share.finished(plan.tenant, backend.name)
        flight = plan.flights.get(backend.name)
        if flight is not None:
            self.index.land(flight)
        predicted = self.index_prediction(plan, backend, reason)
        prompt_tokens = usage.prompt_tokens if usage else None
        cached = usage.cached_tokens if usage else None
        if outcome == "ok":
            plan.usage = usage
            self.index.routed(backend.name, plan.blocks.get(backend.name, EMPTY))
            if plan.affinity:
                self.sessions.served(plan.affinity, backend.name)
                self.hot.served(plan.affinity, backend.name, plan.blocks.get(backend.name, EMPTY))
        rests_on = plan.sources.get(backend.name, source(backend))
        if rests_on == "events" and flight is not None and flight.contended:
            rests_on = "contended"
        self.metrics.request_finished(
            backend,
            reason,
            outcome,
            predicted,
            rests_on,
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
                "session": self._session_digest(plan.affinity),
                "predicted_cached_tokens": predicted,
                "predicted_by_tier": plan.tiers[backend.name].as_dict()
                if predicted is not None and backend.name in plan.tiers
                else None,
                "prediction_source": rests_on if predicted is not None else None,
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


def scored(backend: Backend, hit: TierTokens, other_tenants: int = 0) -> Candidate:
    """The backend as the policy sees it: its load and its predicted hit by tier."""
    return Candidate(
        backend.name, backend.in_flight, hit, costs=backend.costs, other_tenants=other_tenants
    )


def source(backend: Backend) -> str:
    """What the index's prediction for this backend rests on right now."""
    return {"following": "events", "history": "history"}.get(backend.index_mode, "resyncing")
