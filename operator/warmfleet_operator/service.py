"""One reconcile pass: observe the daemons, let the pure core decide, act, and
return the status to write. Used by the kopf handlers and by local mode alike."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from warmfleet_daemon.contract import WarmSetSpec, WarmSetStatus
from warmfleet_operator import reconcile
from warmfleet_operator.client import DaemonClient, DaemonError
from warmfleet_operator.model import InvalidSpec, Node, Observation, Push, Remove, SetKey
from warmfleet_operator.reconcile import ConfigMaps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    status: dict[str, Any]
    pushes: list[Push]
    removes: list[Remove]
    invalid: InvalidSpec | None
    summary: str


class Service:
    def __init__(self, daemons: DaemonClient, *, snapshot_max_age: float = 0.0) -> None:
        """`snapshot_max_age`: how old a node's probe may be for a resync pass to read
        the sets it holds from it instead of asking the node again (0: always ask)."""
        self.daemons = daemons
        self.held = HeldSets(snapshot_max_age)
        # One pass per set at a time (an edit, the resync timer, a node or ConfigMap
        # change may all fire at once), and the newest generation seen per set.
        self._locks: weakref.WeakValueDictionary[SetKey, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._newest: dict[SetKey, tuple[str | None, int]] = {}

    async def reconcile(
        self,
        key: SetKey,
        *,
        spec: Mapping[str, Any],
        generation: int,
        nodes: Iterable[Node],
        configmaps: ConfigMaps,
        status: Mapping[str, Any] | None,
        holders: Iterable[str] = (),
        uid: str | None = None,
        fresh: bool = True,
    ) -> Outcome | None:
        """Bring every selected node in line with the set; return its new status, or
        None when a newer generation of the same object was reconciled meanwhile (this
        body is stale: writing its status would move observedGeneration backwards).
        `holders` are nodes known to hold the set (from their probes). `fresh=False`
        (drift repair) lets nodes' recent probes stand in for asking each one."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            newest_uid, newest = self._newest.get(key, (None, -1))
            if uid == newest_uid and generation < newest:
                return None
            self._newest[key] = (uid, generation)
            return await self._reconcile(
                key,
                spec=spec,
                generation=generation,
                nodes=nodes,
                configmaps=configmaps,
                status=status,
                holders=holders,
                uid=uid,
                fresh=fresh,
            )

    async def _reconcile(
        self,
        key: SetKey,
        *,
        spec: Mapping[str, Any],
        generation: int,
        nodes: Iterable[Node],
        configmaps: ConfigMaps,
        status: Mapping[str, Any] | None,
        holders: Iterable[str],
        uid: str | None,
        fresh: bool,
    ) -> Outcome:
        nodes = list(nodes)
        previous = status or {}
        try:
            desired: WarmSetSpec | None = reconcile.resolve(
                spec, key.namespace, generation, configmaps, uid
            )
            invalid = None
        except InvalidSpec as exc:
            desired, invalid = None, exc
        selected = reconcile.select_nodes(spec.get("nodeSelector"), nodes, spec.get("model"))
        observations = await self.observe(key, selected, fresh=fresh)
        pushes: list[Push] = []
        removes: list[Remove] = []
        if desired is not None:
            by_name = {n.name: n for n in nodes}
            had = {e["node"] for e in previous.get("nodes") or []} | set(holders)
            pushes, removes = reconcile.plan(
                desired, selected, observations, [by_name[n] for n in had if n in by_name]
            )
            observations.update(await self._push(key, pushes))
            await self._remove(key, removes)
        new_status = reconcile.set_status(
            generation=generation,
            selected=selected,
            observations=observations,
            desired=desired,
            invalid=invalid,
            previous=previous.get("conditions") or [],
            now=now(),
        )
        return Outcome(
            new_status, pushes, removes, invalid, reconcile.describe(key, pushes, removes)
        )

    async def observe(
        self, key: SetKey, nodes: Sequence[Node], *, fresh: bool = True
    ) -> dict[str, Observation]:
        results = await asyncio.gather(*(self._observe(key, n, fresh) for n in nodes))
        return {n.name: r for n, r in zip(nodes, results)}

    async def remove_everywhere(self, key: SetKey, nodes: Iterable[Node]) -> list[str]:
        """Delete the set from these nodes; returns the ones that could not be reached."""
        self._newest.pop(key, None)
        failed = await self._remove(key, [Remove(n) for n in nodes])
        return failed

    async def probe(self, node: Node) -> dict[str, Any]:
        """The WarmNode status: reachable, model, cache figures, the sets it holds."""
        stamp = now()
        try:
            status = await self.daemons.status(node)
        except DaemonError as exc:
            self.held.forget(node)
            return {
                "reachable": False,
                "lastProbe": stamp,
                "error": exc.message,
                "conditions": [_reachable_condition(False, exc.message)],
            }
        cache = status.get("cache") or {}
        rate = float(cache.get("hit_rate") or 0.0)
        sets = sorted(f"{s['namespace']}/{s['name']}" for s in status.get("warm_sets") or [])
        self.held.record(node, status.get("warm_sets") or [])
        return {
            "reachable": True,
            "lastProbe": stamp,
            "error": None,
            "model": (status.get("model") or {}).get("id"),
            "cacheBytes": int(cache.get("bytes") or 0),
            "cacheBudgetBytes": int(cache.get("budget_bytes") or 0),
            "hitRate": round(rate, 4),
            "hitRatePercent": f"{rate * 100:.1f}%",
            "warmSets": sets,
            "conditions": [_reachable_condition(True, "the daemon answered")],
        }

    async def _observe(self, key: SetKey, node: Node, fresh: bool) -> Observation:
        if not fresh:
            known, held = self.held.lookup(node, key)
            if known and (held is None or held.warm == held.total):
                return Observation(node.name, True, held)  # settled: nothing to follow
        try:
            held = await self.daemons.get_warm_set(node, key)
        except DaemonError as exc:
            return Observation(node.name, not exc.unreachable, None, exc.message)
        self.held.update(node, key, held)
        return Observation(node.name, True, held)

    async def _push(self, key: SetKey, pushes: Sequence[Push]) -> dict[str, Observation]:
        async def one(push: Push) -> Observation:
            try:
                status = await self.daemons.put_warm_set(push.node, key, push.spec)
                self.held.update(push.node, key, status)
                return Observation(push.node.name, True, status)
            except DaemonError as exc:
                log.warning("push of %s to %s failed: %s", key, push.node.name, exc.message)
                return Observation(push.node.name, not exc.unreachable, None, exc.message)

        results = await asyncio.gather(*(one(p) for p in pushes))
        return {p.node.name: r for p, r in zip(pushes, results)}

    async def _remove(self, key: SetKey, removes: Sequence[Remove]) -> list[str]:
        async def one(remove: Remove) -> str | None:
            try:
                await self.daemons.delete_warm_set(remove.node, key)
                self.held.update(remove.node, key, None)
                return None
            except DaemonError as exc:
                log.warning("removing %s from %s failed: %s", key, remove.node.name, exc.message)
                return remove.node.name

        results = await asyncio.gather(*(one(r) for r in removes))
        return [name for name in results if name is not None]


class HeldSets:
    """What each node held at its last probe (`/v1/status` lists every warm set with
    its generation and progress), kept current with our own pushes and deletes. Drift
    repair reads it instead of one GET per set and node: nodes, not sets x nodes."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._nodes: dict[str, tuple[float, dict[SetKey, WarmSetStatus]]] = {}

    def record(self, node: Node, warm_sets: Iterable[Mapping[str, Any]]) -> None:
        try:
            parsed = [WarmSetStatus.model_validate(s) for s in warm_sets]
        except ValidationError:  # a daemon of another version: ask it set by set
            self.forget(node)
            return
        held = {SetKey(s.namespace, s.name): s for s in parsed}
        self._nodes[node.url] = (time.monotonic(), held)

    def lookup(self, node: Node, key: SetKey) -> tuple[bool, WarmSetStatus | None]:
        """(known, status): known is False when there is no recent enough probe."""
        taken, held = self._nodes.get(node.url, (0.0, {}))
        if time.monotonic() - taken > self.max_age:
            return False, None
        return True, held.get(key)

    def update(self, node: Node, key: SetKey, status: WarmSetStatus | None) -> None:
        if node.url in self._nodes:
            held = self._nodes[node.url][1]
            if status is None:
                held.pop(key, None)
            else:
                held[key] = status

    def forget(self, node: Node) -> None:
        self._nodes.pop(node.url, None)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _reachable_condition(ok: bool, message: str) -> dict[str, Any]:
    # lastProbe carries the heartbeat; this condition changes only with reachability.
    return {
        "type": "Reachable",
        "status": "True" if ok else "False",
        "reason": "Answered" if ok else "Unreachable",
        "message": message[:1024],
    }
