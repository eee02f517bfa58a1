"""A policy is filters, scorers and a picker (the Gateway API Inference Extension's
scheduler shape); the named policies are compositions of the same pieces
(`warmfleet_router.policy.registry`). Every policy first admits the backends that are
ready and serve the request's model. The reason a decision gives: `session` when the
session pin chose it, `load-spill` when a filter kept the best-ranked backend (or the
session's) from it, else the first scorer's reason, or `fallback` when that scorer had
nothing to say about the pick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from warmfleet_router.policy.filters import Filter, Ready, ServesModel, SessionPin
from warmfleet_router.policy.model import (
    Candidate,
    Decision,
    NoBackendReady,
    Reason,
    RoutingRequest,
)
from warmfleet_router.policy.pickers import BestPicker, Picker
from warmfleet_router.policy.scorers import Scorer

ADMISSION: tuple[Filter, ...] = (Ready(), ServesModel())


def admit(candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
    """The candidates every policy starts from (ready, serving the model); raises a
    RoutingError saying why none is left."""
    admitted = list(candidates)
    for f in ADMISSION:
        admitted = f(admitted, request)
    if not admitted:
        raise NoBackendReady()
    return admitted


@dataclass(frozen=True)
class Pieces:
    """A policy's pieces by the names the policy table gives them."""

    filters: tuple[str, ...]
    scorers: tuple[str, ...]
    picker: str


@dataclass(frozen=True)
class Policy:
    name: str
    scorers: tuple[Scorer, ...]
    filters: tuple[Filter, ...] = ()
    picker: Picker = field(default_factory=BestPicker)

    def describe(self) -> Pieces:
        return Pieces(
            tuple(f.label for f in self.filters),
            tuple(s.label for s in self.scorers),
            self.picker.label,
        )

    @property
    def needs_cache(self) -> bool:
        """Whether requests must be keyed (their cached tokens predicted) for it."""
        return any(s.needs_cache for s in self.scorers)

    def rank(self, candidates: Sequence[Candidate], request: RoutingRequest) -> list[Candidate]:
        columns = [s.scores(candidates, request) for s in self.scorers]
        keyed = sorted(enumerate(candidates), key=lambda ic: tuple(-col[ic[0]] for col in columns))
        return [c for _, c in keyed]

    def decide(self, candidates: Sequence[Candidate], request: RoutingRequest) -> Decision:
        """Pick among admitted `candidates`."""
        if not candidates:
            raise ValueError("no candidates")
        stages: list[list[Candidate]] = [list(candidates)]
        for f in self.filters:  # routing filters never empty a non-empty list
            stages.append(f(stages[-1], request))
        ranked = self.rank(candidates, request)
        pick, rest = self.picker(ranked, stages)
        reason = self._reason(pick, ranked, stages, request)
        return Decision(pick.name, reason, pick.cached_tokens, tuple(c.name for c in rest))

    def _reason(
        self,
        pick: Candidate,
        ranked: Sequence[Candidate],
        stages: Sequence[Sequence[Candidate]],
        request: RoutingRequest,
    ) -> Reason:
        pinned = any(isinstance(f, SessionPin) for f in self.filters)
        if pinned and pick.name == request.session_backend:
            return "session"  # the pin let only it through
        if pick is not ranked[0]:
            return "load-spill"
        if pinned and SessionPin.spilled(request, stages[0]):
            return "load-spill"  # its session's backend is there but overloaded
        primary = self.scorers[0]
        return primary.reason if primary.informs(pick, request) else "fallback"
