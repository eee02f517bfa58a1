"""The drain handoff's orchestration (the mechanics, one pull per session, are
`warmfleet_router.handoff`): when a backend drains (its `/readyz` says `draining`, or it
leaves the fleet while it holds hot sessions), a task per backend asks the backend each
of its hottest sessions goes to next, by the policy, to copy that session's blocks, then
removes the backend if it is leaving. Membership's `Departures`; the recent handoffs are
kept for the status."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

import httpx

from warmfleet_router.backend import Backend
from warmfleet_router.handoff import HotSession, HotSessions, hand_off
from warmfleet_router.membership import Membership
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.options import RouterOptions
from warmfleet_router.planning import Planner, scored
from warmfleet_router.policy import RoutingRequest
from warmfleet_router.sessions import SessionDigest

log = logging.getLogger(__name__)

RECENT_HANDOFFS = 100


class DrainHandoffs:
    def __init__(
        self,
        options: RouterOptions,
        client: httpx.AsyncClient,
        metrics: RouterMetrics,
        members: Membership,
        planner: Planner,
        hot: HotSessions,
        session_digest: SessionDigest,
    ) -> None:
        self.options = options
        self.client = client
        self.metrics = metrics
        self.members = members
        self.planner = planner
        self.hot = hot
        self._session_digest = session_digest
        self._tasks: dict[str, asyncio.Task[None]] = {}  # per draining backend
        self.handoffs: deque[dict[str, Any]] = deque(maxlen=RECENT_HANDOFFS)

    # -- membership's Departures ----------------------------------------------------

    def wants(self, backend: Backend) -> bool:
        reachable = backend.health in ("ready", "draining")
        return (
            reachable and self.options.handoff_sessions > 0 and bool(self.hot.on(backend.name, 1))
        )

    def start(self, backend: Backend) -> None:
        if backend.name not in self._tasks:
            task = asyncio.create_task(self._hand_off(backend), name=f"handoff-{backend.name}")
            self._tasks[backend.name] = task

    def draining(self, backend: Backend) -> None:
        """Its /readyz says draining (a SIGTERM): hand its hottest sessions off while it
        still serves its blocks."""
        if self.options.handoff_sessions > 0:
            self.start(backend)

    def cancel(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None and task is not asyncio.current_task():  # (it removes itself)
            task.cancel()

    def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()

    # -- the handoff ------------------------------------------------------------------

    async def _hand_off(self, draining: Backend) -> None:
        sessions = self.hot.on(draining.name, self.options.handoff_sessions)
        started = time.monotonic()
        try:
            outcomes = await hand_off(
                self.client,
                draining,
                sessions,
                lambda s: self._next_backend(s, draining),
                self.options.handoff_seconds,
            )
            for o in outcomes:
                self.metrics.handoff(draining, o.outcome)
                if o.outcome == "copied" and o.target is not None:
                    self.hot.moved(o.session, o.target)
                else:
                    log.info(
                        "handoff of a session from %s: %s (%s)", draining.name, o.outcome, o.detail
                    )
            copied = [o for o in outcomes if o.outcome == "copied"]
            log.info(
                "backend %s drains: %d of %d hot session(s) copied to the backends they go to "
                "next (%d tokens) in %.1fs",
                draining.name,
                len(copied),
                len(outcomes),
                sum(o.copied_tokens for o in outcomes),
                time.monotonic() - started,
            )
            self.handoffs.append(
                {
                    "time": time.time(),
                    "backend": draining.name,
                    "seconds": round(time.monotonic() - started, 3),
                    "sessions": [
                        {
                            "session": self._session_digest(o.session),
                            "to": o.target,
                            "outcome": o.outcome,
                            "detail": o.detail,
                            "copied_tokens": o.copied_tokens,
                        }
                        for o in outcomes
                    ],
                }
            )
        except Exception:  # never take the router down: the sessions just prefill
            log.exception("the handoff of %s failed", draining.name)
        finally:
            if draining.leaving and self.members.backends.get(draining.name) is draining:
                await self.members.remove(draining.name)
            elif self._tasks.get(draining.name) is asyncio.current_task():
                del self._tasks[draining.name]

    def _next_backend(self, session: HotSession, draining: Backend) -> Backend | None:
        """Where the policy sends the session's next request now that `draining` takes
        none: among ready backends with its layout (the blocks' keys are theirs too)."""
        ready = [
            b
            for b in self.members.usable()
            if b.name != draining.name and b.fingerprint == draining.fingerprint
        ]
        if not ready or draining.fingerprint is None:
            return None
        index = self.members.index
        candidates = [scored(b, index.predict_tiers(b.name, session.blocks)) for b in ready]
        request = RoutingRequest(
            tie_key=session.key.encode(), affinity=session.key, turn=self.planner.next_turn()
        )
        return self.members.backends.get(self.planner.policy.decide(candidates, request).backend)
