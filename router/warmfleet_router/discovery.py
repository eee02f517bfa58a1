"""Where backends come from: `--backend URL` flags, the WarmNodes of a folder (the one
`warmfleet operator --local` reads) or of the cluster. Folder and cluster are read again
every few seconds, so nodes come and go without a restart."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from warmfleet_operator.model import GROUP, VERSION, Node
from warmfleet_router.backend import BackendSpec

log = logging.getLogger(__name__)


class Source(Protocol):
    interval: float  # seconds between reads; 0: read once

    async def specs(self) -> list[BackendSpec]: ...

    async def close(self) -> None: ...


def name_of_url(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


class StaticSource:
    interval = 0.0

    def __init__(self, urls: Sequence[str], token: str | None) -> None:
        for url in urls:
            if urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"--backend {url!r}: expected http(s)://host:port")
        self._specs = [BackendSpec(name_of_url(u), u.rstrip("/"), token) for u in urls]

    async def specs(self) -> list[BackendSpec]:
        return list(self._specs)

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
        from warmfleet_operator.local import read_folder

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

    async def close(self) -> None:
        return None


class ClusterSource:
    """Every WarmNode in the cluster (kubeconfig, or the in-cluster service account)."""

    def __init__(
        self, interval: float = 5.0, namespace: str = "default", token: str | None = None
    ) -> None:
        import kopf

        from warmfleet_operator.client import KubeClient

        self.interval = interval
        self._token = token  # for nodes that name no Secret
        self._kube = KubeClient(default_namespace=namespace)
        settings = kopf.OperatorSettings()
        info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
            settings=settings
        )
        if info is None:
            raise ValueError("--from-cluster: no kubeconfig and no in-cluster service account")
        self._kube.configure_from(info)

    async def specs(self) -> list[BackendSpec]:
        from warmfleet_operator.client import DaemonError

        items: list[dict[str, Any]] = await self._kube.list_items(
            f"/apis/{GROUP}/{VERSION}/warmnodes"
        )
        out = []
        for item in items:
            node = Node.from_object(item)
            token = self._token
            if node.token_ref is not None:
                try:
                    token = await self._kube.token(node.token_ref)
                except DaemonError as exc:  # one unreadable Secret must not stop discovery
                    log.warning("WarmNode %s: %s; its admin routes are not used", node.name, exc)
                    token = None
            out.append(BackendSpec(node.name, node.url, token, node.labels))
        return out

    async def close(self) -> None:
        await self._kube.close()
