"""Where the router's backends come from: WarmNodes in the cluster (kmock's emulator,
through a kubeconfig: listed, then watched) and in a folder, with the admin tokens their
Secrets hold; nodes that come and go are seen as they do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from support.kubeemu import Cluster, emulated, wait_for
from warmfleet_router import discovery
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


@pytest_asyncio.fixture
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """The emulator, with a kubeconfig for it in KUBECONFIG."""
    async with emulated(tmp_path) as (cluster, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        yield cluster


async def next_change(changes: AsyncIterator[list[BackendSpec]], within: float = 1.5) -> Any:
    """The next backend list, which must come within `within` seconds (a watch, not a poll)."""
    specs = await asyncio.wait_for(anext(changes), within)
    return [(s.name, s.url, s.token, s.labels) for s in specs]


async def test_cluster_source_lists_warmnodes_with_their_tokens(api: Cluster) -> None:
    await api.api.post("/api/v1/namespaces/warmfleet/secrets", json=SECRET)
    await api.api.post(NODES, json=node("mac-1", 9001, "daemon-token"))
    source = ClusterSource()
    try:
        assert await source.specs() == [BackendSpec("mac-1", "http://127.0.0.1:9001", "s3cret")]
        await api.api.post(NODES, json=node("mac-2", 9002))
        specs = await source.specs()
        assert [(s.name, s.token) for s in specs] == [("mac-1", "s3cret"), ("mac-2", None)]
        assert specs[1].labels == {"warmfleet.io/pool": "agents"}
        await api.api.delete(f"{NODES}/mac-1")
        assert [s.name for s in await source.specs()] == ["mac-2"]
    finally:
        await source.close()


async def test_cluster_source_watches_warmnodes_come_change_and_go(api: Cluster) -> None:
    """Every change arrives as it happens (well within the old 5 s poll), each node
    with its own token: an unreadable Secret costs only its node its token."""
    await api.api.post("/api/v1/namespaces/warmfleet/secrets", json=SECRET)
    await api.api.post(NODES, json=node("mac-1", 9001, "daemon-token"))
    source = ClusterSource(token="fallback", token_interval=60.0)
    changes = source.changes()
    pool = {"warmfleet.io/pool": "agents"}
    try:
        assert await next_change(changes) == [("mac-1", "http://127.0.0.1:9001", "s3cret", pool)]
        await api.api.post(NODES, json=node("mac-2", 9002, "missing-secret"))
        assert await next_change(changes) == [
            ("mac-1", "http://127.0.0.1:9001", "s3cret", pool),
            ("mac-2", "http://127.0.0.1:9002", None, pool),
        ]
        await api.api.patch(
            f"{NODES}/mac-2",
            json={"metadata": {"labels": {"warmfleet.io/pool": "batch"}}, "spec": {"url": "http://127.0.0.1:9012"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        assert (await next_change(changes))[1] == (
            "mac-2", "http://127.0.0.1:9012", None, {"warmfleet.io/pool": "batch"}
        )  # fmt: skip
        await api.api.post(NODES, json=node("mac-3", 9003))
        assert [n[:3] for n in await next_change(changes)][2] == (
            "mac-3", "http://127.0.0.1:9003", "fallback"
        )  # fmt: skip
        await api.api.delete(f"{NODES}/mac-1")
        assert [n[0] for n in await next_change(changes)] == ["mac-2", "mac-3"]
    finally:
        await changes.aclose()
        await source.close()


async def test_cluster_source_lists_again_when_its_version_expired(api: Cluster) -> None:
    """The server ends the watch (its timeout) and its history is compacted meanwhile:
    resuming gets 410 Expired, so the source lists again, then watches from there."""
    for name, port in (("mac-1", 9001), ("mac-2", 9002)):
        await api.api.post(NODES, json=node(name, port))
    source = ClusterSource(watch_timeout=1.0)
    changes = source.changes()
    try:
        assert [n[0] for n in await next_change(changes)] == ["mac-1", "mac-2"]
        await api.api.post("/api/v1/namespaces/warmfleet/secrets", json=SECRET)
        api.emulator.compact()  # the WarmNodes' last version is now older than the history
        await wait_for(lambda: _true(api.emulator.expired_watches > 0), 5.0, "a 410 answer")
        await api.api.delete(f"{NODES}/mac-1")
        assert [n[0] for n in await next_change(changes)] == ["mac-2"]
    finally:
        await changes.aclose()
        await source.close()


async def _true(value: bool) -> bool:
    return value


class FlakyKube:
    """A KubeClient whose watch stream breaks after one event, twice, and whose LIST
    fails once: the source backs off, lists again and keeps the nodes current."""

    def __init__(self) -> None:
        self.lists: list[float] = []
        self.watches = 0
        self.nodes = {"mac-1": node("mac-1", 9001)}

    async def list_versioned(self, path: str) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(asyncio.get_running_loop().time())
        if len(self.lists) == 2:
            raise httpx.ConnectError("API server restarting")
        return list(self.nodes.values()), "10"

    async def watch(self, path: str, version: str, timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        await asyncio.sleep(0.1)  # the event comes after the list was seen
        if self.watches <= 2:
            added = node(f"mac-{self.watches + 1}", 9001 + self.watches)
            added["metadata"]["resourceVersion"] = str(11 + self.watches)
            self.nodes[added["metadata"]["name"]] = added
            yield {"type": "ADDED", "object": added}
            raise httpx.ReadError("connection reset")
        await asyncio.Event().wait()

    async def token(self, ref: Any) -> str:
        raise AssertionError("no Secrets here")

    async def close(self) -> None:
        return None


async def test_cluster_source_lists_again_after_a_broken_stream_with_backoff(api: Cluster) -> None:
    source = ClusterSource(backoff=(0.2, 1.0))
    kube = FlakyKube()
    source._kube = kube  # type: ignore[assignment]
    changes = source.changes()
    try:
        assert [n[0] for n in await next_change(changes)] == ["mac-1"]
        assert [n[0] for n in await next_change(changes)] == ["mac-1", "mac-2"]
        # broken stream -> wait, list (fails: wait twice as long), list, watch
        assert [n[0] for n in await next_change(changes, 3.0)] == ["mac-1", "mac-2", "mac-3"]
        assert len(kube.lists) >= 3
        first_wait, second_wait = kube.lists[1] - kube.lists[0], kube.lists[2] - kube.lists[1]
        assert first_wait >= 0.2 * 0.8 and second_wait >= 0.4 * 0.8
    finally:
        await changes.aclose()
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


async def test_folder_source_parses_the_folder_only_when_a_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hundred WarmNodes' YAML parsed every interval was 9% of a router's CPU."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(node("mac-1", 9001)))
    reads: list[Path] = []
    real = discovery.read_folder
    monkeypatch.setattr(discovery, "read_folder", lambda d: reads.append(d) or real(d))
    changes = FolderSource(tmp_path, interval=0.01).changes()
    try:
        assert [s.name for s in await anext(changes)] == ["mac-1"]
        polled = asyncio.ensure_future(anext(changes))
        await asyncio.sleep(0.2)  # some twenty intervals with nothing changed
        assert len(reads) == 1 and not polled.done()
        fleet.write_text(yaml.safe_dump(node("mac-2", 9002)))
        assert [s.name for s in await asyncio.wait_for(polled, 5)] == ["mac-2"]
        assert len(reads) == 2
    finally:
        await changes.aclose()


async def test_bad_sources_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected http"):
        StaticSource(["mac-mini:8000"], None)
    with pytest.raises(ValueError, match="not a directory"):
        FolderSource(tmp_path / "missing")


class BookmarkKube(FlakyKube):
    """Ends its first watch after a BOOKMARK: the next watch resumes from the bookmark's
    version, without listing again."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: list[str] = []

    async def list_versioned(self, path: str) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(asyncio.get_running_loop().time())
        return list(self.nodes.values()), "10"

    async def watch(self, path: str, version: str, timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.versions.append(version)
        if len(self.versions) == 1:
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}}
            return
        await asyncio.sleep(0.1)
        added = node("mac-2", 9002)
        added["metadata"]["resourceVersion"] = "43"
        yield {"type": "ADDED", "object": added}
        await asyncio.Event().wait()


async def test_cluster_source_resumes_from_a_bookmark(api: Cluster) -> None:
    source = ClusterSource()
    kube = BookmarkKube()
    source._kube = kube  # type: ignore[assignment]
    changes = source.changes()
    try:
        assert [n[0] for n in await next_change(changes)] == ["mac-1"]
        assert [n[0] for n in await next_change(changes, 3.0)] == ["mac-1", "mac-2"]
        assert kube.versions == ["10", "42"] and len(kube.lists) == 1
    finally:
        await changes.aclose()
        await source.close()


class LyingKube:
    """A KubeClient whose list holds a WarmNode whose spec is no object and whose watch sends
    events of every wrong shape before a good one."""

    def __init__(self) -> None:
        self.watches = 0

    async def list_versioned(self, path: str) -> tuple[list[dict[str, Any]], str]:
        broken = node("broken", 9001)
        broken["spec"] = "not an object"
        return [node("mac-1", 9001), broken], "10"

    async def watch(self, path: str, version: str, timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            yield {"type": "ADDED", "object": ["not", "an", "object"]}
        elif self.watches == 2:
            yield {"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "12"}}}
        else:
            yield {"type": "ADDED", "object": node("mac-2", 9002)}
            await asyncio.Event().wait()

    async def token(self, ref: Any) -> str:
        raise AssertionError("no Secrets here")

    async def close(self) -> None:
        return None


async def test_the_watch_survives_any_payload(
    api: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    source = ClusterSource(backoff=(0.05, 0.1))
    kube = LyingKube()
    source._kube = kube  # type: ignore[assignment]
    changes = source.changes()
    try:
        assert [n[0] for n in await next_change(changes)] == ["mac-1"]  # "broken" left out
        assert [n[0] for n in await next_change(changes, 3.0)] == ["mac-1", "mac-2"]
        assert source.errors >= 3 and kube.watches == 3
        warned = [
            r.getMessage() for r in caplog.records if "WarmNodes watch failed" in r.getMessage()
        ]
        assert len(warned) == 2  # once per kind of trouble (AttributeError, KeyError)
    finally:
        await changes.aclose()
        await source.close()
