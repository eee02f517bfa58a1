"""Follows every daemon's state: probes each WarmNode (GET /v1/status) on its own
schedule, writes its status, and says which sets changed on it, so that set statuses
follow within a probe period. One loop for the whole fleet rather than a kopf timer
per WarmNode: a timer makes kopf put a finalizer on every WarmNode, and deleting one
then hangs while the operator is down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from warmfleet_common.crd import Node, SetKey
from warmfleet_operator.reconcile import changed, condition
from warmfleet_operator.service import Service

log = logging.getLogger(__name__)

WriteStatus = Callable[[str, dict[str, Any]], Awaitable[None]]
# Which sets changed on a node: a set of keys, or None for all of them (restart,
# reachability or authorization changed).
OnChange = Callable[[Node, set[SetKey] | None], None]


@dataclass
class _NodeState:
    written: Mapping[str, Any]  # the status the WarmNode carries
    last: Mapping[str, Any]  # what the last probe found
    due: float = 0.0
    written_at: float = 0.0
    task: asyncio.Task[None] | None = None
    seen: bool = False  # probed by this process already


class Prober:
    def __init__(
        self,
        service: Service,
        *,
        nodes: Callable[[], Iterable[tuple[Node, Mapping[str, Any]]]],
        write_status: WriteStatus,
        on_change: OnChange,
        period: float = 5.0,
        fast: float = 0.5,
        tick: float = 0.1,
        min_write_interval: float = 2.0,
    ) -> None:
        """`nodes()`: the WarmNodes and the status each carries. A node is probed every
        `period`, and every `fast` while a warm-up runs on it, after a push to it, or
        while it cannot be reached (so a restart is seen at once)."""
        self.service = service
        self.nodes = nodes
        self.write_status = write_status
        self.on_change = on_change
        self.period = period
        self.fast = fast
        self.tick = tick
        # A warming node's figures change at every fast probe: its WarmNode status is
        # written at most this often (reachability and authorization at once).
        self.min_write_interval = min_write_interval
        self._states: dict[str, _NodeState] = {}
        self._wakeup = asyncio.Event()

    def poke(self, name: str) -> None:
        """Probe this node soon (a push just went to it)."""
        state = self._states.get(name)
        if state is not None:
            state.due = min(state.due, time.monotonic() + self.fast)
            self._wakeup.set()

    async def run(self) -> None:
        try:
            while True:
                self._schedule()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), self.tick)
                self._wakeup.clear()
        finally:
            tasks = [s.task for s in self._states.values() if s.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _schedule(self) -> None:
        now = time.monotonic()
        current = {node.name: (node, status) for node, status in self.nodes()}
        for name in set(self._states) - set(current):
            gone = self._states.pop(name)
            if gone.task is not None:
                gone.task.cancel()
        for name, (node, status) in current.items():
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = _NodeState(written=status, last=status)
            if (state.task is None or state.task.done()) and now >= state.due:
                state.task = asyncio.create_task(self._probe(node, state))

    async def _probe(self, node: Node, state: _NodeState) -> None:
        try:
            status = await self.service.probe(node)
            before, state.last = state.last, status
            keys = changed_sets(before, status, self.service.held.changed.get(node.url, set()))
            pending = changed(state.written, status)
            now = time.monotonic()
            # The first probe only sets the baseline: at start-up kopf's resume handlers
            # reconcile every set, and a new WarmNode re-targets them. Before the status
            # write, so a failed write cannot swallow the change.
            if state.seen and (keys is None or keys):
                self.on_change(node, keys)
            state.seen = True
            if pending and (keys is None or now - state.written_at >= self.min_write_interval):
                await self.write_status(node.name, status_patch(state.written, status))
                state.written, state.written_at, pending = status, now, False
            held = self.service.held.sets(node).values()
            busy = not status.get("reachable") or any(s.warm < s.total for s in held)
            busy = busy or pending  # an unwritten status goes out at a fast probe
        except Exception:  # the next probe tries again
            log.exception("probing %s failed", node.name)
            busy = True
        state.due = time.monotonic() + (self.fast if busy else self.period)


def status_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that makes the status exactly `after`: fields of an older probe
    that this one lacks (a model, warm sets of a node now unreachable) are removed."""
    return {**{k: None for k in before if k not in after}, **after}


def changed_sets(
    before: Mapping[str, Any], after: Mapping[str, Any], sets: set[SetKey]
) -> set[SetKey] | None:
    """The sets to reconcile after a probe: those whose state on the node changed
    (`sets`, beyond what our own pushes already told), or None for all of them when
    the node restarted, or its reachability or authorization changed."""
    for field_name in ("reachable", "instanceId"):
        if before.get(field_name) != after.get(field_name):
            return None
    if _authorized(before) != _authorized(after):
        return None
    return sets


def _authorized(status: Mapping[str, Any]) -> str | None:
    found = condition(status, "Authorized")
    return str(found.get("status")) if found is not None else None
