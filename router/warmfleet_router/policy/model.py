"""What the policy pieces see and say: candidates, the request's routing facts, the
decision, and the domain errors for a request no backend can take (the HTTP layer maps
them to status codes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from warmfleet_common.tiers import NO_TOKENS, TierCosts, TierTokens

Reason = Literal[
    "prefix", "session", "load-spill", "failover", "fallback", "round-robin", "least-load"
]


@dataclass(frozen=True)
class Candidate:
    """A backend as the pieces see it."""

    name: str
    in_flight: int
    # Prompt tokens predicted in its cache, by the fastest tier holding each block.
    cached: TierTokens = NO_TOKENS
    ready: bool = True  # takes new requests (health checks, passive failures)
    models: frozenset[str] | None = None  # names it answers to; None: it has not said
    costs: TierCosts | None = None  # what a token costs it per tier; None: not said
    # Tenants other than the request's using it (`tenant_share`); read only when the
    # request's tenant is over its share.
    other_tenants: int = 0

    @property
    def cached_tokens(self) -> int:
        """Predicted in every tier."""
        return self.cached.total

    def serves(self, model: str) -> bool | None:
        return None if self.models is None else model in self.models


@dataclass(frozen=True)
class RoutingRequest:
    """What the pieces know of one request."""

    model: str | None = None
    tie_key: bytes = b""  # spreads equal candidates (rendezvous hash)
    affinity: str | None = None  # its session key, if it has one
    session_backend: str | None = None  # where that session was last served
    turn: int = 0  # requests routed so far (round-robin)
    # Every backend known, whatever its state: lets a filter say why nothing is left.
    fleet: Sequence[Candidate] = ()
    # When the candidates are a sample of the admitted backends (`shortlist`): requests in
    # flight on the fleet and its backends, the mean bounded load is taken over.
    fleet_load: tuple[int, int] | None = None
    # Its tenant holds at least its share of the fleet (`tenant_share`): it goes where
    # the fewest other tenants are.
    over_share: bool = False


@dataclass(frozen=True)
class Decision:
    backend: str
    reason: Reason
    predicted: int  # cached tokens predicted on `backend`
    fallbacks: tuple[str, ...]  # where to retry, best first


class RoutingError(Exception):
    """No backend can take this request."""


class NoBackendReady(RoutingError):
    def __init__(self, model: str | None = None) -> None:
        self.model = model
        super().__init__(
            "no backend is ready" if model is None else f"no backend serving `{model}` is ready"
        )


class ModelNotFound(RoutingError):
    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"The model `{model}` does not exist.")
