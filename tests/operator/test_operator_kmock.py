"""The operator end to end: kopf against kmock's Kubernetes emulator, real daemons on
the tiny model on 127.0.0.1, real HTTP between them."""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest
import yaml

from support.kubeemu import Cluster, wait_for
from support.processes import Daemon, free_port, start_daemon

pytestmark = pytest.mark.asyncio

API = "/apis/warmfleet.io/v1alpha1"
SYSTEM = "You are Quill, the docs team's writing assistant. " * 8


def node(name: str, url: str, pool: str = "agents") -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmNode",
        "metadata": {"name": name, "labels": {"warmfleet.io/pool": pool}},
        "spec": {"url": url},
    }


def warm_set(name: str, prompts: list[dict[str, Any]], pool: str = "agents") -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeSelector": {"matchLabels": {"warmfleet.io/pool": pool}}, "prompts": prompts},
    }


def prompt(name: str, text: str) -> dict[str, Any]:
    return {"name": name, "messages": [{"role": "system", "content": text}]}


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


async def ready(
    cluster: Cluster, name: str, want: str = "True", generation: int | None = None
) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await cluster.get(f"{API}/namespaces/default/warmpromptsets/{name}")
        seen = ((obj or {}).get("status") or {}).get("observedGeneration")
        if generation is not None and seen != generation:
            return None
        return obj if condition(obj, "Ready").get("status") == want else None

    return await wait_for(check, what=f"{name} Ready={want}")  # type: ignore[no-any-return]


def daemon_set(daemon: Daemon, name: str) -> dict[str, Any] | None:
    r = httpx.get(f"{daemon.url}/v1/warm-sets/default/{name}")
    return None if r.status_code == 404 else dict(r.json())


async def test_a_set_warms_every_selected_node_and_reports_ready(
    cluster: Cluster, daemons: list[Daemon]
) -> None:
    a, b, other = daemons
    for name, d, pool in [
        ("mac-a", a, "agents"),
        ("mac-b", b, "agents"),
        ("mac-c", other, "batch"),
    ]:
        await cluster.create(f"{API}/warmnodes", node(name, d.url, pool))
    await cluster.create(
        "/api/v1/namespaces/default/configmaps",
        {
            "metadata": {"name": "quill-few-shot", "namespace": "default"},
            "data": {
                "messages.yaml": yaml.safe_dump(
                    [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Fix the typo"},
                        {"role": "assistant", "content": "Done."},
                    ]
                )
            },
        },
    )
    spec = warm_set(
        "docs",
        [
            prompt("style", SYSTEM),
            {
                "name": "few-shot",
                "messagesFrom": {
                    "configMapKeyRef": {"name": "quill-few-shot", "key": "messages.yaml"}
                },
            },
        ],
    )
    await cluster.create(f"{API}/namespaces/default/warmpromptsets", spec)
    obj = await ready(cluster, "docs")
    status = obj["status"]
    assert status["warmNodes"] == "2/2"
    assert sorted(n["node"] for n in status["nodes"]) == ["mac-a", "mac-b"]
    assert all(n["warm"] == n["total"] == 2 and n["tokens"] > 100 for n in status["nodes"])
    assert condition(obj, "Degraded")["status"] == "False"
    for d in (a, b):
        assert daemon_set(d, "docs")["warm"] == 2
    assert daemon_set(other, "docs") is None  # not in the pool
    # the nodes' own status shows what they hold
    wn = await wait_for(
        lambda: _node_with_set(cluster, "mac-a", "default/docs"), what="WarmNode status"
    )
    assert wn["status"]["reachable"] is True and wn["status"]["model"] == "tiny-random"

    # edit one prompt: only it re-warms
    before = {p["name"]: p for p in daemon_set(a, "docs")["prompts"]}
    spec["spec"]["prompts"][0] = prompt("style", SYSTEM + "Prefer active voice.")
    await cluster.merge(
        f"{API}/namespaces/default/warmpromptsets/docs",
        {"metadata": {"generation": 2}, "spec": spec["spec"]},
    )

    async def rewarmed() -> bool:
        now = {p["name"]: p for p in (daemon_set(a, "docs") or {}).get("prompts", [])}
        return (
            bool(now)
            and now["style"]["content_hash"] != before["style"]["content_hash"]
            and now["style"]["state"] == "warm"
        )

    await wait_for(rewarmed, what="the edited prompt re-warmed")
    after = {p["name"]: p for p in daemon_set(a, "docs")["prompts"]}
    assert after["few-shot"]["warmed_at"] == before["few-shot"]["warmed_at"]
    await ready(cluster, "docs", generation=2)

    # a ConfigMap change re-warms the prompt that reads it
    await cluster.merge(
        "/api/v1/namespaces/default/configmaps/quill-few-shot",
        {"data": {"messages.yaml": "- {role: system, content: 'You proofread release notes.'}\n"}},
    )

    async def cm_rewarmed() -> bool:
        now = {p["name"]: p for p in (daemon_set(b, "docs") or {}).get("prompts", [])}
        return (
            bool(now)
            and now["few-shot"]["content_hash"] != after["few-shot"]["content_hash"]
            and now["few-shot"]["state"] == "warm"
        )

    await wait_for(cm_rewarmed, what="the ConfigMap prompt re-warmed")

    # delete: the finalizer unpins and drops the set on every node, then lets go
    await cluster.delete(f"{API}/namespaces/default/warmpromptsets/docs")
    await wait_for(
        lambda: _gone(cluster, f"{API}/namespaces/default/warmpromptsets/docs"), what="deletion"
    )
    for d in (a, b):
        assert daemon_set(d, "docs") is None
        async with httpx.AsyncClient() as http:
            status = (await http.get(f"{d.url}/v1/status")).json()
        assert status["cache"]["pinned_count"] == 0


async def test_a_restarted_daemon_is_pushed_again(cluster: Cluster) -> None:
    port = free_port()
    daemon = start_daemon("--model", "tiny-random", port=port)
    try:
        await cluster.create(f"{API}/warmnodes", node("mac-r", daemon.url, "restart"))
        await cluster.create(
            f"{API}/namespaces/default/warmpromptsets",
            warm_set("restart", [prompt("p", SYSTEM)], pool="restart"),
        )
        await ready(cluster, "restart")
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait()
        daemon = start_daemon("--model", "tiny-random", port=port)  # empty: no --state-dir
        await wait_for(lambda: _has_warm(daemon, "restart"), what="re-push after restart")
        await ready(cluster, "restart")
    finally:
        daemon.stop()


async def test_an_unreachable_node_degrades_the_set_until_it_comes_back(cluster: Cluster) -> None:
    port = free_port()
    await cluster.create(f"{API}/warmnodes", node("mac-late", f"http://127.0.0.1:{port}", "late"))
    await cluster.create(
        f"{API}/namespaces/default/warmpromptsets",
        warm_set("late", [prompt("p", SYSTEM)], pool="late"),
    )
    obj = await ready(cluster, "late", want="False")

    async def degraded() -> dict[str, Any] | None:
        o = await cluster.get(f"{API}/namespaces/default/warmpromptsets/late")
        return o if condition(o, "Degraded").get("reason") == "NodesUnreachable" else None

    obj = await wait_for(degraded, what="Degraded=NodesUnreachable")
    assert condition(obj, "Degraded")["status"] == "True"
    assert condition(obj, "Ready")["reason"] == "NodesUnreachable"
    daemon = start_daemon("--model", "tiny-random", port=port)
    try:
        obj = await ready(cluster, "late")
        assert condition(obj, "Degraded")["status"] == "False"
    finally:
        daemon.stop()


async def test_invalid_specs_degrade_with_a_reason_and_an_event(
    cluster: Cluster, daemons: list[Daemon]
) -> None:
    await cluster.create(f"{API}/warmnodes", node("mac-x", daemons[0].url, "invalid"))
    broken = warm_set(
        "broken",
        [{"name": "p", "messagesFrom": {"configMapKeyRef": {"name": "missing", "key": "k"}}}],
        pool="invalid",
    )
    await cluster.create(f"{API}/namespaces/default/warmpromptsets", broken)

    async def degraded() -> dict[str, Any] | None:
        o = await cluster.get(f"{API}/namespaces/default/warmpromptsets/broken")
        return o if condition(o, "Degraded").get("status") == "True" else None

    obj = await wait_for(degraded, what="Degraded")
    assert condition(obj, "Degraded")["reason"] == "ConfigMapMissing"
    assert condition(obj, "Ready")["status"] == "False"
    assert daemon_set(daemons[0], "broken") is None  # nothing pushed
    events = await wait_for(
        lambda: _events(cluster, "ConfigMapMissing"), what="a ConfigMapMissing event"
    )
    assert events[0]["involvedObject"]["name"] == "broken"


async def test_a_node_joining_the_pool_gets_the_set(
    cluster: Cluster, daemons: list[Daemon]
) -> None:
    await cluster.create(f"{API}/warmnodes", node("mac-1", daemons[1].url, "grow"))
    await cluster.create(f"{API}/warmnodes", node("mac-2", daemons[2].url, "elsewhere"))
    await cluster.create(
        f"{API}/namespaces/default/warmpromptsets",
        warm_set("grow", [prompt("p", SYSTEM)], pool="grow"),
    )
    assert (await ready(cluster, "grow"))["status"]["warmNodes"] == "1/1"
    await cluster.merge(
        f"{API}/warmnodes/mac-2", {"metadata": {"labels": {"warmfleet.io/pool": "grow"}}}
    )

    async def both() -> dict[str, Any] | None:
        o = await cluster.get(f"{API}/namespaces/default/warmpromptsets/grow")
        ok = (o or {}).get("status", {}).get("warmNodes") == "2/2"
        return o if ok and condition(o, "Ready")["status"] == "True" else None

    await wait_for(both, what="2/2 nodes warm")
    assert daemon_set(daemons[2], "grow")["warm"] == 1
    await cluster.delete(f"{API}/namespaces/default/warmpromptsets/grow")
    await wait_for(lambda: _gone(cluster, f"{API}/namespaces/default/warmpromptsets/grow"))


async def test_deleting_with_a_node_gone_for_good_releases_after_retries(
    cluster: Cluster,
) -> None:
    port = free_port()
    daemon = start_daemon("--model", "tiny-random", port=port)
    await cluster.create(f"{API}/warmnodes", node("mac-gone", daemon.url, "gone"))
    await cluster.create(
        f"{API}/namespaces/default/warmpromptsets",
        warm_set("gone", [prompt("p", SYSTEM)], pool="gone"),
    )
    await ready(cluster, "gone")
    daemon.stop()
    await cluster.delete(f"{API}/namespaces/default/warmpromptsets/gone")
    await wait_for(
        lambda: _gone(cluster, f"{API}/namespaces/default/warmpromptsets/gone"),
        timeout=90,
        what="the finalizer released",
    )
    events = await wait_for(lambda: _events(cluster, "NodesUnreachable"), what="an event")
    assert "mac-gone" in events[0]["message"]


async def _node_with_set(cluster: Cluster, name: str, key: str) -> dict[str, Any] | None:
    obj = await cluster.get(f"{API}/warmnodes/{name}")
    return obj if key in ((obj or {}).get("status") or {}).get("warmSets", []) else None


async def _gone(cluster: Cluster, path: str) -> bool:
    return await cluster.get(path) is None


async def _has_warm(daemon: Daemon, name: str) -> bool:
    try:
        found = daemon_set(daemon, name)
    except httpx.HTTPError:
        return False
    return bool(found) and found["warm"] == found["total"]


async def _events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events() if e.get("reason") == reason]


async def test_a_warm_node_has_no_finalizer_and_deleting_it_unpins_its_daemon(
    cluster: Cluster, daemons: list[Daemon]
) -> None:
    """Deleting a WarmNode never waits for the operator (issue 11: a probe timer made
    kopf put a finalizer on every WarmNode), and its daemon lets go of our sets."""
    await cluster.create(f"{API}/warmnodes", node("mac-del", daemons[2].url, "deleting"))
    await cluster.create(
        f"{API}/namespaces/default/warmpromptsets",
        warm_set("deleting", [prompt("p", SYSTEM)], pool="deleting"),
    )
    await ready(cluster, "deleting")
    found = await wait_for(
        lambda: _node_with_set(cluster, "mac-del", "default/deleting"), what="probed"
    )
    assert not found["metadata"].get("finalizers")
    await cluster.delete(f"{API}/warmnodes/mac-del")
    assert await cluster.get(f"{API}/warmnodes/mac-del") is None  # gone at once
    await wait_for(lambda: _lacks(daemons[2], "deleting"), timeout=10, what="unpinned")
    obj = await ready(cluster, "deleting", want="False")
    assert condition(obj, "Ready")["reason"] == "NoNodes"
    await cluster.delete(f"{API}/namespaces/default/warmpromptsets/deleting")
    await wait_for(lambda: _gone(cluster, f"{API}/namespaces/default/warmpromptsets/deleting"))


async def test_a_large_spec_is_handled_and_its_delete_completes(cluster: Cluster) -> None:
    """kopf kept a copy of the spec in an annotation: over ~128 KiB (with kubectl's own
    copy) the API server refused it, status never came and the delete hung."""
    prompts = [prompt(f"p{i}", f"{i} " + "x" * 100_000) for i in range(3)]
    await cluster.create(
        f"{API}/namespaces/default/warmpromptsets", warm_set("large", prompts, pool="nowhere")
    )
    obj = await ready(cluster, "large", want="False")  # no node in that pool
    assert condition(obj, "Ready")["reason"] == "NoNodes"
    annotations = obj["metadata"].get("annotations") or {}
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 1024
    await cluster.delete(f"{API}/namespaces/default/warmpromptsets/large")
    await wait_for(lambda: _gone(cluster, f"{API}/namespaces/default/warmpromptsets/large"))


async def _lacks(daemon: Daemon, name: str) -> bool:
    return daemon_set(daemon, name) is None
