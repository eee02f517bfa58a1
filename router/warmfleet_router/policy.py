"""Choosing a backend: plain Python, no I/O; every choice is deterministic in its inputs.

`prefix` (the default): the backend predicted to serve most of the prompt from its
cache, subject to bounded load (consistent hashing with bounded loads: no backend may
take a request that would put it above ceil((1 + epsilon) x the mean in-flight count));
ties by load, then by a rendezvous hash of the request so equal candidates share new
work. An affinity key (`x-session-affinity` or `X-Prefix-Hash`) keeps a session where it
is while that backend is eligible. `round-robin`, `least-load` and `session` (rendezvous
hash of the affinity key) exist to compare against.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["prefix", "round-robin", "least-load", "session"]
POLICIES: tuple[Policy, ...] = ("prefix", "round-robin", "least-load", "session")
Reason = Literal[
    "prefix", "session", "load-spill", "failover", "fallback", "round-robin", "least-load"
]
DEFAULT_EPSILON = 0.25


@dataclass(frozen=True)
class Candidate:
    name: str
    in_flight: int
    cached_tokens: int = 0  # predicted


@dataclass(frozen=True)
class Decision:
    backend: str
    reason: Reason
    predicted: int  # cached tokens predicted on `backend`
    fallbacks: tuple[str, ...]  # where to retry, best first


def capacity(total_in_flight: int, backends: int, epsilon: float) -> int:
    """The most in-flight requests any backend may hold once this one is placed."""
    return math.ceil((1 + epsilon) * (total_in_flight + 1) / backends)


def eligible(candidates: Sequence[Candidate], epsilon: float) -> list[Candidate]:
    """Candidates that stay within the bound with one more request (never empty when
    `candidates` is not: the least loaded always fits)."""
    cap = capacity(sum(c.in_flight for c in candidates), len(candidates), epsilon)
    return [c for c in candidates if c.in_flight + 1 <= cap]


def rendezvous(key: bytes, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + name.encode(), digest_size=8).digest(), "big")


def choose(
    policy: Policy,
    candidates: Sequence[Candidate],
    *,
    epsilon: float = DEFAULT_EPSILON,
    tie_key: bytes = b"",
    affinity: str | None = None,
    session_backend: str | None = None,
    turn: int = 0,
) -> Decision:
    """Pick a backend among `candidates` (healthy, ready ones). `session_backend` is where
    the affinity key's session is; `turn` counts requests (round-robin)."""
    if not candidates:
        raise ValueError("no candidates")
    fits = eligible(candidates, epsilon)
    fit_names = {c.name for c in fits}

    def ranked(pool: Sequence[Candidate], by_cache: bool) -> list[Candidate]:
        return sorted(
            pool,
            key=lambda c: (
                -c.cached_tokens if by_cache else 0,
                c.in_flight,
                -rendezvous(tie_key, c.name),
            ),
        )

    def decide(first: Candidate, reason: Reason, order: list[Candidate]) -> Decision:
        rest = [c.name for c in order if c.name != first.name]
        rest += [c.name for c in ranked(candidates, True) if c.name not in rest and c is not first]
        return Decision(first.name, reason, first.cached_tokens, tuple(rest))

    if policy == "round-robin":
        order = sorted(candidates, key=lambda c: c.name)
        first = order[turn % len(order)]
        return decide(first, "round-robin", order[turn % len(order) :] + order[: turn % len(order)])
    if policy == "least-load":
        order = ranked(candidates, False)
        return decide(order[0], "least-load", order)
    if policy == "session":
        if affinity is None:
            order = ranked(candidates, False)
            return decide(order[0], "fallback", order)
        key = affinity.encode()
        by_hash = sorted(candidates, key=lambda c: -rendezvous(key, c.name))
        first = next(c for c in by_hash if c.name in fit_names)
        return decide(first, "session" if first is by_hash[0] else "load-spill", by_hash)

    # prefix
    if session_backend is not None and session_backend in fit_names:
        first = next(c for c in fits if c.name == session_backend)
        return decide(first, "session", ranked(fits, True))
    order = ranked(fits, True)
    first = order[0]
    best_anywhere = max(c.cached_tokens for c in candidates)
    if best_anywhere > first.cached_tokens:
        reason: Reason = "load-spill"
    elif session_backend is not None and any(c.name == session_backend for c in candidates):
        reason = "load-spill"  # its session's backend is there but overloaded
    elif first.cached_tokens == 0:
        reason = "fallback"
    else:
        reason = "prefix"
    return decide(first, reason, order)
