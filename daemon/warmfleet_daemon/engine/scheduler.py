"""Which sequences run: the inbox (filled from any thread), the line of requests waiting
for a slot, the sequences in prefill, and the idle-priority prefills (next turns).

At most `max_num_seqs` sequences prefill or decode at once; the others wait in arrival
order, except that the choices of one request (OpenAI `n`) hold at most half of the
slots: a large `n` cannot keep every other request waiting until one of its choices
ends, and its remaining choices start as its earlier ones finish. The next prefill
chunk goes to the tenant served longest ago, and of its prompts to the one with the
fewest tokens left, aged by its wait (`prefill_order`). The decoding sequences belong
to the decoder (their KV rows mirror its list); the scheduler counts them as holding
slots.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

from warmfleet_daemon.engine import prefill_order
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.engine.sequence import SequenceState

_MAX_IDLE = 64  # idle-priority prefills kept waiting; beyond, the oldest are dropped

Abort = Callable[[SequenceState], None]


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.inbox: deque[SequenceState] = deque()
        self.waiting: deque[SequenceState] = deque()
        self.prefilling: list[SequenceState] = []
        # Idle-priority prefills, oldest first; the first is the one being computed.
        self.idle: deque[SequenceState] = deque()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.clears = 0  # DELETE /v1/cache/prefix: idle prefills from before one are dropped
        self.requests_total = 0
        self._cancelled: set[str] = set()
        self._arrivals = itertools.count()
        self._picks = itertools.count()
        # The pick number of each tenant's last prefill chunk (tenants in prefill only).
        self._tenant_served: dict[str | None, int] = {}

    # -- from any thread ------------------------------------------------------------

    def next_arrival(self) -> int:
        return next(self._arrivals)

    def enqueue(self, seq: SequenceState) -> None:
        with self.lock:
            self.inbox.append(seq)
            if not seq.request.idle:
                self.requests_total += 1
        self.wake.set()

    def cancel(self, request_id: str) -> None:
        with self.lock:
            self._cancelled.add(request_id)
        self.wake.set()

    def note_clear(self) -> None:
        with self.lock:
            self.clears += 1
        self.wake.set()

    def counts(self) -> tuple[int, int]:
        """Requests waiting for a slot, and idle prefills not finished."""
        with self.lock:
            waiting = sum(not s.request.idle for s in self.inbox) + len(self.waiting)
            idle = len(self.idle) + sum(s.request.idle for s in self.inbox)
        return waiting, idle

    def pending(self) -> bool:
        """Anything submitted that is not decoding yet."""
        with self.lock:
            return bool(self.inbox or self.waiting or self.prefilling or self.idle)

    # -- on the engine thread -------------------------------------------------------

    def from_before_a_clear(self, seq: SequenceState) -> bool:
        return seq.request.idle and seq.clears_seen != self.clears

    @property
    def slot_share(self) -> int:
        """The sequence slots one request's choices may hold at once: half of them."""
        return max(1, self.config.max_num_seqs // 2)

    def admit(
        self,
        decoding: Sequence[SequenceState],
        abort: Abort,
        started: Callable[[SequenceState], None],
    ) -> None:
        """Take the inbox; `abort` what was cancelled, idle prefills from before a clear
        and the oldest beyond `_MAX_IDLE`; admit waiting requests into free slots
        (`started` is called with each, on its way to prefill)."""
        with self.lock:
            for seq in self.inbox:
                (self.idle if seq.request.idle else self.waiting).append(seq)
            self.inbox.clear()
            cancelled, self._cancelled = self._cancelled, set()
        for seq in [s for s in self.idle if self.from_before_a_clear(s)]:
            abort(seq)
        while len(self.idle) > _MAX_IDLE:  # the oldest conversations' next turns go
            abort(self.idle[1])
        if cancelled:
            for seq in [*self.waiting, *self.prefilling, *decoding, *self.idle]:
                if seq.request.request_id in cancelled:
                    abort(seq)
        free = self.config.max_num_seqs - len(self.prefilling) - len(decoding)
        if free <= 0 or not self.waiting:
            return
        # In arrival order, except that a request's choices beyond its share wait for
        # its earlier ones to finish, and later requests go ahead of them.
        held = Counter(s.request.group_key for s in (*self.prefilling, *decoding))
        admitted: list[SequenceState] = []
        for seq in self.waiting:
            if len(admitted) == free:
                break
            if held[seq.request.group_key] < self.slot_share:
                held[seq.request.group_key] += 1
                admitted.append(seq)
        if admitted:
            taken = set(admitted)
            self.waiting = deque(s for s in self.waiting if s not in taken)
        now = time.perf_counter()
        for seq in admitted:
            seq.started_at = now
            self.prefilling.append(seq)
            started(seq)

    def pick_prefill(self, awaiting_tier: Callable[[SequenceState], bool]) -> SequenceState | None:
        """The prompt whose next chunk runs now; None when none can run (nothing in
        prefill, or every prompt waits for a block a tier is reading)."""
        if not self.prefilling:
            return None
        # Two prompts about to compute the same chunk: only the earlier one does; the
        # other finds the block in the cache on its next turn.
        owner: dict[bytes, SequenceState] = {}
        for seq in sorted(self.prefilling, key=lambda s: s.arrival):
            if seq.caches is not None and seq.next_chunk < len(seq.chunks):
                owner.setdefault(seq.chunks[seq.next_chunk].key, seq)
        eligible = [
            s
            for s in self.prefilling
            if s.caches is None
            or s.next_chunk >= len(s.chunks)
            or (owner[s.chunks[s.next_chunk].key] is s and not awaiting_tier(s))
        ]
        if not eligible:
            return None
        tenants = dict.fromkeys(s.request.tenant for s in sorted(eligible, key=lambda s: s.arrival))
        if len(tenants) > 1:
            turn = prefill_order.next_tenant(tenants, self._tenant_served)
            eligible = [s for s in eligible if s.request.tenant == turn]
        candidates = [
            prefill_order.Candidate(s.remaining_prefill, s.skipped, s.arrival) for s in eligible
        ]
        config = self.config
        choice = eligible[
            prefill_order.pick(candidates, config.block_size, config.prefill_aging_picks)
        ]
        for seq in self.prefilling:
            if seq is not choice:
                seq.skipped += 1
        self._tenant_served[choice.request.tenant] = next(self._picks)
        present = {s.request.tenant for s in self.prefilling}
        for gone in [t for t in self._tenant_served if t not in present]:
            del self._tenant_served[gone]  # back later: not served since it arrived
        return choice

    def forget(self, seq: SequenceState) -> None:
        """`seq` left prefill, the waiting line and the idle list (finished)."""
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.idle:
            self.idle.remove(seq)

    def everything(self) -> list[SequenceState]:
        """Every sequence it holds (the engine stopping aborts them)."""
        return [*self.waiting, *self.prefilling, *self.inbox, *self.idle]
