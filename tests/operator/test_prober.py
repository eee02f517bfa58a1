"""The prober: one loop following every daemon (no kopf timer, so no finalizer on
WarmNodes), complete node statuses, and which sets changed on a node."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from warmfleet_common.crd import Node, SecretRef, SetKey
from warmfleet_operator.client import DaemonClient
from warmfleet_operator.prober import Prober, changed_sets, status_patch
from warmfleet_operator.service import Service

KEY = SetKey("ns", "s")


class NoTokens:
    async def token(self, ref: SecretRef) -> str:
        raise AssertionError(ref)


def warm_set(warm: int, total: int = 2) -> dict[str, Any]:
    return {
        "namespace": "ns", "name": "s", "generation": 1, "uid": "u", "source_hash": "h",
        "content_hash": "c", "concurrency": 2, "pin": True, "prompts": [],
        "warm": warm, "total": total, "updated_at": 0.0,
    }  # fmt: skip


class Daemon:
    """/v1/status of a daemon whose state the test moves along."""

    def __init__(self) -> None:
        self.instance = "one"
        self.sets: list[dict[str, Any]] = [warm_set(0)]
        self.up = True

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        body = {
            "instance_id": self.instance,
            "started_at": "2026-12-01T00:00:00+00:00",
            "model": {"id": "tiny-random"},
            "cache": {"bytes": 10, "budget_bytes": 100, "hit_rate": 0.5},
            "warm_sets": self.sets,
        }
        return httpx.Response(200, content=json.dumps(body))


def test_changed_sets() -> None:
    up = {"reachable": True, "instanceId": "one"}
    assert changed_sets(up, up, set()) == set()
    assert changed_sets(up, up, {KEY}) == {KEY}
    assert changed_sets(up, {**up, "instanceId": "two"}, set()) is None
    assert changed_sets(up, {"reachable": False}, set()) is None


def test_held_sets_report_what_changed_beyond_our_own_pushes() -> None:
    from warmfleet_common.contract import WarmSetStatus
    from warmfleet_operator.service import HeldSets

    def parsed(warm: int) -> WarmSetStatus:
        return WarmSetStatus.model_validate(warm_set(warm))

    held, node = HeldSets(60), Node("mac", "http://mac", {})
    held.record(node, [parsed(0)])
    assert held.changed[node.url] == {KEY}  # new to us
    held.record(node, [parsed(0)])
    assert held.changed[node.url] == set()
    held.update(node, KEY, parsed(1))  # our push said so
    held.record(node, [parsed(1)])
    assert held.changed[node.url] == set()  # nothing the push did not tell
    held.record(node, [parsed(2)])
    assert held.changed[node.url] == {KEY}  # progress
    held.record(node, [])
    assert held.changed[node.url] == {KEY}  # lost


def test_a_status_patch_leaves_nothing_of_an_older_probe() -> None:
    before = {"reachable": True, "model": "m", "warmSets": ["ns/s"], "hitRate": 0.5}
    after = {"reachable": False, "error": "refused"}
    assert status_patch(before, after) == {
        "reachable": False, "error": "refused", "model": None, "warmSets": None, "hitRate": None,
    }  # fmt: skip


@pytest.mark.asyncio
async def test_the_prober_follows_warm_ups_restarts_and_outages() -> None:
    daemon = Daemon()
    client = DaemonClient(
        NoTokens(), transport=httpx.MockTransport(daemon), attempts=1, backoff=0.0
    )
    service = Service(client)
    node = Node("mac", "http://mac", {})
    written: list[dict[str, Any]] = []
    changes: list[set[SetKey] | None] = []

    async def write(name: str, patch: dict[str, Any]) -> None:
        written.append(patch)

    prober = Prober(
        service,
        nodes=lambda: [(node, {})],
        write_status=write,
        on_change=lambda n, keys: changes.append(keys),
        period=0.3,  # settled nodes
        fast=0.05,  # warming or unreachable nodes
        tick=0.01,
    )
    task = asyncio.create_task(prober.run())

    async def until(predicate: Any) -> None:
        for _ in range(300):
            if predicate():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"written={written} changes={changes}")

    await until(lambda: written)
    assert written[0]["model"] == "tiny-random" and written[0]["warmSets"] == ["ns/s"]
    assert changes == []  # first sight of the node: a baseline
    daemon.sets = [warm_set(2)]  # warm-up done: seen at the fast period
    await until(lambda: {KEY} in changes)
    daemon.instance, daemon.sets = "two", []  # restarted without its state
    await until(lambda: changes and changes[-1] is None)
    assert written[-1]["instanceId"] == "two" and written[-1]["warmSets"] == []
    daemon.up = False
    await until(lambda: written[-1].get("reachable") is False)
    assert written[-1]["model"] is None and written[-1]["instanceId"] is None  # not stale
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.close()
