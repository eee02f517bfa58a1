"""kopf handlers: thin. Indices keep WarmNodes, ConfigMaps and WarmPromptSets in
memory (no API reads per reconcile); every handler hands over to `Service`, and the
`Prober` follows the daemons between events."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, cast

import kopf

from warmfleet_operator.client import DaemonClient, KubeClient
from warmfleet_operator.model import GROUP, VERSION, Node, SetKey
from warmfleet_operator.prober import Prober
from warmfleet_operator.reconcile import changed, condition, referenced_configmaps
from warmfleet_operator.service import Service

log = logging.getLogger(__name__)
Logger = logging.Logger | logging.LoggerAdapter[Any]

RESYNC_SECONDS = float(os.environ.get("WARMFLEET_RESYNC_SECONDS", "30"))
PROBE_SECONDS = float(os.environ.get("WARMFLEET_PROBE_SECONDS", "5"))
FAST_PROBE_SECONDS = min(0.5, PROBE_SECONDS)  # while warming, after a push, unreachable
DELETE_RETRIES = int(os.environ.get("WARMFLEET_DELETE_RETRIES", "5"))
RETARGET_DELAY = 0.5  # coalesce bursts of WarmNode changes into one pass
FOLLOW_DELAY = 0.05  # coalesce probe reports of several nodes into one pass per set


class DigestDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base as digests: kopf's default copies the whole spec into an
    annotation, which fails for specs over ~128 KiB (annotations total 256 KiB, and
    kubectl apply keeps a copy too). Handlers here read the new body, never `old` or
    `diff`, so a digest per section says all they need: whether it changed."""

    LEGACY = "kopf.zalando.org/last-handled-configuration"

    def __init__(self) -> None:
        super().__init__(prefix="warmfleet.io", key="last-handled-digest")

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        digests = super().fetch(body=body)
        if digests is None:
            return None
        current = _sections(self.build(body=body))
        old: dict[str, Any] = {}
        for path, digest in dict(digests).items():
            value = current.get(path)
            _put(old, path, value if _digest(value) == digest else {"digest": digest})
        return cast(kopf.BodyEssence, old)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        digests = {path: _digest(value) for path, value in _sections(essence).items()}
        super().store(body=body, patch=patch, essence=cast(kopf.BodyEssence, digests))
        if self.LEGACY in body.metadata.annotations:
            patch.metadata.annotations[self.LEGACY] = None  # the full copy it replaces


def _sections(essence: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level fields, and metadata's (labels, annotations) one by one."""
    out: dict[str, Any] = {}
    for key, value in essence.items():
        if key == "metadata" and isinstance(value, Mapping):
            out.update({f"metadata.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _put(target: dict[str, Any], path: str, value: Any) -> None:
    head, _, rest = path.partition(".")
    if rest:
        target.setdefault(head, {})[rest] = value
    else:
        target[head] = value


def _digest(value: Any) -> str:
    raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    warmnodes: kopf.Index[str, Any],
    warmpromptsets: kopf.Index[tuple[str, str], Any],
    configmaps: kopf.Index[tuple[str, str], Any],
    **_: Any,
) -> None:
    settings.peering.standalone = True  # one replica; no peering objects needed
    settings.posting.level = logging.WARNING  # Kubernetes events for warnings and errors
    settings.persistence.finalizer = "warmfleet.io/unwarm"
    settings.persistence.diffbase_storage = DigestDiffBase()
    # Progress in annotations only: the API server prunes status.kopf (not in the schema).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    # Secrets without a namespace: WARMFLEET_OPERATOR_NAMESPACE (the chart sets it to
    # the pod's namespace), else the namespace kopf logs in with.
    memo.kube = KubeClient(default_namespace=os.environ.get("WARMFLEET_OPERATOR_NAMESPACE"))
    memo.daemons = DaemonClient(memo.kube)
    # Passes read what settled nodes hold from their recent probes (kept current by our
    # pushes); the prober flags any change it sees, so the snapshot may be a few periods
    # old, which a busy operator's probes can be, without asking every node again.
    memo.service = Service(memo.daemons, snapshot_max_age=max(30.0, 3 * PROBE_SECONDS))
    memo.retarget = Coalesced(RETARGET_DELAY)
    memo.follow = Coalesced(FOLLOW_DELAY)
    memo.pending = set()  # sets to reconcile after probes saw them change
    # Index objects are live views: background passes read the current fleet from them.
    memo.indices = (warmpromptsets, warmnodes, configmaps)

    def nodes() -> Iterable[tuple[Node, Mapping[str, Any]]]:
        for item in _values(warmnodes):
            yield item["node"], item["status"]

    def on_change(node: Node, keys: set[SetKey] | None) -> None:
        memo.pending.update(keys if keys is not None else _set_keys(warmpromptsets))
        memo.follow.trigger(lambda: _follow(memo))

    memo.prober = Prober(
        memo.service,
        nodes=nodes,
        write_status=memo.kube.patch_node_status,
        on_change=on_change,
        period=PROBE_SECONDS,
        fast=FAST_PROBE_SECONDS,
    )
    memo.service.on_push = lambda node: memo.prober.poke(node.name)
    memo.prober_task = asyncio.create_task(memo.prober.run())


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.prober_task.cancel()
    await asyncio.gather(memo.prober_task, return_exceptions=True)
    await memo.retarget.close()
    await memo.follow.close()
    await memo.daemons.close()
    await memo.kube.close()


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kubeconfig (or in-cluster service account), shared with our Kubernetes client."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        memo.kube.configure_from(info)
    return info


# -- indices ------------------------------------------------------------------------


@kopf.index(GROUP, VERSION, "warmnodes")
def warmnodes(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    status = dict(body.get("status") or {})
    return {
        name: {
            "node": Node.from_object(dict(body)),
            "sets": status.get("warmSets") or [],
            "status": status,
        }
    }


@kopf.index("", "v1", "configmaps")
def configmaps(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], Any]:
    return {(namespace or "", name): dict(body.get("data") or {})}


@kopf.index(GROUP, VERSION, "warmpromptsets")
def warmpromptsets(
    namespace: str, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], Any]:
    return {(namespace or "", name): dict(body)}


# -- WarmPromptSets -------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "warmpromptsets")
@kopf.on.create(GROUP, VERSION, "warmpromptsets")
@kopf.on.update(GROUP, VERSION, "warmpromptsets", field="spec")
async def reconcile_set(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    warmnodes: kopf.Index[str, Any],
    configmaps: kopf.Index[tuple[str, str], Any],
    logger: Logger,
    **_: Any,
) -> None:
    key = SetKey(namespace or "", name)
    status = await _reconcile(memo, key, body, warmnodes, configmaps, logger)
    if status is not None:
        patch.status.update(status)


@kopf.timer(GROUP, VERSION, "warmpromptsets", interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync_set(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    warmnodes: kopf.Index[str, Any],
    configmaps: kopf.Index[tuple[str, str], Any],
    logger: Logger,
    **_: Any,
) -> None:
    """Drift repair: a restarted daemon lost its sets, warm-ups progressed, a push
    failed earlier. Idempotent, and in-sync nodes are not even asked: their probes
    already said what they hold."""
    key = SetKey(namespace or "", name)
    status = await _reconcile(memo, key, body, warmnodes, configmaps, logger, fresh=False)
    if status is not None:
        patch.status.update(status)


@kopf.on.delete(GROUP, VERSION, "warmpromptsets")
async def unwarm_set(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    retry: int,
    memo: kopf.Memo,
    warmnodes: kopf.Index[str, Any],
    logger: Logger,
    **_: Any,
) -> None:
    """Remove the set from every node that may hold it, then release the finalizer;
    after a bounded number of retries, release it anyway and say so in an event."""
    key = SetKey(namespace or "", name)
    named = {e["node"] for e in (body.get("status") or {}).get("nodes") or []}
    nodes = [
        item["node"]
        for item in _values(warmnodes)
        if item["node"].name in named or str(key) in item["sets"]
    ]
    failed = await memo.service.remove_everywhere(key, nodes)
    if not failed:
        logger.info("removed %s from %d node(s)", key, len(nodes))
        return
    if failed.refused:  # retrying will not fix a token: say so and let go at once
        kopf.warn(
            body,
            reason="Unauthorized",
            message="released without removing the set from "
            f"{', '.join(failed.refused)}: the daemon refused the admin token",
        )
    if not failed.unreachable:
        return
    if retry < DELETE_RETRIES:
        raise kopf.TemporaryError(
            f"cannot reach {', '.join(failed.unreachable)}; retrying", delay=min(2**retry, 30)
        )
    kopf.warn(
        body,
        reason="NodesUnreachable",
        message=f"released without removing the set from {', '.join(failed.unreachable)} "
        f"after {retry + 1} attempts",
    )


# -- reactions to other resources -----------------------------------------------------


@kopf.on.event("", "v1", "configmaps")
async def configmap_changed(
    type: str,
    namespace: str | None,
    name: str,
    memo: kopf.Memo,
    warmpromptsets: kopf.Index[tuple[str, str], Any],
    warmnodes: kopf.Index[str, Any],
    configmaps: kopf.Index[tuple[str, str], Any],
    logger: Logger,
    **_: Any,
) -> None:
    """A referenced ConfigMap changed: re-push the sets that use it now."""
    if not type:  # the initial listing, not a change
        return
    for wps in _values(warmpromptsets):
        meta = wps["metadata"]
        if meta["namespace"] == namespace and name in referenced_configmaps(wps.get("spec") or {}):
            key = SetKey(meta["namespace"], meta["name"])
            status = await _reconcile(memo, key, kopf.Body(wps), warmnodes, configmaps, logger)
            if status is not None:
                await memo.kube.patch_set_status(key, status)


@kopf.on.create(GROUP, VERSION, "warmnodes")
@kopf.on.update(GROUP, VERSION, "warmnodes", field="metadata.labels")
@kopf.on.update(GROUP, VERSION, "warmnodes", field="spec")
async def node_changed(memo: kopf.Memo, **_: Any) -> None:
    """A node joined or changed pools: re-target every set, once per burst. Nodes
    with a recent probe are not asked again (one label change would otherwise read
    every set from every node); new nodes have none yet and are asked."""
    memo.retarget.trigger(lambda: _retarget(memo))


def _deleted(type: str, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event(GROUP, VERSION, "warmnodes", when=_deleted)  # not a call per status write
async def node_deleted(body: kopf.Body, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    """A WarmNode is gone (no finalizer: deleting one never waits for the operator):
    unpin our sets on its daemon, then re-target, so statuses drop it."""
    node = Node.from_object(dict(body))
    held = set((body.get("status") or {}).get("warmSets") or []) | {
        str(k) for k in memo.service.held.sets(node)
    }
    ours = [k for k in _set_keys(memo.indices[0]) if str(k) in held]
    for key in ours:
        failed = await memo.service.remove_from(key, [node])
        if failed:
            logger.warning("WarmNode %s deleted; could not remove %s from it", node.name, key)
    if ours:
        logger.info("WarmNode %s deleted: removed %d set(s) from it", node.name, len(ours))
    memo.retarget.trigger(lambda: _retarget(memo))


# -- helpers --------------------------------------------------------------------------


class Coalesced:
    """Runs a pass once, `delay` after the first trigger of a burst, and once more if
    triggered while it ran. kopf gives each object a shallow copy of the memo, so this
    mutable holder is what the handlers of all WarmNodes share."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._pending = False
        self._task: asyncio.Task[None] | None = None

    def trigger(self, run: Callable[[], Awaitable[None]]) -> None:
        self._pending = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(run))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self, run: Callable[[], Awaitable[None]]) -> None:
        while self._pending:
            await asyncio.sleep(self.delay)
            self._pending = False
            await run()


async def _reconcile(
    memo: kopf.Memo,
    key: SetKey,
    body: kopf.Body,
    warmnodes: kopf.Index[str, Any],
    configmaps: kopf.Index[tuple[str, str], Any],
    logger: Logger,
    *,
    fresh: bool = True,
) -> dict[str, Any] | None:
    """The status to write, or None when there is nothing new to write: it differs
    only in heartbeats, or a newer generation was reconciled meanwhile."""
    nodes = [item["node"] for item in _values(warmnodes)]
    holders = [item["node"].name for item in _values(warmnodes) if str(key) in item["sets"]]
    maps = {k: next(iter(store)) for k, store in configmaps.items()}
    status = body.get("status") or {}
    meta = body.get("metadata") or {}
    outcome = await memo.service.reconcile(
        key,
        spec=body.get("spec") or {},
        generation=int(meta.get("generation") or 0),
        uid=meta.get("uid"),
        nodes=nodes,
        configmaps=maps,
        status=status,
        holders=holders,
        fresh=fresh,
    )
    if outcome is None:
        return None
    if outcome.invalid is not None:
        before = condition(status, "Degraded")
        if not before or before.get("reason") != outcome.invalid.reason:
            kopf.warn(body, reason=outcome.invalid.reason, message=outcome.invalid.message)
    if outcome.acted:
        logger.info(outcome.summary)
    return dict(outcome.status) if changed(status, outcome.status) else None


async def _retarget(memo: kopf.Memo) -> None:
    """Reconcile every set (drift-repair style: nodes with a recent probe are not asked)."""
    memo.pending.update(_set_keys(memo.indices[0]))
    await _follow(memo)


async def _follow(memo: kopf.Memo) -> None:
    """Reconcile the sets the probes (or a fleet change) flagged, and write their status."""
    warmpromptsets, warmnodes, configmaps = memo.indices

    async def one(key: SetKey) -> None:
        found = warmpromptsets.get((key.namespace, key.name))
        if not found:
            return
        wps = next(iter(found))
        if (wps.get("metadata") or {}).get("deletionTimestamp"):
            return  # the delete handler owns it now
        try:
            status = await _reconcile(
                memo, key, kopf.Body(wps), warmnodes, configmaps, log, fresh=False
            )
            if status is not None:
                await memo.kube.patch_set_status(key, status)
        except Exception:  # the resync timer tries again shortly
            log.exception("reconciling %s failed", key)

    while memo.pending:  # sets in parallel; daemon calls are bounded by the client
        keys = list(memo.pending)
        memo.pending.difference_update(keys)
        await asyncio.gather(*(one(k) for k in keys))


def _set_keys(warmpromptsets: kopf.Index[tuple[str, str], Any]) -> set[SetKey]:
    return {SetKey(ns, name) for ns, name in warmpromptsets}


def _values(index: kopf.Index[Any, Any]) -> Iterable[Any]:
    for store in index.values():
        yield from store
