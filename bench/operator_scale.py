"""The operator at fleet scale: 100 WarmNodes, 20 WarmPromptSets, prompt edits.

`warmfleet operator` runs as its own process against kmock's Kubernetes emulator (the
one the tests use) and 100 fake daemons: one in-process HTTP server answering the
daemons' push API under /<node>/... It is a test double with the daemon's ordering
rules (409 for an older generation of the same uid) that reports a set warm as soon
as it is pushed, since this measures the operator, not the engine.

Prints the time from an edit to every node pushed and the set Ready again, the
Kubernetes API and daemon requests that took, the steady-state cost of a resync
period, and the operator's CPU time and memory.

    .venv/bin/python bench/operator_scale.py [--nodes 100] [--sets 20] [--resync 30]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import kmock
import yaml
from aiohttp import web
from harness.processes import cpu_seconds, rss_mib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support.kubeemu import RESOURCES, Emulator  # noqa: E402

API = "/apis/warmfleet.io/v1alpha1"
MERGE = {"Content-Type": "application/merge-patch+json"}
LAST_HANDLED = "warmfleet.io/last-handled-digest"  # the operator's kopf diff base


class FakeFleet:
    """Many daemons' push API on one port, one path prefix per node."""

    def __init__(self) -> None:
        self.sets: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{node}/v1/warm-sets/{ns}/{name}", self.warm_set)
        app.router.add_get("/{node}/v1/status", self.status)
        return app

    async def warm_set(self, request: web.Request) -> web.Response:
        node, ns, name = (request.match_info[k] for k in ("node", "ns", "name"))
        self.calls[request.method] += 1
        key = (node, ns, name)
        held = self.sets.get(key)
        if request.method == "PUT":
            spec = await request.json()
            if held and held["uid"] == spec.get("uid") and spec["generation"] < held["generation"]:
                return web.json_response({"detail": "older generation"}, status=409)
            prompts = [
                {"name": p["name"], "state": "warm", "content_hash": "h", "tokens": 1000}
                for p in spec["prompts"]
            ]
            self.sets[key] = {
                "namespace": ns,
                "name": name,
                "generation": spec["generation"],
                "uid": spec.get("uid"),
                "source_hash": spec.get("source_hash"),
                "content_hash": "c",
                "concurrency": spec.get("concurrency", 2),
                "pin": True,
                "prompts": prompts,
                "warm": len(prompts),
                "total": len(prompts),
                "updated_at": time.time(),
            }
            return web.json_response(self.sets[key], status=202)
        if request.method == "DELETE":
            return web.json_response({}, status=200 if self.sets.pop(key, None) else 404)
        return web.json_response(held) if held else web.json_response({}, status=404)

    async def status(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        self.calls["GET status"] += 1
        sets = [held for (nd, _, _), held in self.sets.items() if nd == node]
        cache = {"hit_rate": 0.7, "bytes": 1, "budget_bytes": 2}
        return web.json_response({"model": {"id": "fake"}, "cache": cache, "warm_sets": sets})

    def total(self) -> int:
        return sum(self.calls.values())

    def pushed(self, name: str, generation: int) -> int:
        return sum(
            1 for (_, _, n), s in self.sets.items() if n == name and s["generation"] == generation
        )


class Meter:
    """Counters of one process and the two servers, read before and after a phase."""

    def __init__(self, pid: int, emulator: Emulator, fleet: FakeFleet) -> None:
        self.pid, self.emulator, self.fleet = pid, emulator, fleet

    def read(self) -> tuple[float, int, int, float]:
        """(time, Kubernetes API requests, daemon requests, operator CPU seconds)."""
        return time.perf_counter(), self.emulator.served, self.fleet.total(), cpu_seconds(self.pid)

    def since(self, before: tuple[float, int, int, float]) -> tuple[float, int, int, float]:
        now = self.read()
        return tuple(b - a for a, b in zip(before, now))  # type: ignore[return-value]


async def main(args: argparse.Namespace) -> None:
    fleet = FakeFleet()
    runner = web.AppRunner(fleet.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fleet_url = f"http://127.0.0.1:{port}"

    async with Emulator() as emulator, kmock.Server(emulator):
        emulator.resources.update(RESOURCES)
        url = str(emulator.url).rstrip("/")
        workdir = Path(tempfile.mkdtemp(prefix="warmfleet-scale-"))
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(url)))
        async with httpx.AsyncClient(base_url=url, timeout=60) as k8s:
            for i in range(args.nodes):
                node = {
                    "apiVersion": "warmfleet.io/v1alpha1",
                    "kind": "WarmNode",
                    "metadata": {"name": f"mac-{i:03d}", "labels": {"pool": "fleet"}},
                    "spec": {"url": f"{fleet_url}/mac-{i:03d}"},
                }
                await k8s.post(f"{API}/warmnodes", json=node)
            for s in range(args.sets):
                await k8s.post(f"{API}/namespaces/default/warmpromptsets", json=warm_set(s, "v1"))
            names = [f"set-{s:02d}" for s in range(args.sets)]
            log = workdir / "operator.log"
            with log.open("w") as out:
                operator = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "warmfleet_cli", "operator", "-A",
                    "--liveness", "", "--resync-seconds", str(args.resync),
                    "--probe-seconds", str(args.probe),
                    env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                    stdout=out, stderr=asyncio.subprocess.STDOUT,
                )  # fmt: skip
            meter = Meter(operator.pid, emulator, fleet)
            try:
                start = meter.read()
                await wait_all(k8s, fleet, args.nodes, dict.fromkeys(names, 1), operator)
                initial = meter.since(start)
                rss_start = rss_mib(operator.pid)

                before = meter.read()
                first = {names[0]: await edit(k8s, 0, "v2")}
                await wait_all(k8s, fleet, args.nodes, first, operator)
                one = meter.since(before)

                before = meter.read()
                edited = {name: await edit(k8s, s, "v3") for s, name in enumerate(names)}
                await wait_all(k8s, fleet, args.nodes, edited, operator)
                bulk = meter.since(before)

                # Idle: after one probe period (every node's status lists its sets by
                # then), over 4 periods (the timers drift).
                await asyncio.sleep(args.resync)
                before, kinds = meter.read(), fleet.calls.copy()
                await asyncio.sleep(args.resync * 4)
                idle = meter.since(before)
                idle_kinds = fleet.calls - kinds
                rss_end = rss_mib(operator.pid)
            finally:
                operator.terminate()
                await operator.wait()
    await runner.cleanup()

    pairs = args.nodes * args.sets
    print(
        f"\n{args.nodes} WarmNodes x {args.sets} WarmPromptSets ({pairs} set-node pairs), "
        f"resync every {args.resync:.0f} s, probe every {args.probe:g} s; the operator in "
        "its own process "
        f"(log: {log})\n"
    )
    print(f"{'phase':34} {'seconds':>8} {'k8s API':>8} {'daemon':>8} {'CPU s':>7}  needed")
    for label, (secs, api, calls, cpu), need in (
        ("start -> all sets Ready", initial, pairs),
        (f"edit 1 set -> {args.nodes} nodes, Ready", one, args.nodes),
        (f"edit {args.sets} sets -> all pushed, Ready", bulk, pairs),
    ):
        print(f"{label:34} {secs:8.1f} {api:8d} {calls:8d} {cpu:7.1f}  {need} PUTs")
    secs, api, calls, cpu = idle
    print(
        f"{'idle, per minute':34} {'':8} {api * 60 / secs:8.0f} {calls * 60 / secs:8.0f} "
        f"{cpu * 60 / secs:7.1f}  ({cpu / secs * 100:.1f}% of a core)"
    )
    print(f"\noperator RSS: {rss_start:.0f} MiB after start-up, {rss_end:.0f} MiB at the end")
    per_minute = {kind: round(n * 60 / secs) for kind, n in sorted(idle_kinds.items())}
    print(f"idle daemon requests per minute by kind: {per_minute}")


def warm_set(index: int, version: str) -> dict[str, Any]:
    prompts = [
        {
            "name": f"p{j}",
            "messages": [{"role": "system", "content": f"Agent {index}.{j} {version}. " * 50}],
        }
        for j in range(3)
    ]
    return {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": f"set-{index:02d}", "namespace": "default"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "fleet"}}, "prompts": prompts},
    }


async def edit(k8s: httpx.AsyncClient, index: int, version: str) -> int:
    """Change every prompt of a set; returns the generation the API server gave it."""
    path = f"{API}/namespaces/default/warmpromptsets/set-{index:02d}"
    r = await k8s.patch(path, json={"spec": warm_set(index, version)["spec"]}, headers=MERGE)
    r.raise_for_status()
    return int(r.json()["metadata"]["generation"])


async def wait_all(
    k8s: httpx.AsyncClient,
    fleet: FakeFleet,
    nodes: int,
    generations: dict[str, int],
    operator: asyncio.subprocess.Process,
) -> None:
    """Until these sets are on every node at these generations and report Ready."""
    while True:
        if operator.returncode is not None:
            raise SystemExit(f"the operator exited ({operator.returncode}); see its log")
        items = (await k8s.get(f"{API}/warmpromptsets")).json()["items"]
        done = 0
        for obj in items:
            name = obj["metadata"]["name"]
            if name not in generations:
                continue
            generation = generations[name]
            status = obj.get("status") or {}
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in status.get("conditions") or []
            )
            # kopf's mark that its handlers for this spec have finished (a digest)
            last = (obj["metadata"].get("annotations") or {}).get(LAST_HANDLED)
            handled = last is not None and json.loads(last).get("spec") == digest(obj["spec"])
            done += (
                ready
                and handled
                and status.get("observedGeneration") == generation
                and fleet.pushed(name, generation) == nodes
            )
        if done == len(generations):
            return
        await asyncio.sleep(0.1)


def digest(value: Any) -> str:
    """As the operator's DigestDiffBase keeps it."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def kubeconfig_for(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": url}}],
        "users": [{"name": "bench", "user": {}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--sets", type=int, default=20)
    parser.add_argument("--resync", type=float, default=30.0)
    parser.add_argument("--probe", type=float, default=5.0, help="settled nodes' probe period")
    asyncio.run(main(parser.parse_args()))
