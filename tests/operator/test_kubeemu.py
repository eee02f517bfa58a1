"""The emulator does what kube-apiserver did to the operator (issue 11): each of these
failed on the emulator before it learnt it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kmock
import pytest
import pytest_asyncio

from support.kubeemu import RESOURCES, Emulator

pytestmark = pytest.mark.asyncio

API = "/apis/warmfleet.io/v1alpha1"
SETS = f"{API}/namespaces/default/warmpromptsets"
MERGE = {"Content-Type": "application/merge-patch+json"}


def wps(name: str, **spec: Any) -> dict[str, Any]:
    prompts = [{"name": "p", "messages": [{"role": "system", "content": "hi"}]}]
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": name},
        "spec": {"prompts": prompts, **spec},
    }


def warm_node(name: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmNode",
        "metadata": {"name": name},
        "spec": {"url": url},
    }


@pytest_asyncio.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    async with Emulator() as emu, kmock.Server(emu):
        emu.resources.update(RESOURCES)
        async with httpx.AsyncClient(base_url=str(emu.url).rstrip("/")) as client:
            yield client


async def test_a_delete_waits_for_the_finalizers(api: httpx.AsyncClient) -> None:
    body = wps("held")
    body["metadata"]["finalizers"] = ["warmfleet.io/unwarm"]
    assert (await api.post(SETS, json=body)).status_code in (200, 201)
    assert (await api.delete(f"{SETS}/held")).status_code == 200
    still = (await api.get(f"{SETS}/held")).json()
    assert still["metadata"]["deletionTimestamp"]
    await api.patch(f"{SETS}/held", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert (await api.get(f"{SETS}/held")).status_code == 404


async def test_schema_defaults_and_validation(api: httpx.AsyncClient) -> None:
    created = (await api.post(SETS, json=wps("defaults"))).json()
    assert created["spec"]["concurrency"] == 2 and created["spec"]["pin"] is True

    r = await api.post(SETS, json=wps("zero", concurrency=0))
    assert r.status_code == 422 and "spec.concurrency" in r.json()["message"]
    r = await api.post(f"{API}/warmnodes", json=warm_node("bad-port", "http://h:99999/"))
    assert r.status_code == 422 and "spec.url" in r.json()["message"]
    ok = await api.post(f"{API}/warmnodes", json=warm_node("ok", "http://[::1]:8000/v1"))
    assert ok.status_code in (200, 201)

    # patches are validated too, and leave the object as it was
    r = await api.patch(f"{SETS}/defaults", json={"spec": {"concurrency": 10000}}, headers=MERGE)
    assert r.status_code == 422
    assert (await api.get(f"{SETS}/defaults")).json()["spec"]["concurrency"] == 2


async def test_unknown_fields_and_nulls_are_pruned(api: httpx.AsyncClient) -> None:
    body = wps("pruned")
    body["spec"]["surprise"] = True
    created = (await api.post(SETS, json=body)).json()
    assert "surprise" not in created["spec"]
    status = {
        "warmNodes": "1/1",
        "kopf": {"progress": {}},
        "nodes": [{"node": "a", "warm": 1, "total": 1, "error": None, "extra": 1}],
    }
    written = await api.patch(f"{SETS}/pruned/status", json={"status": status}, headers=MERGE)
    assert written.json()["status"] == {
        "warmNodes": "1/1",
        "nodes": [{"node": "a", "warm": 1, "total": 1}],
    }


async def test_the_status_subresource_keeps_spec_and_status_apart(
    api: httpx.AsyncClient,
) -> None:
    await api.post(SETS, json=wps("split"))
    r = await api.patch(
        f"{SETS}/split/status",
        json={"spec": {"pin": False}, "status": {"warmNodes": "0/1"}},
        headers=MERGE,
    )
    assert r.json()["spec"]["pin"] is True and r.json()["status"]["warmNodes"] == "0/1"
    r = await api.patch(
        f"{SETS}/split",
        json={"spec": {"pin": False}, "status": {"warmNodes": "9/9"}},
        headers=MERGE,
    )
    assert r.json()["spec"]["pin"] is False and r.json()["status"]["warmNodes"] == "0/1"


async def test_annotations_and_objects_have_the_real_size_limits(api: httpx.AsyncClient) -> None:
    body = wps("annotated")
    body["metadata"]["annotations"] = {"a": "x" * 200_000, "b": "y" * 70_000}
    r = await api.post(SETS, json=body)
    assert r.status_code == 422 and "metadata.annotations" in r.json()["message"]

    # Every field within its bounds, the whole over etcd's 1.5 MiB: what
    # `--dry-run=server` accepts and etcd then refuses.
    content = "z" * 200_000
    prompts = [
        {"name": f"p{i}", "messages": [{"role": "system", "content": content}]} for i in range(8)
    ]
    r = await api.post(SETS, json={**wps("huge"), "spec": {"prompts": prompts}})
    assert r.status_code == 413
    assert (await api.get(f"{SETS}/huge")).status_code == 404


async def _watch(api: httpx.AsyncClient, path: str, **params: str) -> list[dict[str, Any]]:
    """A watch's events until the server ends it (`timeoutSeconds`)."""
    events = []
    async with api.stream("GET", path, params={"watch": "true", **params}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.strip():
                events.append(json.loads(line))
    return events


async def test_watches_resume_from_a_resource_version_or_expire(api: httpx.AsyncClient) -> None:
    """As kube-apiserver: a LIST's resourceVersion is where a watch picks up (only what
    came after, deletions with a version of their own); a compacted version: 410."""
    nodes = f"{API}/warmnodes"
    await api.post(nodes, json=warm_node("a", "http://a:1/"))
    listed = (await api.get(nodes)).json()
    version = listed["metadata"]["resourceVersion"]
    assert [n["metadata"]["name"] for n in listed["items"]] == ["a"]
    await api.post(nodes, json=warm_node("b", "http://b:1/"))
    await api.delete(f"{nodes}/a")
    events = await _watch(api, nodes, resourceVersion=version, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert int(version) < versions[0] < versions[1]

    # No version: every object as ADDED first.
    fresh = await _watch(api, nodes, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in fresh] == [("ADDED", "b")]


async def test_a_compacted_resource_version_is_410_expired() -> None:
    async with Emulator() as emu, kmock.Server(emu):
        emu.resources.update(RESOURCES)
        async with httpx.AsyncClient(base_url=str(emu.url).rstrip("/")) as api:
            nodes = f"{API}/warmnodes"
            version = (await api.get(nodes)).json()["metadata"]["resourceVersion"]
            await api.post(nodes, json=warm_node("a", "http://a:1/"))
            emu.compact()
            events = await _watch(api, nodes, resourceVersion=version, timeoutSeconds="1")
            assert [e["type"] for e in events] == ["ERROR"]
            assert events[0]["object"]["code"] == 410
            assert events[0]["object"]["reason"] == "Expired"
            # After a new LIST, the watch resumes.
            version = (await api.get(nodes)).json()["metadata"]["resourceVersion"]
            await api.delete(f"{nodes}/a")
            events = await _watch(api, nodes, resourceVersion=version, timeoutSeconds="1")
            assert [e["type"] for e in events] == ["DELETED"]
