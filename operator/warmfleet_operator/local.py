"""Local mode: the same reconcile core, fed by a folder of YAML files (WarmNodes,
WarmPromptSets, ConfigMaps, Secrets) instead of the Kubernetes API, for fleets of Macs
without a cluster. Re-reads the folder when a file changes and on every resync; prints
status changes and writes all statuses to a JSON file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from warmfleet_common.crd import Node, SecretRef, SetKey
from warmfleet_common.folder import Folder, read_folder
from warmfleet_common.kube import SecretError
from warmfleet_operator.client import DaemonClient
from warmfleet_operator.reconcile import condition
from warmfleet_operator.service import Service

log = logging.getLogger(__name__)

START_GRACE_S = 60.0  # daemons started with the operator are still loading their models


class StatusNews:
    """Which status changes local mode prints: a node's reachability once it was first
    reached (or if it never is within START_GRACE_S), a set's Ready when it changes, but
    not the unreachable nodes and unready sets of daemons that are still starting."""

    def __init__(self, grace_s: float = START_GRACE_S) -> None:
        self._until = time.monotonic() + grace_s
        self._said_nodes: dict[str, bool] = {}
        self._said_sets: dict[str, tuple[object, object]] = {}

    def node(self, name: str, reachable: bool, error: str | None) -> None:
        said = self._said_nodes.get(name)
        if said is None and (reachable or self._starting()):
            if reachable:
                self._said_nodes[name] = True  # reached: no news while all is well
            return
        if said != reachable:
            self._said_nodes[name] = reachable
            detail = f" {error}" if error else ""
            print(f"WarmNode {name}: reachable={reachable}{detail}", flush=True)

    def warm_set(self, key: str, ready: Mapping[str, Any], nodes_warm: object) -> None:
        state = (ready.get("status"), ready.get("reason"))
        unready_at_start = ready.get("status") != "True" and self._starting()
        if state == self._said_sets.get(key) or unready_at_start:
            return
        self._said_sets[key] = state
        print(
            f"WarmPromptSet {key}: Ready={state[0]} {state[1]} ({nodes_warm} nodes warm) "
            f"{ready.get('message', '')}",
            flush=True,
        )

    def _starting(self) -> bool:
        return time.monotonic() < self._until


class FolderTokens:
    def __init__(self) -> None:
        self.folder = Folder()

    async def token(self, ref: SecretRef) -> str:
        namespace = ref.namespace or "default"
        data = self.folder.secrets.get((namespace, ref.name))
        if data is None or ref.key not in data:
            raise SecretError(
                f"admin token Secret {namespace}/{ref.name} (key {ref.key!r}) not in the folder",
                transient=False,
            )
        return data[ref.key]


async def run_local(
    directory: Path,
    *,
    resync: float = 30.0,
    status_file: Path | None = None,
    once: bool = False,
    stop: asyncio.Event | None = None,
    verify: ssl.SSLContext | bool = True,
) -> dict[str, Any]:
    """Reconcile the folder until `stop` (or once). Returns the last statuses. `verify`:
    what the daemons' certificates are verified with (`tls.client_verify`)."""
    tokens = FolderTokens()
    daemons = DaemonClient(tokens, verify=verify)
    service = Service(daemons, snapshot_max_age=resync)  # each pass probes first
    statuses: dict[str, Any] = {"warmNodes": {}, "warmPromptSets": {}}
    previous_sets: set[SetKey] = set()
    news = StatusNews(grace_s=0.0 if once else START_GRACE_S)
    stop = stop or asyncio.Event()
    try:
        while True:
            folder = read_folder(directory)
            tokens.folder = folder
            for error in folder.errors:
                log.warning("%s", error)
            statuses = await _pass(service, folder, statuses, previous_sets, news)
            previous_sets = set(folder.sets)
            if status_file is not None:
                _write_json(status_file, statuses)
            if once:
                return statuses
            await _wait_for_change(directory, resync, stop)
            if stop.is_set():
                return statuses
    finally:
        await daemons.close()


async def _pass(
    service: Service,
    folder: Folder,
    before: dict[str, Any],
    previous_sets: set[SetKey],
    news: StatusNews,
) -> dict[str, Any]:
    node_statuses: dict[str, Any] = {}
    nodes: list[Node] = []
    for name, doc in sorted(folder.nodes.items()):
        probe = await service.probe(Node.from_object(doc))
        node_statuses[name] = probe
        nodes.append(Node.from_object({**doc, "status": probe}))
        news.node(name, bool(probe.get("reachable")), probe.get("error"))
    set_statuses: dict[str, Any] = {}
    for key, doc in sorted(folder.sets.items(), key=lambda kv: str(kv[0])):
        old = before["warmPromptSets"].get(str(key))
        holders = [n for n, s in node_statuses.items() if str(key) in (s.get("warmSets") or [])]
        outcome = await service.reconcile(
            key,
            spec=doc.get("spec") or {},
            generation=folder.generations[key],
            nodes=nodes,
            configmaps=folder.configmaps,
            status=old,
            holders=holders,
            fresh=False,  # the probes just above said what every node holds
        )
        if outcome is None:  # an older file than the one last applied: keep that
            set_statuses[str(key)] = old
            continue
        set_statuses[str(key)] = outcome.status
        news.warm_set(
            str(key), condition(outcome.status, "Ready") or {}, outcome.status["warmNodes"]
        )
    for key in previous_sets - set(folder.sets):
        failed = await service.remove_everywhere(key, nodes)
        notes = [f"unreachable: {', '.join(failed.unreachable)}"] if failed.unreachable else []
        notes += [f"token refused: {', '.join(failed.refused)}"] if failed.refused else []
        print(
            f"WarmPromptSet {key}: removed" + (f" ({'; '.join(notes)})" if notes else ""),
            flush=True,
        )
    return {"warmNodes": node_statuses, "warmPromptSets": set_statuses}


async def _wait_for_change(directory: Path, resync: float, stop: asyncio.Event) -> None:
    """Until a YAML file is added, removed or modified, `resync` seconds pass, or stop."""
    start = _fingerprint(directory)
    deadline = asyncio.get_running_loop().time() + resync
    while asyncio.get_running_loop().time() < deadline and not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):  # poll the files twice a second
            await asyncio.wait_for(stop.wait(), timeout=0.5)
        if _fingerprint(directory) != start:
            return


def _fingerprint(directory: Path) -> list[tuple[str, float, int]]:
    out = []
    for path in sorted(directory.glob("*.y*ml")):
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((path.name, st.st_mtime, st.st_size))
    return out


def _write_json(path: Path, value: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".status-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def all_ready(statuses: dict[str, Any], keys: Iterable[str] | None = None) -> bool:
    sets = statuses.get("warmPromptSets") or {}
    names = list(keys) if keys is not None else list(sets)
    return bool(names) and all(
        (condition(sets.get(k) or {}, "Ready") or {}).get("status") == "True" for k in names
    )
