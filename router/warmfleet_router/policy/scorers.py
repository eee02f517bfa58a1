"""Scorers: each gives every candidate a number, higher is better. A policy ranks by its
scorers in order, each later one breaking the ties of those before it (a lexicographic
order, exact in integers: token counts and load do not mix into one weighted sum). The
first scorer names the decision (`reason`) when it decided something; when it had
nothing to say about the pick (nothing cached, no session key) the decision is a
`fallback`."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from typing import Protocol

from warmfleet_common.tiers import FASTEST, TIERS
from warmfleet_router.policy.model import Candidate, Reason, RoutingRequest


class Scorer(Protocol):
    label: str  # what the policy table calls it
    reason: Reason
    needs_cache: bool  # reads Candidate.cached (the request must be keyed)

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]: ...

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        """Whether the score said anything about the pick."""
        ...


def rendezvous(key: bytes, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + name.encode(), digest_size=8).digest(), "big")


class CachedTokens:
    """Prompt tokens the backend is predicted to serve from its cache."""

    label = "cached tokens"
    reason: Reason = "prefix"
    needs_cache = True

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        return [c.cached_tokens for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return pick.cached_tokens > 0


class TimeSaved:
    """The prefill time the backend's cache would save the request, in tokens of its own
    prefill, from the costs it measured at start: the sum over tiers of the tokens
    predicted there x (1 - the cost of a hit there / prefill). A RAM hit costs a
    restore, a disk hit a read then a restore, so a RAM hit beats a disk hit beats a
    miss. Relative to the backend's own prefill, so a machine that measured a slower
    prefill (noise, or a busy moment at start) is not preferred for it: in a clean CI
    run absolute savings sent every warm request to the one of three equal daemons that
    measured slowest. Tokens in a tier the backend did not price (a disk hit without a
    disk read cost; a peer copy, whose cost is the link's) save nothing. A backend that
    published no costs is priced as its cached tokens at the median saving of a hit in
    the fastest tier among those that did.

    Savings within `tolerance` of a better one count as equal (bands from the best
    down), so load decides between them: measured costs carry a few percent of noise,
    and equal machines holding the same prefix must share its requests, not send them
    all to the one that happened to measure a slower prefill. When no backend published
    costs, the score is cached tokens, exactly as `CachedTokens`."""

    label = "time saved"
    reason: Reason = "prefix"
    needs_cache = True

    def __init__(self, tolerance: float = 0.2) -> None:
        self.tolerance = tolerance

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        known = [c.costs.saving_share(FASTEST) for c in candidates if c.costs is not None]
        if not known:
            return [c.cached_tokens for c in candidates]
        typical = statistics.median(known)
        return bands([prefill_saved(c, typical) for c in candidates], self.tolerance)

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return pick.cached_tokens > 0


def bands(values: Sequence[float], tolerance: float) -> list[int]:
    """Minus the band of each value: the best value opens band 0 and takes every value
    within `tolerance` (relative) of it, the best value left opens band 1, and so on."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0] * len(values)
    band, top = -1, 0.0
    for i in order:
        if band < 0 or values[i] < top - abs(top) * tolerance:
            band, top = band + 1, values[i]
        out[i] = -band
    return out


class FasterTier:
    """More of the hit in the fastest tier (RAM) is better: between backends whose
    savings count as equal (and equally loaded), the one that restores rather than reads
    from disk or copies from a peer."""

    label = "faster tier"
    reason: Reason = "prefix"
    needs_cache = True

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        return [c.cached[FASTEST] for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return pick.cached_tokens > 0


def prefill_saved(candidate: Candidate, typical_saving: float) -> float:
    """The prefill the candidate's predicted hit saves, in tokens of its own prefill
    (see TimeSaved); `typical_saving`: the share a fastest-tier hit saves where the
    candidate published no costs."""
    costs = candidate.costs
    if costs is None:
        return candidate.cached_tokens * typical_saving
    return sum(candidate.cached[t] * costs.saving_share(t) for t in TIERS)


class LeastLoad:
    """Fewer requests in flight is better."""

    label = "load"
    reason: Reason = "least-load"
    needs_cache = False

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        return [-c.in_flight for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return True


class TieHash:
    """A rendezvous hash of the request: equal candidates share new work, and the same
    request breaks the tie the same way."""

    label = "request hash"
    reason: Reason = "fallback"
    needs_cache = False

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        return [rendezvous(request.tie_key, c.name) for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return False


class AffinityHash:
    """A rendezvous hash of the session key: each session has its own order of
    backends (consistent hashing); no key, no preference."""

    label = "session-key hash"
    reason: Reason = "session"
    needs_cache = False

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        if request.affinity is None:
            return [0] * len(candidates)
        key = request.affinity.encode()
        return [rendezvous(key, c.name) for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return request.affinity is not None


class RoundRobin:
    """Backends in name order, starting one further on at every request."""

    label = "name order from the turn"
    reason: Reason = "round-robin"
    needs_cache = False

    def scores(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[int]:
        order = {name: i for i, name in enumerate(sorted(c.name for c in candidates))}
        n = len(order)
        return [-((order[c.name] - request.turn) % n) for c in candidates]

    def informs(self, pick: Candidate, request: RoutingRequest) -> bool:
        return True
