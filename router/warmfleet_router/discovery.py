"""Where backends come from: `--backend URL` flags, the WarmNodes of a folder (the one
`warmfleet operator --local` reads) or of the cluster. A source's `changes()` yields the
whole backend list each time it changes: the folder is read again every few seconds,
the cluster is watched (a WarmNode created, changed or deleted arrives within about a
second), so nodes come and go without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from warmfleet_common.crd import WARMNODES, Node
from warmfleet_common.folder import folder_stamp, read_folder
from warmfleet_common.kube import (
    KubeClient,
    LoginError,
    SecretError,
    WatchExpired,
    login,
)
from warmfleet_router.backend import BackendSpec

log = logging.getLogger(__name__)


class Source(Protocol):
    async def specs(self) -> list[BackendSpec]:
        """The backends now (one read)."""
        ...

    def changes(self) -> AsyncIterator[list[BackendSpec]]:
        """The backends, then again each time they change, until cancelled."""
        ...

    async def close(self) -> None: ...


def name_of_url(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


def _identity(specs: Iterable[BackendSpec]) -> list[tuple[str, str, str | None, list[Any]]]:
    """What a change is (labels too: BackendSpec's equality leaves them out)."""
    return [(s.name, s.url, s.token, sorted(s.labels.items())) for s in specs]


class StaticSource:
    def __init__(self, urls: Sequence[str], token: str | None) -> None:
        for url in urls:
            if urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"--backend {url!r}: expected http(s)://host:port")
        self._specs = [BackendSpec(name_of_url(u), u.rstrip("/"), token) for u in urls]

    async def specs(self) -> list[BackendSpec]:
        return list(self._specs)

    async def changes(self) -> AsyncIterator[list[BackendSpec]]:
        yield list(self._specs)
        await asyncio.Event().wait()  # never changes

    async def close(self) -> None:
        return None


class FolderSource:
    """WarmNodes (and the Secrets holding their admin tokens) in a folder of YAML files."""

    def __init__(self, directory: Path, interval: float = 2.0, token: str | None = None) -> None:
        if not directory.is_dir():
            raise ValueError(f"--local {directory}: not a directory")
        self.directory = directory
        self.interval = interval
        self._token = token  # for nodes that name no Secret

    async def specs(self) -> list[BackendSpec]:
        folder = read_folder(self.directory)
        out: list[BackendSpec] = []
        for doc in folder.nodes.values():
            node = Node.from_object(doc)
            token = self._token
            if node.token_ref is not None:
                ref = node.token_ref
                token = folder.secrets.get((ref.namespace or "default", ref.name), {}).get(ref.key)
            out.append(BackendSpec(node.name, node.url, token, node.labels))
        return out

    async def changes(self) -> AsyncIterator[list[BackendSpec]]:
        last: list[Any] | None = None
        logged: str | None = None
        stamp: tuple[tuple[str, int, int], ...] | None = None
        while True:
            if folder_stamp(self.directory) == stamp:  # nothing changed: nothing to parse
                await asyncio.sleep(self.interval)
                continue
            stamp = folder_stamp(self.directory)
            try:
                specs = await self.specs()
            except Exception as exc:  # a half-written or bad file: keep what we have
                if str(exc) != logged:  # once, not every interval
                    log.warning("backend discovery in %s failed: %s", self.directory, exc)
                    logged = str(exc)
            else:
                logged = None
                if _identity(specs) != last:
                    last = _identity(specs)
                    yield specs
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        return None


class ClusterSource:
    """Every WarmNode in the cluster (kubeconfig, or the in-cluster service account),
    listed, then watched from the list's resourceVersion; listed again when that
    version has expired (410) or the stream breaks, with backoff while the API server
    fails. Admin tokens are read from the nodes' Secrets when a node changes and every
    `token_interval` (a rotated token is picked up), each node on its own: an
    unreadable Secret costs only its node its admin routes."""

    def __init__(
        self,
        namespace: str = "default",
        token: str | None = None,
        *,
        token_interval: float = 30.0,
        watch_timeout: float = 300.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self._token = token  # for nodes that name no Secret
        self._token_interval = token_interval
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._kube = KubeClient(default_namespace=namespace)
        self._unreadable: dict[str, str] = {}  # node -> why its Secret could not be read
        self.errors = 0  # failed lists and watches (bad answers included)
        self._logged: str | None = None
        self._bad_nodes: set[str] = set()
        try:
            self._kube.configure_from(login(in_cluster_first=True))
        except LoginError as exc:
            raise ValueError(f"--from-cluster: {exc}") from exc

    async def specs(self) -> list[BackendSpec]:
        items, _ = await self._kube.list_versioned(WARMNODES)
        return await self._resolve(items)

    async def changes(self) -> AsyncIterator[list[BackendSpec]]:
        nodes: dict[str, dict[str, Any]] = {}
        changed = asyncio.Event()
        watcher = asyncio.create_task(self._watch(nodes, changed), name="warmnodes-watch")
        last: list[Any] | None = None
        try:
            while True:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), self._token_interval)
                if watcher.done():
                    watcher.result()  # a bug in the watch: raise it rather than go stale
                if last is None and not changed.is_set():
                    continue  # not listed yet: nothing known, nothing to say
                changed.clear()
                specs = await self._resolve(list(nodes.values()))
                if _identity(specs) != last:
                    last = _identity(specs)
                    yield specs
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self, nodes: dict[str, dict[str, Any]], changed: asyncio.Event) -> None:
        """Keep `nodes` (name -> WarmNode) equal to the cluster's; set `changed`."""
        delay = self._backoff[0]
        while True:
            try:
                items, version = await self._kube.list_versioned(WARMNODES)
                nodes.clear()
                nodes.update({_name(item): item for item in items})
                changed.set()
                while True:  # until the stream breaks or the version expires
                    # Spread the watches' ends, as client-go does.
                    timeout = self._watch_timeout * random.uniform(0.8, 1.0)
                    began = asyncio.get_running_loop().time()
                    async for event in self._kube.watch(WARMNODES, version, timeout):
                        version = _version(event) or version
                        if event.get("type") == "BOOKMARK":
                            continue
                        obj = event.get("object") or {}
                        if event.get("type") == "DELETED":
                            nodes.pop(_name(obj), None)
                        else:  # ADDED, MODIFIED
                            nodes[_name(obj)] = obj
                        changed.set()
                        delay = self._backoff[0]
                        self._logged = None
                    # The server ended the watch (its timeout): resume where it stopped;
                    # not in a tight loop if it ends them at once.
                    if asyncio.get_running_loop().time() - began < 1.0:
                        await asyncio.sleep(1.0)
            except WatchExpired as exc:
                log.info("WarmNodes watch: %s; listing again", exc)
            except Exception as exc:  # any answer or event, however malformed: list again
                self.errors += 1
                kind = type(exc).__name__
                if kind != self._logged:  # once per kind of trouble, not at every retry
                    self._logged = kind
                    log.warning(
                        "WarmNodes watch failed (%s: %s); listing again with backoff "
                        "(logged once per kind)",
                        kind,
                        exc,
                    )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self._backoff[1])

    async def _resolve(self, items: Sequence[dict[str, Any]]) -> list[BackendSpec]:
        out = []
        for item in items:
            try:
                node = Node.from_object(item)
            except Exception as exc:  # one malformed WarmNode costs only itself
                self.errors += 1
                if str(exc) not in self._bad_nodes:  # once, not at every resolve
                    self._bad_nodes.add(str(exc))
                    log.warning("a WarmNode that cannot be read is left out: %s", exc)
                continue
            token = self._token
            if node.token_ref is not None:
                try:
                    token = await self._kube.token(node.token_ref)
                    self._unreadable.pop(node.name, None)
                except SecretError as exc:  # one unreadable Secret must not stop discovery
                    if self._unreadable.get(node.name) != str(exc):
                        log.warning("WarmNode %s: %s; no admin routes for it", node.name, exc)
                    self._unreadable[node.name] = str(exc)
                    token = None
            out.append(BackendSpec(node.name, node.url, token, node.labels))
        return sorted(out, key=lambda s: s.name)

    async def close(self) -> None:
        await self._kube.close()


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _version(event: dict[str, Any]) -> str | None:
    meta = (event.get("object") or {}).get("metadata") or {}
    version = meta.get("resourceVersion")
    return str(version) if version else None
