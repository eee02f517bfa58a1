"""Simulated time: spent as wall-clock sleep `speed` times faster, and measured against it.

The engine thread charges each prefill chunk and decode step the profiled Mac's seconds.
While the engine is busy the clock keeps a wall-clock deadline, anchored where the busy
period started: the anchor plus every second charged since, divided by the speed. Each
charge sleeps until that deadline, not for a duration, so the time the daemon spends
between sleeps (its own Python, which the profile's measured rates already include) and
the sleeps' overshoot are absorbed by the next sleeps, as long as the machine keeps up.

When it does not (a hundred simulated daemons on two cores, at 24x), the deadline passes
and stays passed: every time the daemon reports comes out inflated. The clock says by
how much it ran late (`stats()`, in `/v1/status` and the metrics; a warning in the log),
so that a replay's figures are never silently wrong.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

WARN_WINDOW_S = 60.0  # wall seconds: the share is checked, and warned of, once per window
WARN_SHARE = 0.10  # behind / spent over a window past which the figures are called inflated
CATCH_UP_S = 0.01  # wall seconds behind the deadline the engine may still catch up


@dataclass(frozen=True)
class SimClockStats:
    """In the profiled Mac's seconds. `behind_share` = behind_s / spent_s (0 before any):
    how much longer than the Mac every time the daemon reports may be."""

    speed: float  # --sim-speed
    spent_s: float  # charged: what the profiled Mac would have taken
    behind_s: float  # how late the engine ran beyond what it charged, not caught up
    behind_share: float


class WarningGate:
    """At most one warning per `every_s` (wall) for all the clocks sharing it: the fifty
    simulated daemons of a process share one, so a saturated process logs one line a
    minute, not fifty."""

    def __init__(self, every_s: float = WARN_WINDOW_S) -> None:
        self.every_s = every_s
        self._last: float | None = None
        self._lock = threading.Lock()

    def open(self, now: float) -> bool:
        with self._lock:
            if self._last is not None and now - self._last < self.every_s:
                return False
            self._last = now
            return True


_process_gate = WarningGate()


class SimClock:
    """Spends simulated seconds as wall-clock sleep, `speed` times faster, against a
    deadline: a busy period's anchor plus what it charged, divided by the speed.

    A charge sleeps until the deadline, and only when that is at least `quantum_s` (wall)
    away: at 24x a decode step is a third of a millisecond, and fifty engine threads
    waking that often starved the process's event loop (the time spent is the same; an
    event is early by at most the quantum).

    The engine brackets each step with `step_started()` and `step_ended(busy)`. A busy
    period opens with the first busy step (the deadline anchored at its start, or where
    the last period's charges were due if that is later: a remainder under the quantum
    is not forgiven) and closes with a step that found nothing to do, so the time spent
    idle, waiting for requests, is neither owed nor banked.

    Late past the deadline (wall), the engine catches up: the next charges sleep less, or
    not at all, and nothing is lost. `behind_s` (in the profiled Mac's seconds, x speed)
    counts what is not caught up: at a charge, lateness that the charge did not cover and
    that exceeds `catch_up_s` is given up (the deadline moves to `catch_up_s` before now,
    so a stall is not followed by a burst of steps that skip their sleeps); when the
    period closes, whatever lateness its last busy step ended with. A period's `behind_s`
    is thus its wall time x speed beyond what it charged, once it ended late, and it is
    counted as it goes: it never decreases (a Prometheus counter), and what is not
    counted yet is at most `catch_up_s` and the time since the last charge.

    `timer` and `sleep` are the wall clock's (tests inject fakes); `spend` and the step
    brackets run on the engine thread, `stats()` anywhere."""

    def __init__(
        self,
        speed: float,
        quantum_s: float = 0.001,
        *,
        catch_up_s: float = CATCH_UP_S,
        timer: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        warn_window_s: float = WARN_WINDOW_S,
        warn_share: float = WARN_SHARE,
        gate: WarningGate | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError("the simulation speed must be positive")
        self.speed = speed
        self.quantum_s = quantum_s
        self.catch_up_s = catch_up_s
        self.spent_s = 0.0  # simulated seconds spent so far
        self.behind_s = 0.0  # simulated seconds run late and not caught up, so far
        self._timer = timer
        self._sleep = sleep
        # The busy period's deadline (wall; None while idle); where the last one's was.
        self._deadline: float | None = None
        self._free_at = -math.inf
        self._step_at: float | None = None  # when the step under way started
        self._late = 0.0  # wall: how far past the deadline the last busy step ended
        # The warning's window: since when, and the totals then.
        self.warn_window_s = warn_window_s
        self.warn_share = warn_share
        self._gate = gate if gate is not None else _process_gate
        self._window_at: float | None = None
        self._window_spent = 0.0
        self._window_behind = 0.0

    def spend(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self.spent_s += seconds
        now = self._timer()
        start = self._step_at if self._step_at is not None else now
        deadline = self._open(start) + seconds / self.speed
        late = now - deadline
        if late > self.catch_up_s:  # more than can be caught up: given up, counted
            self.behind_s += (late - self.catch_up_s) * self.speed
            deadline = now - self.catch_up_s
        self._deadline = deadline
        ahead = deadline - now
        if ahead > 0 and ahead >= self.quantum_s:
            self._sleep(ahead)

    def step_started(self) -> None:
        self._step_at = self._timer()

    def step_ended(self, busy: bool) -> None:
        """`busy`: the step did work. One that found nothing to do closes the busy period
        (its own time is not measured)."""
        started, self._step_at = self._step_at, None
        if not busy:
            if self._deadline is not None:  # the period ends as late as its last step
                self.behind_s += max(self._late, 0.0) * self.speed
                self._free_at, self._deadline, self._late = self._deadline, None, 0.0
            return
        if started is None:
            return
        now = self._timer()
        self._late = now - self._open(started)  # opened here if the step charged nothing
        self._check(now)

    def _open(self, start: float) -> float:
        """The busy period's deadline; if there is none, one opens at `start` (the step's,
        or the charge's outside a step), or where the last period's charges were due if
        that is later."""
        if self._deadline is None:
            self._deadline = max(start, self._free_at)
        return self._deadline

    def stats(self) -> SimClockStats:
        spent, behind = self.spent_s, self.behind_s
        return SimClockStats(self.speed, spent, behind, behind / spent if spent > 0 else 0.0)

    def _check(self, now: float) -> None:
        """Once a window has passed: warn if the engine ran late by more than
        `warn_share` of what it charged during it."""
        if self._window_at is None:
            self._window_at, self._window_spent, self._window_behind = now, 0.0, 0.0
        window = now - self._window_at
        if window < self.warn_window_s:
            return
        spent = self.spent_s - self._window_spent
        behind = self.behind_s - self._window_behind
        self._window_at, self._window_spent, self._window_behind = now, self.spent_s, self.behind_s
        if spent > 0 and behind / spent > self.warn_share and self._gate.open(now):
            log.warning(
                "The simulated engine ran %.0f%% behind the time it charged over the last "
                "%.0fs (%.1f simulated s late for %.1f s charged, at %gx): every time this "
                "daemon reports (TTFT, durations) is inflated by as much. Lower --sim-speed "
                "or the simulated daemons per core (--nodes, --sim-per-process)",
                100 * behind / spent,
                window,
                behind,
                spent,
                self.speed,
            )
