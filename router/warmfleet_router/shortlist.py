"""The backends a keyed request is scored on, in time of the request, not of the fleet.

At a hundred Macs every node holds the agents' warm heads, so nearly every backend is a
holder of a request's first blocks; scoring each one (a candidate object, the policy's
scores, a hash per backend) made the route stage grow with the fleet. The index's walk
(`BlockIndex.walk`) already groups the backends by how long a run of the request's
blocks they hold; backends in one group are alike to the cache scorers, so the policy
sees at most `PER_GROUP` of each group (and of the backends holding none of it): the
session's backend always, the rest taken from the group's bitset starting at a point
the request's tie key sets (each request its own sample of an equal group, the same
request the same sample: a power-of-K-choices over equal backends). A group no larger
than `PER_GROUP` is seen whole, so a fleet of up to `PER_GROUP` backends is scored
exactly as before.

What admission and keying need of the fleet (ready backends, their layouts, their
shared warm blocks, their slots) is kept in a `FleetView`, rebuilt only when a
backend's state, the fleet's members or the index's slots change.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from warmfleet_common.chunking import BlockKey
from warmfleet_common.tiers import NO_TOKENS, TierTokens
from warmfleet_router.backend import Backend
from warmfleet_router.index import BlockIndex, Prediction
from warmfleet_router.keys import EMPTY, MESSAGE_KEYS, RequestBlocks
from warmfleet_router.policy import Candidate, RoutingRequest, admit

PER_GROUP = 8
MAX_MODELS = 64  # admissions kept per view


@dataclass(frozen=True)
class Keying:
    """Backends that key a request alike: one layout, one set of shared warm blocks."""

    fingerprint: str
    shared: frozenset[BlockKey]
    bits: int  # every backend of it
    may_hold: int  # those a peer copy may come from (ready or draining, with a layout)


@dataclass
class FleetView:
    backends: list[Backend]  # in the fleet's order
    ready: list[Backend]
    keyings: list[Keying]
    bits: dict[str, int]  # backend -> its index slot
    fingerprints: dict[str, str]  # backend -> the keys its entries are in
    layouts: tuple[str, ...]  # the keyings of the ready backends, sorted
    max_context: int | None  # the largest context of the ready backends, if each said it
    shared_tokens: int  # their longest fleet-wide warm prompt (`keys.Salt`)
    _admitted: dict[str | None, tuple[list[Backend], int]] = field(default_factory=dict)
    by_bit: dict[int, Backend] = field(init=False)
    order: dict[str, int] = field(init=False)  # backend -> its place in the fleet

    def __post_init__(self) -> None:
        self.by_bit = {self.bits[b.name]: b for b in self.backends}
        self.order = {b.name: i for i, b in enumerate(self.backends)}

    def admitted(self, model: str | None) -> tuple[list[Backend], int]:
        """The backends every policy starts from for `model` and their bits; raises the
        RoutingError saying why there are none (`policy.admit`)."""
        found = self._admitted.get(model)
        if found is None:
            fleet = [Candidate(b.name, 0, ready=b.usable, models=b.models) for b in self.backends]
            names = {c.name for c in admit(fleet, RoutingRequest(model, fleet=fleet))}
            chosen = [b for b in self.backends if b.name in names]
            mask = 0
            for b in chosen:
                mask |= self.bits[b.name]
            found = (chosen, mask)
            if len(self._admitted) < MAX_MODELS:  # model names are the clients' to choose
                self._admitted[model] = found
        return found


def fleet_view(
    backends: Sequence[Backend], index: BlockIndex, fingerprint_of: Mapping[str, str]
) -> FleetView:
    """The view of `backends` (`fingerprint_of`: each one's keys, `Membership.fingerprint_of`)."""
    bits = {b.name: index.slot(b.name) for b in backends}
    groups: dict[tuple[str, frozenset[BlockKey]], list[int]] = {}
    for b in backends:
        fingerprint = fingerprint_of[b.name]
        group = groups.setdefault((fingerprint, index.shared(b.name)), [0, 0])
        group[0] |= bits[b.name]
        if (
            b.health in ("ready", "draining")
            and b.fingerprint is not None
            and fingerprint != MESSAGE_KEYS
        ):
            group[1] |= bits[b.name]
    keyings = [Keying(fp, shared, all_, hold) for (fp, shared), (all_, hold) in groups.items()]
    ready = [b for b in backends if b.usable]
    contexts = [b.context_length for b in ready if b.context_length]
    return FleetView(
        list(backends),
        ready,
        keyings,
        bits,
        dict(fingerprint_of),
        tuple(sorted({fingerprint_of[b.name] for b in ready})),
        max(contexts) if ready and len(contexts) == len(ready) else None,
        max((b.shared_tokens for b in ready), default=0),
    )


@dataclass
class Shortlist:
    backends: list[Backend]  # what the policy scores, in the fleet's order
    predictions: dict[str, Prediction]  # of each of them
    holders: dict[str, int]  # cached tokens where a peer copy may come from


def shortlist(
    view: FleetView,
    index: BlockIndex,
    blocks: Mapping[str, RequestBlocks],
    admitted: tuple[list[Backend], int],
    tie_key: bytes,
    session_backend: str | None = None,
) -> Shortlist:
    """The backends a keyed request is scored on (see the module's docstring) and their
    predictions, walking its blocks once per keying."""
    allowed = admitted[1]
    start = zlib.crc32(tie_key)
    session_bit = view.bits.get(session_backend, 0) if session_backend else 0
    predictions: dict[int, Prediction] = {}
    holders: dict[str, int] = {}
    for keying in view.keyings:
        request = blocks.get(keying.fingerprint, EMPTY)
        keyed = request.on(keying.shared) if request.unsalted else request
        walk = index.walk(keyed, keying.bits & (allowed | keying.may_hold))
        rest = keying.bits & allowed
        for group, run in walk.runs:
            for bit in _sample(group & allowed, start, session_bit):
                predictions[bit] = Prediction(keyed, walk.hit(bit, run))
            if keyed.keys and keying.fingerprint in blocks:
                for bit in _sample(group & keying.may_hold, start, 0):
                    holders[index.name_of(bit) or ""] = walk.hit(bit, run).total
            rest &= ~group
        for bit in _sample(rest, start, session_bit):
            predictions[bit] = Prediction(keyed, NO_TOKENS)
    backends = sorted((view.by_bit[bit] for bit in predictions), key=lambda b: view.order[b.name])
    named = {b.name: predictions[view.bits[b.name]] for b in backends}
    holders.pop("", None)
    return Shortlist(backends, named, holders)


def _sample(bits: int, start: int, always: int) -> Iterator[int]:
    """Up to PER_GROUP of `bits`, from the bit `start` (modulo their width) up and then
    around; `always` among them if it is in `bits`."""
    if bits.bit_count() <= PER_GROUP:
        yield from _each(bits)
        return
    taken = 0
    if always & bits:
        yield always
        taken, bits = 1, bits & ~always
    at = start % bits.bit_length()
    for part in (bits >> at << at, bits & ((1 << at) - 1)):
        for bit in _each(part):
            if taken == PER_GROUP:
                return
            yield bit
            taken += 1


def _each(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low
        mask ^= low


def hits(short: Shortlist) -> dict[str, TierTokens]:
    return {name: p.hit for name, p in short.predictions.items()}
