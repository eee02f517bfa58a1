"""What a simulated fleet looks like while a trace replays: one sample every few seconds of
the router (its decision-latency histogram, CPU, memory, index), every node (ready,
requests, cache memory, the simulation's lateness) and the operator's warm sets (from
the status file it writes in local mode), plus the replay's own event-loop lag (a
client that falls behind inflates every TTFT it measures, times the compression).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

DECISION_METRIC = "warmfleet_router_decision_duration_seconds"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass
class LoopLag:
    """How late the replay's event loop wakes (wall seconds), sampled every `every_s`."""

    every_s: float = 0.05
    lags: list[float] = field(default_factory=list)

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.every_s
            await asyncio.sleep(self.every_s)
            self.lags.append(max(0.0, loop.time() - due))

    def take(self) -> list[float]:
        taken, self.lags = self.lags, []
        return taken


@dataclass(frozen=True)
class Targets:
    router_url: str
    router_pid: int | None
    token: str
    nodes: dict[str, str]  # WarmNode name -> its daemon's URL
    status_file: Path | None  # the operator's (local mode)


async def sample(client: httpx.AsyncClient, targets: Targets) -> dict[str, Any]:
    """One sample (without its time: the caller stamps it)."""
    auth = {"Authorization": f"Bearer {targets.token}"}
    router: dict[str, Any] = process_usage(targets.router_pid)
    backends: dict[str, dict[str, Any]] = {}
    try:
        metrics = (await client.get(f"{targets.router_url}/metrics", timeout=10)).text
        router.update(decision_histogram(metrics))
        status = (await client.get(f"{targets.router_url}/v1/router/status", headers=auth)).json()
        router["index_bytes"] = int(status.get("index", {}).get("estimated_bytes", 0))
        backends = {b["name"]: b for b in status.get("backends", [])}
        router["index_blocks"] = sum(int(b["index"]["blocks"]) for b in backends.values())
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        router["error"] = f"{type(exc).__name__}: {exc}"
    names = list(targets.nodes)
    statuses = await asyncio.gather(*(_node_status(client, targets.nodes[n], auth) for n in names))
    nodes: dict[str, Any] = {}
    for name, node_status in zip(names, statuses):
        backend = backends.get(name, {})
        cache = (node_status or {}).get("cache") or {}
        sim = (node_status or {}).get("sim") or {}
        disk = (node_status or {}).get("disk_tier") or {}
        nodes[name] = {
            "ready": backend.get("health") == "ready",
            "health": backend.get("health"),
            "requests": int(backend.get("requests", 0)),
            "cache_bytes": int(cache.get("bytes", 0)),
            "cache_budget_bytes": int(cache.get("budget_bytes", 0)),
            "disk_blocks": int(disk.get("blocks", 0)),  # 0 without a disk tier
            "sim_spent_s": float(sim.get("spent_s", 0.0)),
            "sim_behind_s": float(sim.get("behind_s", 0.0)),
        }
    return {"router": router, "nodes": nodes, "operator": operator_sets(targets.status_file)}


def decision_histogram(metrics_text: str) -> dict[str, Any]:
    """The router's decision-duration histogram, summed over its labels: cumulative
    bucket counts by upper bound (seconds, as Prometheus writes them) and the count."""
    buckets: dict[str, float] = {}
    count = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name != DECISION_METRIC:
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets[s.labels["le"]] = buckets.get(s.labels["le"], 0.0) + s.value
            elif s.name.endswith("_count"):
                count += s.value
    return {"decisions": int(count), "decision_buckets": {k: int(v) for k, v in buckets.items()}}


def process_usage(pid: int | None) -> dict[str, Any]:
    """A process's CPU seconds so far and resident memory, from /proc (Linux; {} elsewhere
    or once it has gone)."""
    if pid is None:
        return {}
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return {}
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
    return {"cpu_seconds": round(cpu, 3), "rss_bytes": int(statm[1]) * PAGE_BYTES}


def operator_sets(status_file: Path | None) -> dict[str, Any]:
    """How many WarmPromptSets the operator says are Ready, with their warm nodes."""
    if status_file is None:
        return {}
    try:
        statuses = json.loads(status_file.read_text()).get("warmPromptSets", {})
    except (OSError, ValueError):
        return {}
    ready = 0
    warm_nodes: dict[str, str] = {}
    for key, status in statuses.items():
        conditions = {c.get("type"): c.get("status") for c in (status or {}).get("conditions", [])}
        ready += conditions.get("Ready") == "True"
        warm_nodes[key] = str((status or {}).get("warmNodes", ""))
    return {"warm_sets": len(statuses), "warm_sets_ready": ready, "warm_nodes": warm_nodes}


def rejected_sets(status_file: Path) -> str | None:
    """The operator's message for warm sets every node refused (one that cannot fit the
    pin budget, say), or None."""
    try:
        statuses = json.loads(status_file.read_text()).get("warmPromptSets", {})
    except (OSError, ValueError):
        return None
    for key, status in statuses.items():
        conditions = {c.get("type"): c for c in (status or {}).get("conditions", [])}
        ready, degraded = conditions.get("Ready") or {}, conditions.get("Degraded") or {}
        if ready.get("reason") == "PushRejected":
            return f"{key}: {degraded.get('message') or ready.get('message')}"
    return None


async def _node_status(
    client: httpx.AsyncClient, url: str, auth: dict[str, str]
) -> dict[str, Any] | None:
    try:
        response = await client.get(f"{url}/v1/status", headers=auth, timeout=5)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def now() -> float:
    return time.monotonic()
