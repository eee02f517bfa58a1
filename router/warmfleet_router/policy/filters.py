"""Filters: each narrows the candidates a request may go to. Admission filters (ready,
serves the model) run before the request is keyed and raise a RoutingError when they
can explain an empty result; routing filters (tenant share, bounded load, session pin) never
empty a non-empty list."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from warmfleet_router.policy.model import (
    Candidate,
    ModelNotFound,
    NoBackendReady,
    RoutingRequest,
)


class Filter(Protocol):
    label: str  # what the policy table calls it

    def __call__(
        self, candidates: Sequence[Candidate], request: RoutingRequest
    ) -> list[Candidate]: ...


class Ready:
    """Backends that take new requests."""

    label = "ready"

    def __call__(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
        return [c for c in candidates if c.ready]


class ServesModel:
    """Backends that answer to the request's model; those that have not said which
    models they serve only when none has said it serves this one. Nothing left: 503
    when a backend that is not ready serves it, else 404 as a daemon answers it."""

    label = "serves the model"

    def __call__(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
        model = request.model
        if model is None:
            return list(candidates)
        serving = [c for c in candidates if c.serves(model)]
        if serving:
            return serving
        unknown = [c for c in candidates if c.serves(model) is None]
        if unknown:
            return unknown
        if any(c.serves(model) for c in request.fleet):
            raise NoBackendReady(model)
        if candidates:
            raise ModelNotFound(model)
        return []


def capacity(total_in_flight: int, backends: int, epsilon: float) -> int:
    """The most in-flight requests any backend may hold once this one is placed."""
    return math.ceil((1 + epsilon) * (total_in_flight + 1) / backends)


def eligible(
    candidates: Sequence[Candidate], epsilon: float, fleet_load: tuple[int, int] | None = None
) -> list[Candidate]:
    """Candidates that stay within the bound with one more request (never empty when
    `candidates` is not: the least loaded always fits). The mean is the candidates', or
    the fleet's when they are a sample of it (`fleet_load`: requests in flight, backends);
    then, if none of the sample fits, its least loaded."""
    if not candidates:
        return []
    if fleet_load is None:
        cap = capacity(sum(c.in_flight for c in candidates), len(candidates), epsilon)
    else:
        cap = capacity(fleet_load[0], max(1, fleet_load[1]), epsilon)
    fits = [c for c in candidates if c.in_flight + 1 <= cap]
    if fits:
        return fits
    least = min(c.in_flight for c in candidates)
    return [c for c in candidates if c.in_flight == least]


class BoundedLoad:
    """Consistent hashing with bounded loads: no backend may take a request that would
    put it above ceil((1 + epsilon) x the mean in-flight count)."""

    label = "bounded load"

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon

    def __call__(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
        return eligible(candidates, self.epsilon, request.fleet_load)


class SessionPin:
    """Only the backend the request's session was last served by, when it is still a
    candidate; the candidates unchanged otherwise."""

    label = "session pin"

    def __call__(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
        pinned = [c for c in candidates if c.name == request.session_backend]
        return pinned if request.session_backend is not None and pinned else list(candidates)

    @staticmethod
    def spilled(request: RoutingRequest, before: Sequence[Candidate]) -> bool:
        """For a request the pin did not place: its session's backend was a candidate
        before the routing filters (so a filter took it out: overloaded)."""
        return request.session_backend is not None and any(
            c.name == request.session_backend for c in before
        )


class TenantShare:
    """For a request whose tenant holds at least its share of the fleet: only the
    backends the fewest other tenants are using (none, when there are such), so that
    one tenant's burst stays off the backends another tenant's requests are on."""

    label = "tenant share"

    def __call__(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
        if not request.over_share or not candidates:
            return list(candidates)
        fewest = min(c.other_tenants for c in candidates)
        return [c for c in candidates if c.other_tenants == fewest]
