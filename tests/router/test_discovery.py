"""Where the router's backends come from: WarmNodes in the cluster (kmock's emulator,
through a kubeconfig) and in a folder, with the admin tokens their Secrets hold; nodes
that come and go are seen on the next read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from kubeemu import RESOURCES, Emulator
from warmfleet_router.backend import BackendSpec
from warmfleet_router.discovery import ClusterSource, FolderSource, StaticSource

pytestmark = pytest.mark.asyncio
NODES = "/apis/warmfleet.io/v1alpha1/warmnodes"


def node(name: str, port: int, secret: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/"}
    if secret:
        spec["adminTokenSecretRef"] = {"name": secret, "key": "token", "namespace": "warmfleet"}
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmNode",
        "metadata": {"name": name, "labels": {"warmfleet.io/pool": "agents"}},
        "spec": spec,
    }


SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "daemon-token", "namespace": "warmfleet"},
    "stringData": {"token": "s3cret"},
}


async def test_cluster_source_lists_warmnodes_with_their_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Emulator() as emulator, kmock.Server(emulator):
        for key, info in RESOURCES.items():
            emulator.resources[key] = info
        url = str(emulator.url).rstrip("/")
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "kmock",
                    "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                    "users": [{"name": "kmock", "user": {}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}
                    ],
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        import httpx

        async with httpx.AsyncClient(base_url=url) as api:
            await api.post("/api/v1/namespaces/warmfleet/secrets", json=SECRET)
            await api.post(NODES, json=node("mac-1", 9001, "daemon-token"))
            source = ClusterSource(interval=1.0)
            try:
                assert await source.specs() == [
                    BackendSpec("mac-1", "http://127.0.0.1:9001", "s3cret")
                ]
                await api.post(NODES, json=node("mac-2", 9002))
                specs = await source.specs()
                assert [(s.name, s.token) for s in specs] == [("mac-1", "s3cret"), ("mac-2", None)]
                assert specs[1].labels == {"warmfleet.io/pool": "agents"}
                await api.delete(f"{NODES}/mac-1")
                assert [s.name for s in await source.specs()] == ["mac-2"]
            finally:
                await source.close()


async def test_folder_source_reads_the_operator_folder(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(
        yaml.safe_dump_all([SECRET, node("mac-1", 9001, "daemon-token"), node("mac-2", 9002)])
    )
    source = FolderSource(tmp_path, token="fallback")
    specs = await source.specs()
    assert [(s.name, s.url, s.token) for s in specs] == [
        ("mac-1", "http://127.0.0.1:9001", "s3cret"),
        ("mac-2", "http://127.0.0.1:9002", "fallback"),
    ]
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(node("mac-3", 9003)))
    assert [s.name for s in await source.specs()] == ["mac-3"]


async def test_bad_sources_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected http"):
        StaticSource(["mac-mini:8000"], None)
    with pytest.raises(ValueError, match="not a directory"):
        FolderSource(tmp_path / "missing")
