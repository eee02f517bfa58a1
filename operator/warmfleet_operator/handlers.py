"""kopf handlers: thin. Indices keep WarmNodes, ConfigMaps and WarmPromptSets in
memory (no API reads per reconcile); every handler hands over to `Service`; the `Prober`
follows the daemons between events, and every resync period each set is reconciled
again (drift repair). The command line's settings arrive in kopf's memo."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from warmfleet_common.crd import GROUP, VERSION, Node, SetKey
from warmfleet_common.kube import KubeClient
from warmfleet_common.tls import client_verify
from warmfleet_operator.client import DaemonClient
from warmfleet_operator.coalesce import Coalesced
from warmfleet_operator.config import OperatorConfig
from warmfleet_operator.diffbase import DigestDiffBase
from warmfleet_operator.objects import FINALIZER
from warmfleet_operator.prober import Prober
from warmfleet_operator.reconcile import changed, condition, referenced_configmaps
from warmfleet_operator.service import Service

log = logging.getLogger(__name__)
Logger = logging.Logger | logging.LoggerAdapter[Any]

RETARGET_DELAY = 0.5  # coalesce bursts of WarmNode changes into one pass
FOLLOW_DELAY = 0.05  # coalesce probe reports of several nodes into one pass per set


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
    settings.persistence.finalizer = FINALIZER
    settings.persistence.diffbase_storage = DigestDiffBase()
    # Progress in annotations only: the API server prunes status.kopf (not in the schema).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    # The command line's settings; the defaults when kopf was started without them.
    config = memo.config = getattr(memo, "config", None) or OperatorConfig()
    memo.kube = KubeClient(default_namespace=config.operator_namespace)
    memo.daemons = DaemonClient(memo.kube, verify=client_verify(config.tls))
    # Passes read what settled nodes hold from their recent probes (kept current by our
    # pushes); the prober flags any change it sees, so the snapshot may be a few periods
    # old, which a busy operator's probes can be, without asking every node again.
    memo.service = Service(memo.daemons, snapshot_max_age=max(30.0, 3 * config.probe_seconds))
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
        period=config.probe_seconds,
        fast=config.fast_probe_seconds,
    )
    memo.service.on_push = lambda node: memo.prober.poke(node.name)
    memo.prober_task = asyncio.create_task(memo.prober.run())
    memo.resync_task = asyncio.create_task(_resync(memo))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in (memo.prober_task, memo.resync_task):
        task.cancel()
    await asyncio.gather(memo.prober_task, memo.resync_task, return_exceptions=True)
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
    if retry < memo.config.delete_retries:
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
                await memo.kube.patch_set_status(key.namespace, key.name, status)


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


async def _resync(memo: kopf.Memo) -> None:
    """Drift repair, every resync period: a restarted daemon lost its sets, warm-ups
    progressed, a push failed earlier. Every set is reconciled; in-sync nodes are not
    even asked (their probes already said what they hold)."""
    while True:
        await asyncio.sleep(memo.config.resync_seconds)
        try:
            await _retarget(memo)
        except Exception:  # the next period tries again
            log.exception("drift repair failed")


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
                await memo.kube.patch_set_status(key.namespace, key.name, status)
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
