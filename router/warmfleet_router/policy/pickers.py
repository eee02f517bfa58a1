"""Pickers: given the candidates ranked by the scorers (best first, ties broken by the
scorers' own order and then by the candidates' order, so deterministic) and what each
filter let through, pick one backend and order the rest for retries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from warmfleet_router.policy.model import Candidate


class Picker(Protocol):
    label: str  # what the policy table calls it

    def __call__(
        self, ranked: Sequence[Candidate], stages: Sequence[Sequence[Candidate]]
    ) -> tuple[Candidate, list[Candidate]]:
        """`stages[0]` is every candidate, `stages[i]` what the i-th filter let through
        (never empty). Returns the pick and the fallbacks, best first."""
        ...


class BestPicker:
    """The best ranked of what every filter let through. Fallbacks: those that passed
    more filters first, each group in rank order."""

    label = "best"

    def __call__(
        self, ranked: Sequence[Candidate], stages: Sequence[Sequence[Candidate]]
    ) -> tuple[Candidate, list[Candidate]]:
        depth = {c.name: 0 for c in ranked}
        for level, stage in enumerate(stages):
            for c in stage:
                depth[c.name] = level
        rank = {c.name: i for i, c in enumerate(ranked)}
        order = sorted(ranked, key=lambda c: (-depth[c.name], rank[c.name]))
        return order[0], order[1:]


class RingPicker:
    """Consistent hashing's walk around the ring: the first in rank order that every
    filter let through; fallbacks in rank order (the ring's), filtered or not."""

    label = "ring"

    def __call__(
        self, ranked: Sequence[Candidate], stages: Sequence[Sequence[Candidate]]
    ) -> tuple[Candidate, list[Candidate]]:
        allowed = {c.name for c in stages[-1]}
        pick = next(c for c in ranked if c.name in allowed)
        return pick, [c for c in ranked if c is not pick]
