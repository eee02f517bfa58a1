"""One reconcile pass: observe the daemons, let the pure core decide, act, and
return the status to write. Used by the kopf handlers and by local mode alike."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmfleet_common.contract import WarmSetSpec, WarmSetStatus
from warmfleet_common.crd import Node, SecretRef, SetKey
from warmfleet_common.wire import StatusCache
from warmfleet_operator import learned, reconcile
from warmfleet_operator.client import DaemonClient, DaemonError
from warmfleet_operator.objects import InvalidSpec, Observation, Push, Remove
from warmfleet_operator.reconcile import ConfigMaps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    status: dict[str, Any]
    pushes: list[Push]  # attempted
    removes: list[Remove]
    invalid: InvalidSpec | None
    summary: str
    failed: dict[str, str] = field(default_factory=dict)  # node -> why its push failed

    @property
    def acted(self) -> bool:
        return bool(self.pushes or self.removes)


@dataclass(frozen=True)
class Removal:
    """Nodes a set could not be removed from: unreachable (worth retrying) or refusing
    our admin token (not worth retrying until the token is fixed)."""

    unreachable: list[str]
    refused: list[str]

    def __bool__(self) -> bool:
        return bool(self.unreachable or self.refused)


@dataclass
class Rejection:
    source_hash: str | None
    message: str
    attempts: int
    retry_at: float


class Service:
    def __init__(
        self,
        daemons: DaemonClient,
        *,
        snapshot_max_age: float = 0.0,
        rejection_backoff: float = 30.0,
        rejection_backoff_max: float = 900.0,
    ) -> None:
        """`snapshot_max_age`: how old a node's probe may be for a resync pass to read
        the sets it holds from it instead of asking the node again (0: always ask).
        A push a node rejected (4xx) is not repeated for the same content and the same
        daemon process before `rejection_backoff` (doubling up to the max)."""
        self.daemons = daemons
        self.held = HeldSets(snapshot_max_age)
        self.rejection_backoff = rejection_backoff
        self.rejection_backoff_max = rejection_backoff_max
        self._rejected: dict[tuple[str, SetKey], Rejection] = {}
        self._instances: dict[str, str] = {}  # node URL -> the daemon's instance id
        self.on_push: Callable[[Node], None] | None = None  # e.g. probe that node soon
        # One pass per set at a time (an edit, the resync timer, a node or ConfigMap
        # change may all fire at once), and the newest generation seen per set.
        self._locks: weakref.WeakValueDictionary[SetKey, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._newest: dict[SetKey, tuple[str | None, int]] = {}
        # A learning set's learned prompts as last read from its router (kept while the
        # router cannot be read).
        self._learned: dict[SetKey, learned.Learned] = {}

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
        taken, learn_error = (
            await self.learned_prompts(key, spec) if spec.get("learn") else (None, None)
        )
        try:
            desired: WarmSetSpec | None = reconcile.resolve(
                spec, key.namespace, generation, configmaps, uid, taken.prompts if taken else ()
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
            pushes = self._hold_back_rejected(key, desired, pushes, observations)
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
            learning=taken is not None,
        )
        if taken is not None:
            entries = learned.with_tokens(taken.status, observations.values())
            new_status.update(learnedPrompts=len(taken.prompts), learned=entries)
            if learn_error:
                new_status["learnError"] = learn_error[: reconcile.MAX_ERROR_CHARS]
        failed = {
            p.node.name: observations[p.node.name].error or "failed"
            for p in pushes
            if observations[p.node.name].error
        }
        return Outcome(
            new_status,
            pushes,
            removes,
            invalid,
            reconcile.describe(key, pushes, removes, failed),
            failed,
        )

    async def learned_prompts(
        self, key: SetKey, spec: Mapping[str, Any]
    ) -> tuple[learned.Learned, str | None]:
        """The learned prompts a learning set takes from its router now, and why they
        could not be read (then those read last time)."""
        learn = spec.get("learn") or {}
        router = learn.get("router") or {}
        ref = router.get("adminTokenSecretRef")
        try:
            listing = await self.daemons.learned(
                str(router.get("url") or ""),
                SecretRef.from_spec(ref) if ref else None,
                learned.tenant_of(spec),
            )
            taken = learned.select(spec, listing, time.time())
        except DaemonError as exc:
            # A router still starting (`warmfleet up` starts it after the operator) is no
            # news until it has answered once; the status says why either way.
            quiet = exc.unreachable and key not in self._learned
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "%s: the router's learned prompts: %s", key, exc.message)  # fmt: skip
            return self._learned.get(key, learned.Learned()), exc.message
        except (ValueError, TypeError, KeyError) as exc:  # a local-mode spec the CRD would refuse
            return learned.Learned(), f"spec.learn: {exc}"
        self._learned[key] = taken
        return taken, None

    def _hold_back_rejected(
        self,
        key: SetKey,
        desired: WarmSetSpec,
        pushes: list[Push],
        observations: dict[str, Observation],
    ) -> list[Push]:
        """Drop pushes of content a node already rejected, until their back-off ends;
        their observation carries the rejection, so status says why."""
        kept = []
        for push in pushes:
            rejection = self._rejected.get((push.node.url, key))
            if (
                rejection is not None
                and rejection.source_hash == desired.source_hash
                and time.monotonic() < rejection.retry_at
            ):
                seen = observations.get(push.node.name)
                observations[push.node.name] = Observation(
                    push.node.name,
                    True,
                    seen.status if seen else None,
                    rejection.message,
                    rejected=True,
                )
            else:
                kept.append(push)
        return kept

    async def observe(
        self, key: SetKey, nodes: Sequence[Node], *, fresh: bool = True
    ) -> dict[str, Observation]:
        results = await asyncio.gather(*(self._observe(key, n, fresh) for n in nodes))
        return {n.name: r for n, r in zip(nodes, results)}

    async def remove_everywhere(self, key: SetKey, nodes: Iterable[Node]) -> Removal:
        """Delete the set from these nodes; says which could not be reached and which
        refused our admin token."""
        self._newest.pop(key, None)
        nodes = list(nodes)
        for node in nodes:
            self._rejected.pop((node.url, key), None)
        return await self._remove(key, [Remove(n) for n in nodes])

    async def remove_from(self, key: SetKey, nodes: Iterable[Node]) -> Removal:
        """Delete the set from these nodes only (a WarmNode left): the set lives on."""
        return await self._remove(key, [Remove(n) for n in nodes])

    async def probe(self, node: Node) -> dict[str, Any]:
        """The WarmNode status, complete (no field is carried over from an older probe):
        reachable, model, instance, cache figures, the sets it holds; or why not."""
        stamp = now()
        try:
            status = await self.daemons.status(node)
        except DaemonError as exc:
            self.held.forget(node)
            message = exc.message[:1024]
            # Up but refusing us, or no token to send (then /healthz says if it is up).
            if exc.auth and (exc.sent or await self.daemons.healthy(node)):
                reason = "Unauthorized" if exc.sent else "TokenUnavailable"
                answered = "the daemon answered" if exc.sent else "the daemon answers /healthz"
                return {
                    "reachable": True,
                    "lastProbe": stamp,
                    "error": message,
                    "conditions": [
                        _condition("Reachable", True, "Answered", answered),
                        _condition("Authorized", False, reason, message),
                    ],
                }
            return {
                "reachable": False,
                "lastProbe": stamp,
                "error": message,
                "conditions": [_condition("Reachable", False, "Unreachable", message)],
            }
        instance = status.instance_id or ""
        if instance and self._instances.get(node.url) not in (None, instance):
            self.restarted(node)
        if instance:
            self._instances[node.url] = instance
        cache = status.cache or StatusCache()
        rate = cache.hit_rate
        warm_sets = status.warm_sets
        if warm_sets is not None:
            self.held.record(node, warm_sets)
        else:  # a reduced status (not authorized for the detail): ask set by set
            self.held.forget(node)
        result: dict[str, Any] = {
            "reachable": True,
            "lastProbe": stamp,
            "model": status.model.id if status.model is not None else None,
            "instanceId": instance or None,
            "startedAt": status.started_at,
            "cacheBytes": cache.bytes,
            "cacheBudgetBytes": cache.budget_bytes,
            "hitRate": round(rate, 4),
            "hitRatePercent": f"{rate * 100:.1f}%",
            "warmSets": (
                sorted(f"{s.namespace}/{s.name}" for s in warm_sets)
                if warm_sets is not None
                else None  # not shown to us: unknown, not empty
            ),
            "conditions": [
                _condition("Reachable", True, "Answered", "the daemon answered"),
                _condition("Authorized", True, "Accepted", "the daemon accepts the admin token"),
            ],
        }
        return {k: v for k, v in result.items() if v is not None}

    def restarted(self, node: Node) -> None:
        """A new daemon process: what it rejected before may pass now."""
        for url, key in list(self._rejected):
            if url == node.url:
                del self._rejected[(url, key)]

    async def _observe(self, key: SetKey, node: Node, fresh: bool) -> Observation:
        if not fresh:
            known, held = self.held.lookup(node, key)
            if known and (held is None or held.warm == held.total):
                return Observation(node.name, True, held)  # settled: nothing to follow
        try:
            held = await self.daemons.get_warm_set(node, key)
        except DaemonError as exc:
            return Observation(
                node.name, not exc.unreachable, None, exc.message, unauthorized=exc.auth
            )
        self.held.update(node, key, held)
        return Observation(node.name, True, held)

    async def _push(self, key: SetKey, pushes: Sequence[Push]) -> dict[str, Observation]:
        async def one(push: Push) -> Observation:
            try:
                status = await self.daemons.put_warm_set(
                    push.node, key, push.spec, peers=push.peers
                )
                self.held.update(push.node, key, status)
                self._rejected.pop((push.node.url, key), None)
                return Observation(push.node.name, True, status)
            except DaemonError as exc:
                log.warning("push of %s to %s failed: %s", key, push.node.name, exc.message)
                rejected = not exc.unreachable and not exc.auth
                if rejected:
                    self._reject(push, key, exc.message)
                return Observation(
                    push.node.name,
                    not exc.unreachable,
                    None,
                    exc.message,
                    rejected=rejected,
                    unauthorized=exc.auth,
                )

        results = await asyncio.gather(*(one(p) for p in pushes))
        if self.on_push is not None:
            for push in pushes:
                self.on_push(push.node)
        return {p.node.name: r for p, r in zip(pushes, results)}

    def _reject(self, push: Push, key: SetKey, message: str) -> None:
        before = self._rejected.get((push.node.url, key))
        same = before is not None and before.source_hash == push.spec.source_hash
        attempts = before.attempts + 1 if same and before is not None else 1
        delay = min(self.rejection_backoff * 2 ** (attempts - 1), self.rejection_backoff_max)
        self._rejected[(push.node.url, key)] = Rejection(
            push.spec.source_hash, message, attempts, time.monotonic() + delay
        )

    async def _remove(self, key: SetKey, removes: Sequence[Remove]) -> Removal:
        async def one(remove: Remove) -> DaemonError | None:
            try:
                await self.daemons.delete_warm_set(remove.node, key)
                self.held.update(remove.node, key, None)
                return None
            except DaemonError as exc:
                log.warning("removing %s from %s failed: %s", key, remove.node.name, exc.message)
                return exc

        results = await asyncio.gather(*(one(r) for r in removes))
        failed = [(r.node.name, e) for r, e in zip(removes, results) if e is not None]
        return Removal(
            unreachable=[name for name, e in failed if not e.auth],
            refused=[name for name, e in failed if e.auth],
        )


class HeldSets:
    """What each node held at its last probe (`/v1/status` lists every warm set with
    its generation and progress), kept current with our own pushes and deletes. Drift
    repair reads it instead of one GET per set and node: nodes, not sets x nodes."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._nodes: dict[str, tuple[float, dict[SetKey, WarmSetStatus]]] = {}
        # Per node, the sets whose state the last probe found different from what was
        # known (from the probe before, or our own pushes and deletes since).
        self.changed: dict[str, set[SetKey]] = {}

    def record(self, node: Node, warm_sets: Iterable[WarmSetStatus]) -> None:
        parsed = list(warm_sets)
        self.changed[node.url] = set()
        before = self._nodes.get(node.url, (0.0, {}))[1]
        held = {SetKey(s.namespace, s.name): s for s in parsed}
        self._nodes[node.url] = (time.monotonic(), held)
        self.changed[node.url] = {
            k for k in set(before) | set(held) if _progress(before.get(k)) != _progress(held.get(k))
        }

    def lookup(self, node: Node, key: SetKey) -> tuple[bool, WarmSetStatus | None]:
        """(known, status): known is False when there is no recent enough probe."""
        taken, held = self._nodes.get(node.url, (0.0, {}))
        if time.monotonic() - taken > self.max_age:
            return False, None
        return True, held.get(key)

    def sets(self, node: Node) -> dict[SetKey, WarmSetStatus]:
        """What the node held at its last probe (empty when unknown)."""
        return dict(self._nodes.get(node.url, (0.0, {}))[1])

    def update(self, node: Node, key: SetKey, status: WarmSetStatus | None) -> None:
        if node.url in self._nodes:
            held = self._nodes[node.url][1]
            if status is None:
                held.pop(key, None)
            else:
                held[key] = status

    def forget(self, node: Node) -> None:
        self._nodes.pop(node.url, None)
        self.changed.pop(node.url, None)


def _progress(status: WarmSetStatus | None) -> tuple[int, str | None, int, int] | None:
    return (
        None
        if status is None
        else (status.generation, status.source_hash, status.warm, status.total)
    )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    # lastProbe carries the heartbeat; conditions change only with their state.
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:1024],
    }
