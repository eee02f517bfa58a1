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
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from warmfleet_common.crd import Node, SecretRef, SetKey
from warmfleet_common.folder import Folder, read_folder
from warmfleet_common.kube import SecretError
from warmfleet_operator.client import DaemonClient
from warmfleet_operator.reconcile import condition
from warmfleet_operator.service import Service

log = logging.getLogger(__name__)


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
) -> dict[str, Any]:
    """Reconcile the folder until `stop` (or once). Returns the last statuses."""
    tokens = FolderTokens()
    daemons = DaemonClient(tokens)
    service = Service(daemons, snapshot_max_age=resync)  # each pass probes first
    statuses: dict[str, Any] = {"warmNodes": {}, "warmPromptSets": {}}
    previous_sets: set[SetKey] = set()
    stop = stop or asyncio.Event()
    try:
        while True:
            folder = read_folder(directory)
            tokens.folder = folder
            for error in folder.errors:
                log.warning("%s", error)
            statuses = await _pass(service, folder, statuses, previous_sets)
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
    service: Service, folder: Folder, before: dict[str, Any], previous_sets: set[SetKey]
) -> dict[str, Any]:
    node_statuses: dict[str, Any] = {}
    nodes: list[Node] = []
    for name, doc in sorted(folder.nodes.items()):
        probe = await service.probe(Node.from_object(doc))
        node_statuses[name] = probe
        nodes.append(Node.from_object({**doc, "status": probe}))
        if probe.get("reachable") != (before["warmNodes"].get(name) or {}).get("reachable"):
            detail = f" {probe['error']}" if probe.get("error") else ""
            print(f"WarmNode {name}: reachable={probe['reachable']}{detail}", flush=True)
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
        ready = condition(outcome.status, "Ready") or {}
        was = condition(old or {}, "Ready") or {}
        if (ready.get("status"), ready.get("reason")) != (was.get("status"), was.get("reason")):
            print(
                f"WarmPromptSet {key}: Ready={ready.get('status')} {ready.get('reason')} "
                f"({outcome.status['warmNodes']} nodes warm) {ready.get('message', '')}",
                flush=True,
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
