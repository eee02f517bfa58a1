"""Which cache blocks each backend holds: plain Python, no I/O.

Precise entries come from a daemon's cache events (a snapshot, then stored / evicted /
cleared in sequence order); backends without events get an estimate from the router's
own history (the blocks of requests it sent there, least recently routed forgotten
first). For those, the blocks of the warm sets a backend pins (its admin
`/v1/warm-sets`) count as held too (with events, the events already say so). A
prediction is what the daemon's engine would reuse: the longest run of the request's
blocks from the first, where the request's final block only counts when it
holds its logits (the engine needs them to sample the first token), split by the
fastest tier that holds each block (`predict_tiers`).

Tiers: a daemon with a disk tier reports each block entering or leaving RAM and the
disk separately (`tier` on its events), and its snapshot lists each block's fastest
tier and whether the disk holds it too. The index keeps the set per block, so a block
evicted from RAM that the disk still holds becomes a disk block, not a gone one.
History and warm-set entries count as RAM (an estimate; a backend without events has
said nothing about tiers).

One walk for the fleet (`predict_fleet`): beside each backend's entries the index keeps,
per block key, which backends hold it as bitsets over backend slots (held by events, held
but not in RAM, with logits, in history, in a warm set), as Dynamo's and llm-d's
indexers map a block to its workers. A request's blocks are walked once, the set of
backends still holding its run narrowing at each block, so routing costs O(request
blocks) whatever the fleet's size, and predicts what `predict_tiers` predicts for each
backend (a property test holds the two together).

The index has a byte budget: past it, the backend holding the most entries loses its
newest precise ones (a snapshot keeps its shallow blocks, the prefixes every longer
request needs; a flood of `stored` events from one backend costs only that backend) or
its least recently routed history ones. Each entry is costed at ENTRY_BYTES, measured
with tracemalloc (a 16-byte key in a dict: ~100 bytes; in an OrderedDict: ~155; the
key's holders, when no other backend holds it: ~110 more; shared by ten backends, ~50
bytes an entry in all). A
precise entry's value packs its logits flag and one bit per tier into one small int
(below 256 up to seven tiers): CPython's shared small ints, so the tiers add no bytes
to an entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from warmfleet_common.chunking import BlockKey
from warmfleet_common.tiers import FASTEST, NO_TOKENS, OTHER_TIER, TIERS, Tier, TierTokens
from warmfleet_router.keys import RequestBlocks

DEFAULT_HISTORY_BLOCKS = 200_000
DEFAULT_BUDGET_BYTES = 64 << 20
ENTRY_BYTES = 288

# A precise entry's value: bit 0 the logits flag, then one bit per tier holding it, in
# TIERS order (so the lowest tier bit set is the fastest tier).
_LOGITS = 1
# Every tier a daemon's registry adds beyond the built-in ones is kept as OTHER_TIER, the
# slowest (`sync_reads.indexed_tier`): predicted as `other`, as the served tokens are labelled.
_TIER_BIT: dict[Tier, int] = {t: 2 << i for i, t in enumerate((*TIERS, OTHER_TIER))}
_ANY_TIER = sum(_TIER_BIT.values())

# One snapshot entry: key, logits, and the tiers holding it (RAM when left out).
SnapshotEntry = tuple[BlockKey, bool] | tuple[BlockKey, bool, Iterable[Tier]]

# A key's holders: one bitset over backend slots for each of these.
_HELD, _NOT_RAM, _WITH_LOGITS, _HISTORY, _PINNED = range(5)


@dataclass(eq=False)
class Flight:
    """One request in prefill on a backend (see BlockIndex.take_off)."""

    backend: str
    keys: frozenset[BlockKey]
    first_unheld: BlockKey | None  # its first block the index did not hold when it left
    contended: bool = False


class BlockIndex:
    def __init__(
        self,
        history_blocks: int = DEFAULT_HISTORY_BLOCKS,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
    ) -> None:
        self._precise: dict[str, dict[BlockKey, int]] = {}  # backend -> key -> bits above
        self._history: dict[str, OrderedDict[BlockKey, None]] = {}
        self._pinned: dict[str, frozenset[BlockKey]] = {}  # warm, pinned prompts' blocks
        # Pinned fleet-wide warm prompts' blocks: what a backend shares with every tenant.
        self._shared: dict[str, frozenset[BlockKey]] = {}
        self._flights: dict[str, list[Flight]] = {}  # requests in prefill, per backend
        self._history_blocks = history_blocks
        self.budget_bytes = budget_bytes
        self._max_entries = max(1, budget_bytes // ENTRY_BYTES)
        self.dropped: dict[str, int] = {}  # entries dropped for the budget, per backend
        # The inverted index: key -> holders (bitsets over slots, see _HELD...).
        self._holders: dict[BlockKey, list[int]] = {}
        self._slots: dict[str, int] = {}  # backend -> its bit
        self._names: dict[int, str] = {}  # bit -> its backend
        self._free_slots: list[int] = []
        # Bumped when a bit or a shared set changes hands: what callers cache by slot
        # (`shortlist.FleetView`) is stale once it moves.
        self.revision = 0
        self._precise_slots = 0  # the bits of backends with events

    # -- precise: a daemon's cache events ---------------------------------------

    def load_snapshot(self, backend: str, blocks: Iterable[SnapshotEntry]) -> None:
        entries: dict[BlockKey, int] = {}
        for key, logits, *tiers in blocks:
            held = sum({_TIER_BIT[t] for t in tiers[0]}) if tiers else _TIER_BIT[FASTEST]
            entries[key] = held | (_LOGITS if logits else 0)
        bit = self._slot(backend)
        for key, bits in self._precise.get(backend, {}).items():
            self._unmark_precise(key, bits, bit)
        self._precise[backend] = entries
        self._precise_slots |= bit
        for key, bits in entries.items():
            self._mark_precise(key, bits, bit)
        self._keep_budget()

    def stored(self, backend: str, key: BlockKey, logits: bool, tier: Tier = FASTEST) -> None:
        held = self._precise.setdefault(backend, {})
        bit = self._slot(backend)
        self._precise_slots |= bit
        bits = (held.get(key, 0) & _ANY_TIER) | _TIER_BIT[tier]
        held[key] = bits = bits | (_LOGITS if logits else 0)
        self._mark_precise(key, bits, bit)
        self._keep_budget()

    def evicted(self, backend: str, key: BlockKey, tier: Tier = FASTEST) -> None:
        """`key` left `tier`; it stays known while another tier holds it."""
        held = self._precise.get(backend, {})
        bits = held.get(key)
        if bits is None:
            return
        bits &= ~_TIER_BIT[tier]
        if bits & _ANY_TIER:
            held[key] = bits
            self._mark_precise(key, bits, self._slots[backend])
        else:
            del held[key]
            self._unmark_precise(key, bits, self._slots[backend])

    def cleared(self, backend: str) -> None:
        bit = self._slot(backend)
        for key, bits in self._precise.get(backend, {}).items():
            self._unmark_precise(key, bits, bit)
        self._precise[backend] = {}
        self._precise_slots |= bit

    def is_precise(self, backend: str) -> bool:
        return backend in self._precise

    # -- estimated: the router's own history ------------------------------------

    def routed(self, backend: str, blocks: RequestBlocks) -> None:
        if backend in self._precise:
            return  # the events say what it really stored
        seen = self._history.setdefault(backend, OrderedDict())
        bit = self._slot(backend)
        for key in blocks.keys:
            seen[key] = None
            seen.move_to_end(key)
            self._mark(key, _HISTORY, bit)
        while len(seen) > self._history_blocks:
            self._unmark(seen.popitem(last=False)[0], _HISTORY, bit)
        self._keep_budget()

    # -- warm sets: what a backend pins -----------------------------------------

    def set_pinned(self, backend: str, keys: Iterable[BlockKey]) -> None:
        """The blocks of every warm prompt of a pinned set on this backend (replaces)."""
        bit = self._slot(backend)
        for key in self._pinned.get(backend, ()):
            self._unmark(key, _PINNED, bit)
        self._pinned[backend] = pinned = frozenset(keys)
        for key in pinned:
            self._mark(key, _PINNED, bit)
        self._keep_budget()

    def set_shared(self, backend: str, keys: Iterable[BlockKey]) -> None:
        """The blocks this backend shares with every tenant (replaces)."""
        shared = frozenset(keys)
        if shared != self._shared.get(backend):
            self._shared[backend] = shared
            self.revision += 1
        self._keep_budget()

    def shared(self, backend: str) -> frozenset[BlockKey]:
        """The blocks this backend shares with every tenant (`set_shared`)."""
        return self._shared.get(backend, frozenset())

    def on(self, backend: str, blocks: RequestBlocks) -> RequestBlocks:
        """A request's blocks as `backend` keys them (a salted request: the run it shares
        with every tenant there keeps its unsalted keys)."""
        return blocks.on(self._shared.get(backend, frozenset())) if blocks.unsalted else blocks

    # -- the budget ---------------------------------------------------------------

    def entries(self) -> int:
        return (
            sum(len(d) for d in self._precise.values())
            + sum(len(d) for d in self._history.values())
            + sum(len(p) for p in self._pinned.values())
            + sum(len(s) for s in self._shared.values())
        )

    def estimated_bytes(self) -> int:
        """The index's estimated size."""
        return self.entries() * ENTRY_BYTES

    def _keep_budget(self) -> None:
        over = self.entries() - self._max_entries
        if over <= 0:
            return
        over += self._max_entries // 20  # to 95%: no trimming at every event after
        while over > 0:
            sizes = {
                b: len(self._precise.get(b, ())) + len(self._history.get(b, ()))
                for b in self._precise.keys() | self._history.keys()
            }
            backend = max(sorted(sizes), key=lambda b: sizes[b], default=None)
            if backend is None or sizes[backend] == 0:
                return  # only warm sets left: bounded by their read limit
            trimmed = 0
            precise, history = self._precise.get(backend), self._history.get(backend)
            bit = self._slots[backend]
            while over > 0 and precise:
                key, bits = precise.popitem()  # the newest: a snapshot keeps its shallow blocks
                self._unmark_precise(key, bits, bit)
                over, trimmed = over - 1, trimmed + 1
            while over > 0 and history:
                key, _ = history.popitem(last=False)  # the least recently routed
                self._unmark(key, _HISTORY, bit)
                over, trimmed = over - 1, trimmed + 1
            self.dropped[backend] = self.dropped.get(backend, 0) + trimmed

    # -- requests in prefill: blocks a backend may be computing right now ----------

    def take_off(self, backend: str, blocks: RequestBlocks) -> Flight:
        """A request sent to `backend`, until its prefill is done (`land`). Two requests
        there at once that could share a block neither's prediction counted contend:
        the daemon computes such a block once, and which of the two then reuses it is
        up to its prefill scheduler, so both predictions can be off by those blocks
        (either way) through no fault of the index."""
        precise = self._precise.get(backend)
        held: dict[BlockKey, int] | OrderedDict[BlockKey, None]
        held = precise if precise is not None else self._history.get(backend, OrderedDict())
        pinned = self._pinned.get(backend, frozenset()) if precise is None else frozenset()
        first = next((k for k in blocks.keys if k not in held and k not in pinned), None)
        flight = Flight(backend, frozenset(blocks.keys), first)
        flights = self._flights.setdefault(backend, [])
        for other in flights:
            if (first is not None and first in other.keys) or (
                other.first_unheld is not None and other.first_unheld in flight.keys
            ):
                other.contended = flight.contended = True
        flights.append(flight)
        return flight

    def land(self, flight: Flight) -> None:
        flights = self._flights.get(flight.backend, [])
        if flight in flights:
            flights.remove(flight)

    # -- all ----------------------------------------------------------------------

    def forget(self, backend: str, *, keep_pinned: bool = False) -> None:
        """Nothing is known about this backend any more (gone, restarted, resyncing);
        `keep_pinned`: except its warm sets (they are read on their own)."""
        bit = self._slots.get(backend, 0)  # 0: it never held a block
        for key, bits in self._precise.pop(backend, {}).items():
            self._unmark_precise(key, bits, bit)
        for key in self._history.pop(backend, ()):
            self._unmark(key, _HISTORY, bit)
        self._precise_slots &= ~bit
        if not keep_pinned:
            for key in self._pinned.pop(backend, ()):
                self._unmark(key, _PINNED, bit)
            self._shared.pop(backend, None)
            if bit:  # nothing of it is left: its bit is free
                del self._slots[backend]
                del self._names[bit]
                self._free_slots.append(bit.bit_length() - 1)
                self.revision += 1

    def forget_held(self, backend: str) -> None:
        """What it holds is unknown again (its event stream ended: a restarted daemon is
        ready, and cold, before its stream is back): the blocks it held and its warm
        prompts go; its keying (`set_shared`) stays."""
        self.forget(backend, keep_pinned=True)
        bit = self._slots.get(backend, 0)
        for key in self._pinned.pop(backend, ()):
            self._unmark(key, _PINNED, bit)

    def predict(self, backend: str, blocks: RequestBlocks) -> int:
        """Prompt tokens this backend would serve from its cache."""
        return self.predict_tiers(backend, blocks).total

    def predict_tiers(self, backend: str, blocks: RequestBlocks) -> TierTokens:
        """Prompt tokens this backend would serve from its cache, by the fastest tier
        holding each block (the engine takes a block from a slower tier only when every
        faster one lacks it: RAM before disk before a peer)."""
        precise = self._precise.get(backend)
        held: dict[BlockKey, int] | OrderedDict[BlockKey, None]
        held = precise if precise is not None else self._history.get(backend, OrderedDict())
        # Events already say what is pinned, and when a clear dropped it: the warm sets'
        # blocks fill in only for backends without them.
        pinned = self._pinned.get(backend, frozenset()) if precise is None else frozenset()
        run = 0
        for key in blocks.keys:
            if key not in held and key not in pinned:
                break
            run += 1
        if run and run == len(blocks.keys):
            # The engine needs the final block's logits: events say whether it has them;
            # a warm prefix is a strict prefix of its requests, so its blocks have none.
            last = blocks.keys[-1]
            if (precise is not None and not precise.get(last, 0) & _LOGITS) or last not in held:
                run -= 1
        if not run:
            return NO_TOKENS
        if precise is None:  # estimates say nothing of tiers
            return TierTokens({FASTEST: blocks.ends[run - 1]})
        tokens = dict.fromkeys(TIERS, 0)
        start = 0
        for key, end in zip(blocks.keys[:run], blocks.ends[:run], strict=True):
            bits = precise[key]
            tier: Tier = next(t for t, bit in _TIER_BIT.items() if bits & bit)  # fastest
            tokens[tier] = tokens.get(tier, 0) + end - start
            start = end
        return TierTokens(tokens)

    def predict_fleet(self, requests: Mapping[str, RequestBlocks]) -> dict[str, Prediction]:
        """For each backend, the request's blocks as it keys them (`on`) and what it would
        serve from its cache (`predict_tiers`), in one walk of the blocks per distinct
        keying (a model's layout, a set of blocks shared with every tenant) rather than
        one per backend."""
        groups: dict[tuple[int, frozenset[BlockKey]], tuple[RequestBlocks, list[str]]] = {}
        slots = self._slots
        for backend, blocks in requests.items():
            shared = self._shared.get(backend, frozenset()) if blocks.unsalted else frozenset()
            group = groups.get((id(blocks), shared))
            if group is None:
                group = groups[(id(blocks), shared)] = (self.on(backend, blocks), [])
            group[1].append(backend)
        out: dict[str, Prediction] = {}
        for keyed, members in groups.values():
            mask = 0
            for backend in members:
                mask |= slots.get(backend, 0)
            walk = self.walk(keyed, mask)
            hits = {bit: walk.hit(bit, run) for group, run in walk.runs for bit in _bits(group)}
            for backend in members:
                out[backend] = Prediction(keyed, hits.get(slots.get(backend, 0), NO_TOKENS))
        return out

    def walk(self, blocks: RequestBlocks, slots: int) -> Walk:
        """The runs of the request's blocks that the backends in `slots` (by bit) hold,
        walking its blocks once: the backends still holding the run narrow at each
        block. Only backends holding at least its first block are in a run; a backend's
        `Walk.hit` is what `predict_tiers` says for it."""
        keys = blocks.keys
        if not keys or not slots:
            return Walk(self, blocks, [], [])
        precise = self._precise_slots
        estimated = ~precise
        runs: list[tuple[int, int]] = []  # (bits, blocks in their run), shortest first
        off_ram: list[tuple[int, int]] = []  # (index, bits) of precise blocks not in RAM
        alive = slots
        for index, key in enumerate(keys):
            holders = self._holders.get(key)
            held = 0
            if holders is not None:
                held = holders[_HELD] & precise | (holders[_HISTORY] | holders[_PINNED]) & estimated
                if holders[_NOT_RAM] & alive:
                    off_ram.append((index, holders[_NOT_RAM] & alive))
            if index and alive & ~held:
                runs.append((alive & ~held, index))
            alive &= held
            if not alive:
                break
        else:  # those holding every block need the final block's logits
            holders = self._holders[keys[-1]]
            logits = holders[_WITH_LOGITS] & precise | holders[_HISTORY] & estimated
            if alive & ~logits and len(keys) > 1:
                if runs and runs[-1][1] == len(keys) - 1:
                    runs[-1] = (runs[-1][0] | alive & ~logits, len(keys) - 1)
                else:
                    runs.append((alive & ~logits, len(keys) - 1))
            if alive & logits:
                runs.append((alive & logits, len(keys)))
        runs.reverse()
        return Walk(self, blocks, runs, off_ram)

    def slot(self, backend: str) -> int:
        """The bit of `backend` in the holders' bitsets (given one if it has none)."""
        return self._slot(backend)

    def name_of(self, bit: int) -> str | None:
        return self._names.get(bit)

    def tiers(self, backend: str, key: BlockKey) -> frozenset[Tier]:
        """The tiers a backend's events say hold `key` (empty: none known)."""
        bits = self._precise.get(backend, {}).get(key, 0)
        return frozenset(t for t, bit in _TIER_BIT.items() if bits & bit)

    def dropped_blocks(self, backend: str) -> int:
        return self.dropped.get(backend, 0)

    def size(self, backend: str) -> int:
        """Blocks known on this backend (events or history, and its warm sets')."""
        precise = self._precise.get(backend)
        if precise is not None:
            return len(precise)
        held = self._history.get(backend, OrderedDict())
        return len(held) + sum(key not in held for key in self._pinned.get(backend, ()))

    # -- the inverted index: helpers ---------------------------------------------------

    def _slot(self, backend: str) -> int:
        """The bit of `backend` in the holders' bitsets (a new one, or a freed one)."""
        bit = self._slots.get(backend)
        if bit is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._slots)
            bit = self._slots[backend] = 1 << slot
            self._names[bit] = backend
            self.revision += 1
        return bit

    def _mark(self, key: BlockKey, kind: int, bit: int) -> None:
        holders = self._holders.get(key)
        if holders is None:
            holders = self._holders[key] = [0, 0, 0, 0, 0]
        holders[kind] |= bit

    def _unmark(self, key: BlockKey, kind: int, bit: int) -> None:
        holders = self._holders.get(key)
        if holders is None:
            return
        holders[kind] &= ~bit
        if not any(holders):
            del self._holders[key]

    def _mark_precise(self, key: BlockKey, bits: int, bit: int) -> None:
        """`key` is held by this slot's events with `bits` (tiers and logits), replacing
        what was marked before."""
        holders = self._holders.get(key)
        if holders is None:
            holders = self._holders[key] = [0, 0, 0, 0, 0]
        holders[_HELD] |= bit
        if bits & _TIER_BIT[FASTEST]:
            holders[_NOT_RAM] &= ~bit
        else:
            holders[_NOT_RAM] |= bit
        if bits & _LOGITS:
            holders[_WITH_LOGITS] |= bit
        else:
            holders[_WITH_LOGITS] &= ~bit

    def _unmark_precise(self, key: BlockKey, bits: int, bit: int) -> None:
        holders = self._holders.get(key)
        if holders is None:
            return
        holders[_HELD] &= ~bit
        holders[_NOT_RAM] &= ~bit
        holders[_WITH_LOGITS] &= ~bit
        if not any(holders):
            del self._holders[key]


class Walk:
    """One walk of a request's blocks (`BlockIndex.walk`): the backends holding each run
    length, grouped (`runs`: bits and blocks, longest first), and each one's hit."""

    def __init__(
        self,
        index: BlockIndex,
        blocks: RequestBlocks,
        runs: list[tuple[int, int]],
        off_ram: list[tuple[int, int]],
    ) -> None:
        self.blocks = blocks
        self.runs = runs
        self._index = index
        self._off_ram = off_ram
        self._in_ram: dict[int, TierTokens] = {}  # one object per run length: most are alike

    def hit(self, bit: int, run: int) -> TierTokens:
        """The cached tokens by tier of the backend at `bit`, whose run is `run` blocks."""
        ends = self.blocks.ends
        index = self._index
        if not bit & index._precise_slots or not any(w & bit for i, w in self._off_ram if i < run):
            hit = self._in_ram.get(run)
            if hit is None:
                hit = self._in_ram[run] = TierTokens({FASTEST: ends[run - 1]})
            return hit
        tokens = dict.fromkeys(TIERS, 0)
        tokens[FASTEST] = ends[run - 1]
        entries = index._precise[index._names[bit]]
        keys = self.blocks.keys
        for at, where in self._off_ram:
            if at >= run:
                break
            if where & bit:  # the fastest tier holding it, RAM excepted
                entry = entries[keys[at]]
                tier = next(t for t, tier_bit in _TIER_BIT.items() if entry & tier_bit)
                size = ends[at] - (ends[at - 1] if at else 0)
                tokens[tier] = tokens.get(tier, 0) + size
                tokens[FASTEST] -= size
        return TierTokens(tokens)


class Prediction(NamedTuple):
    """One backend's view of a request: its blocks as it keys them, and its hit."""

    blocks: RequestBlocks
    hit: TierTokens


def _bits(mask: int) -> Iterator[int]:
    """The set bits of `mask`, lowest first."""
    while mask:
        low = mask & -mask
        yield low
        mask ^= low
