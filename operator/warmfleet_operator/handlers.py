"""kopf handlers: thin. Indices keep WarmNodes, ConfigMaps and WarmPromptSets in
memory (no API reads per reconcile); every handler hands over to `Service`."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import kopf

from warmfleet_operator.client import DaemonClient, KubeClient
from warmfleet_operator.model import GROUP, VERSION, Node, SetKey
from warmfleet_operator.reconcile import changed, condition, referenced_configmaps
from warmfleet_operator.service import Service

log = logging.getLogger(__name__)
Logger = logging.Logger | logging.LoggerAdapter[Any]

RESYNC_SECONDS = float(os.environ.get("WARMFLEET_RESYNC_SECONDS", "30"))
PROBE_SECONDS = float(os.environ.get("WARMFLEET_PROBE_SECONDS", "30"))
DELETE_RETRIES = int(os.environ.get("WARMFLEET_DELETE_RETRIES", "5"))
RETARGET_DELAY = 0.5  # coalesce bursts of WarmNode changes into one pass


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.peering.standalone = True  # one replica; no peering objects needed
    settings.posting.level = logging.WARNING  # Kubernetes events for warnings and errors
    settings.persistence.finalizer = "warmfleet.io/unwarm"
    memo.kube = KubeClient(
        default_namespace=os.environ.get("WARMFLEET_OPERATOR_NAMESPACE", "default")
    )
    memo.daemons = DaemonClient(memo.kube)
    # A resync may read what nodes hold from their last two probes.
    memo.service = Service(memo.daemons, snapshot_max_age=2 * PROBE_SECONDS)
    memo.retarget = Coalesced(RETARGET_DELAY)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.retarget.close()
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
    return {
        name: {
            "node": Node.from_object(dict(body)),
            "sets": (body.get("status") or {}).get("warmSets") or [],
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
    if retry < DELETE_RETRIES:
        raise kopf.TemporaryError(
            f"cannot reach {', '.join(failed)}; retrying", delay=min(2**retry, 30)
        )
    kopf.warn(
        body,
        reason="NodesUnreachable",
        message=f"released without removing the set from {', '.join(failed)} "
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
async def node_changed(
    memo: kopf.Memo,
    warmpromptsets: kopf.Index[tuple[str, str], Any],
    warmnodes: kopf.Index[str, Any],
    configmaps: kopf.Index[tuple[str, str], Any],
    logger: Logger,
    **_: Any,
) -> None:
    """A node joined or changed pools: re-target every set, once per burst. Nodes
    with a recent probe are not asked again (one label change would otherwise read
    every set from every node); new nodes have none yet and are asked."""

    async def retarget() -> None:
        for wps in _values(warmpromptsets):
            meta = wps["metadata"]
            key = SetKey(meta["namespace"], meta["name"])
            body = kopf.Body(wps)
            try:
                status = await _reconcile(
                    memo, key, body, warmnodes, configmaps, logger, fresh=False
                )
                if status is not None:
                    await memo.kube.patch_set_status(key, status)
            except Exception:  # the resync timer tries again shortly
                logger.exception("re-targeting %s failed", key)

    memo.retarget.trigger(retarget)


@kopf.timer(GROUP, VERSION, "warmnodes", interval=PROBE_SECONDS)
async def probe_node(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    status = await memo.service.probe(Node.from_object(dict(body)))
    if changed(body.get("status") or {}, status):
        patch.status.update(status)


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
    if outcome.pushes or outcome.removes:
        logger.info(outcome.summary)
    return dict(outcome.status) if changed(status, outcome.status) else None


def _values(index: kopf.Index[Any, Any]) -> Iterable[Any]:
    for store in index.values():
        yield from store
