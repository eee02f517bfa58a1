"""The router on a multi-turn agent workload: prefix routing against round-robin,
least-load and a session header, on one run of this machine.

Workload (written for this project): 4 agent types, each a system prompt and a tool
list of 800-1,500 tokens, warmed on every daemon as a WarmPromptSet would be; 32
sessions of 6 turns, each turn resending the whole history plus a new user message
(the assistant's real replies included); 8 sessions at a time. Every policy gets the
same workload on the same daemons, their caches cleared (and the agents re-warmed)
before it, and a fresh router.

Per policy: the fleet's token hit rate (the daemons' own counters), TTFT p50/p95 (as the
client sees it, streaming), requests per backend (max/mean), and how often the router's
predicted cached tokens equalled the daemon's (its /metrics). The baseline is one daemon
with the whole fleet's cache budget serving the same workload. `--kill-one` adds a
prefix run in which one daemon is killed a third of the way through.

    .venv/bin/python bench/fleet.py                                  # 4 tiny-random daemons
    .venv/bin/python bench/fleet.py --model default --daemons 2 --sessions 8 --turns 4 \\
        --concurrency 4 --cache-memory-mb 1024 --max-tokens 16     # TTFT on the real model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from harness.client import sse_data
from harness.processes import Proc, free_port, tmp_log
from harness.warmfleet import router, serve, wait_following, wait_warm

TOKEN = "bench-fleet-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
POLICIES = ("round-robin", "least-load", "session", "prefix")

AGENTS = {
    "oncall": (
        "the on-call assistant of the platform team",
        ["kubectl_get", "prom_query", "page_owner"],
    ),
    "reviewer": (
        "a meticulous code reviewer for a Go and Python monorepo",
        ["run_tests", "read_file"],
    ),
    "support": (
        "Sam, the support agent of Acme Cloud",
        ["lookup_account", "open_ticket", "refund_status"],
    ),
    "analyst": (
        "a data analyst who answers with SQL against the warehouse",
        ["run_sql", "describe_table"],
    ),
}
TOPICS = [
    *("latency", "a failed deploy", "disk pressure", "a flaky test", "billing", "a 502"),
    *("memory leaks", "a slow query", "TLS expiry", "a noisy neighbour", "DNS", "quotas"),
]


def agent(name: str, rng: random.Random, target_tokens: int) -> tuple[dict[str, Any], list[Any]]:
    """A system prompt of rules and facts (~target_tokens with its tools)."""
    role, tools = AGENTS[name]
    rules = [f"You are {role}. Answer briefly and cite what you used."]
    while sum(len(r) for r in rules) < target_tokens * 4 - 600:
        topic, n = rng.choice(TOPICS), rng.randrange(1000)
        rules.append(
            f"- Rule {len(rules)}: when a request mentions {topic}, first check runbook "
            f"section {n // 100}.{n % 100} and quote the exact command before anything else."
        )
    definitions = [
        {
            "type": "function",
            "function": {
                "name": tool,
                "description": f"{tool.replace('_', ' ')} for {role}",
                "parameters": {
                    "type": "object",
                    "properties": {"target": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["target"],
                },
            },
        }
        for tool in tools
    ]
    return {"role": "system", "content": "\n".join(rules)}, definitions


@dataclass
class Workload:
    agents: dict[str, tuple[dict[str, Any], list[Any]]]
    sessions: list[tuple[str, str, list[str]]]  # (session id, agent, user messages)


def workload(sessions: int, turns: int, seed: int = 7) -> Workload:
    rng = random.Random(seed)
    agents = {name: agent(name, rng, rng.randrange(800, 1500)) for name in AGENTS}
    out = []
    for i in range(sessions):
        name = list(AGENTS)[i % len(AGENTS)]
        questions = [
            f"Session {i}, turn {t}: what should I do about {rng.choice(TOPICS)} in "
            f"service-{rng.randrange(50)}? It started {rng.randrange(2, 90)} minutes ago."
            for t in range(turns)
        ]
        out.append((f"s{i:03d}", name, questions))
    return Workload(agents, out)


# -- processes -------------------------------------------------------------------------


def daemon(model: str, cache_mb: int, block_size: int | None) -> Proc:
    options = ["--cache-memory-mb", str(cache_mb), "--log-level", "warning"]
    if block_size:
        options += ["--block-size", str(block_size)]
    port = free_port()
    log = tmp_log(f"bench-fleet-{port}")
    return serve(*options, model=model, token=TOKEN, port=port, log=log, poll=0.2)


def warm(daemons: list[Proc], load: Workload, agents: bool = True) -> None:
    """Clear every cache; then warm the agents' system prompts and tools on every daemon."""
    prompts = [{"name": n, "messages": [s], "tools": t} for n, (s, t) in load.agents.items()]
    for d in daemons:
        httpx.delete(f"{d.url}/v1/warm-sets/bench/agents", headers=AUTH, timeout=60)
        httpx.delete(f"{d.url}/v1/cache/prefix", headers=AUTH, timeout=60).raise_for_status()
        if not agents:
            continue
        body = {"generation": 1, "prompts": prompts}
        r = httpx.put(f"{d.url}/v1/warm-sets/bench/agents", json=body, headers=AUTH, timeout=60)
        r.raise_for_status()
    for d in daemons:
        wait_warm(d.url, timeout=600, poll=0.2)


def counters(daemons: list[Proc]) -> dict[str, tuple[int, int]]:
    """(hit tokens, queried tokens) per daemon that answers."""
    out = {}
    for d in daemons:
        try:
            cache = httpx.get(f"{d.url}/v1/status", headers=AUTH, timeout=10).json()["cache"]
        except (httpx.HTTPError, KeyError, ValueError):
            continue  # a killed daemon
        out[d.url] = (cache["hit_tokens"], cache["queried_tokens"])
    return out


def deltas(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> tuple[int, int]:
    """Fleet hit and queried tokens between two readings (a daemon missing from `after`
    was killed: its last reading before that stands in)."""
    hits = queried = 0
    for url, (h0, q0) in before.items():
        h1, q1 = after.get(url, (h0, q0))
        hits, queried = hits + h1 - h0, queried + q1 - q0
    return hits, queried


def router_predictions(front: Proc) -> Counter[str]:
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(httpx.get(f"{front.url}/metrics").text):
        for s in family.samples:
            if s.name == "warmfleet_router_predictions_total":
                # Only event-backed predictions measure the index; history guesses apart.
                source = s.labels.get("warmfleet_prediction_source")
                prefix = "" if source == "events" else f"{source}:"
                out[prefix + s.labels["warmfleet_prediction"]] += int(s.value)
    return out


# -- the client --------------------------------------------------------------------------


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    backends: Counter[str] = field(default_factory=Counter)
    failed_before_first_byte: int = 0
    failed_after_first_byte: int = 0
    requests: int = 0


async def chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], out: Result
) -> str | None:
    started, first, text = time.perf_counter(), None, []
    out.requests += 1
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            if r.status_code != 200:
                await r.aread()
                out.failed_before_first_byte += 1
                return None
            out.backends[r.headers.get("x-warmfleet-backend", url)] += 1
            async for line in r.aiter_lines():
                chunk = sse_data(line)
                if chunk is None:
                    continue
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                for choice in chunk.get("choices", []):
                    if choice["delta"].get("content"):
                        first = first or time.perf_counter()
                        text.append(choice["delta"]["content"])
    except (httpx.HTTPError, RuntimeError):
        if first is None:
            out.failed_before_first_byte += 1
        else:
            out.failed_after_first_byte += 1
        return None
    out.ttft.append((first or time.perf_counter()) - started)
    return "".join(text)


async def drive(
    url: str,
    load: Workload,
    concurrency: int,
    max_tokens: int,
    affinity: bool,
    on_request: Any,
    think: float = 0.0,
) -> Result:
    out = Result()
    gate = asyncio.Semaphore(concurrency)
    pauses = random.Random(11)  # the same think times for every policy
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=600.0)) as client:

        async def session(sid: str, name: str, questions: list[str]) -> None:
            system, tools = load.agents[name]
            history: list[dict[str, Any]] = [system]
            headers = {"x-session-affinity": sid} if affinity else {}
            async with gate:
                for question in questions:
                    history.append({"role": "user", "content": question})
                    body = {
                        "model": "default",
                        "messages": history,
                        "tools": tools,
                        "temperature": 0,
                        "max_tokens": max_tokens,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                    on_request(out.requests)
                    reply = await chat(client, url, body, headers, out)
                    history.append({"role": "assistant", "content": reply or ""})
                    # An agent runs its tool or the user reads before the next turn.
                    await asyncio.sleep(think * pauses.uniform(0.5, 1.5))

        await asyncio.gather(*(session(*s) for s in load.sessions))
    return out


# -- the runs ----------------------------------------------------------------------------


def run_policy(
    policy: str, daemons: list[Proc], load: Workload, args: argparse.Namespace, kill: bool = False
) -> dict[str, Any]:
    warm(daemons, load, not args.no_warm)
    port = free_port()
    options = ["--policy", policy, "--log-level", "warning"]
    urls = [d.url for d in daemons]
    log = tmp_log(f"bench-fleet-{port}")
    front = router(urls, *options, token=TOKEN, port=port, log=log, poll=0.2)
    try:
        wait_following(front.url, AUTH)
        before = counters(daemons)
        total = len(load.sessions) * len(load.sessions[0][2])
        victim = daemons[-1]
        last_seen: dict[str, tuple[int, int]] = {}

        def on_request(n: int) -> None:
            if kill and n == total // 3 and victim.process.poll() is None:
                last_seen.update(counters([victim]))  # what it did until now
                victim.process.kill()

        watcher = DecisionLog(front.url) if args.mispredictions else None
        t0 = time.perf_counter()
        result = asyncio.run(
            drive(
                front.url,
                load,
                args.concurrency,
                args.max_tokens,
                policy == "session",
                on_request,
                args.think,
            )
        )
        wall = time.perf_counter() - t0
        if watcher is not None:
            watcher.stop(args.mispredictions, policy)
        hits, queried = deltas(before, {**last_seen, **counters(daemons)})
        predictions = router_predictions(front)
    finally:
        front.stop()
    name = policy + (" (one daemon killed)" if kill else "")
    return summary(name, result, wall, hits, queried, predictions, len(daemons))


class DecisionLog:
    """Every decision the router reports (its status keeps the last 100: read often),
    for `--mispredictions`: those whose predicted cached tokens were not the actual."""

    def __init__(self, url: str) -> None:
        import threading

        self.url = url
        self.seen: dict[tuple[float, str], dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(0.2)

    def _read(self) -> None:
        try:
            status = httpx.get(f"{self.url}/v1/router/status", headers=AUTH, timeout=10)
            decisions = status.json()["decisions"]
        except (httpx.HTTPError, ValueError, KeyError):
            return
        for d in decisions:
            self.seen[(d["time"], d["backend"])] = d

    def stop(self, path: Path, policy: str) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
        judged = [d for d in self.seen.values() if d.get("predicted_cached_tokens") is not None]
        wrong = sorted(
            (d for d in judged if d["predicted_cached_tokens"] != d["cached_tokens"]),
            key=lambda d: d["time"],
        )
        print(f"{policy}: {len(wrong)} of {len(judged)} predictions off (see {path})")
        path.write_text(json.dumps(wrong, indent=2))


def run_single(load: Workload, args: argparse.Namespace) -> dict[str, Any]:
    one = daemon(args.model, args.cache_memory_mb * args.daemons, args.block_size)
    try:
        warm([one], load, not args.no_warm)
        before = counters([one])
        t0 = time.perf_counter()
        result = asyncio.run(
            drive(
                one.url, load, args.concurrency, args.max_tokens, False, lambda n: None, args.think
            )
        )
        wall = time.perf_counter() - t0
        hits, queried = deltas(before, counters([one]))
    finally:
        one.stop()
    return summary(f"one daemon, {args.daemons}x budget", result, wall, hits, queried, Counter(), 1)


def summary(
    name: str,
    result: Result,
    wall: float,
    hits: int,
    queried: int,
    predictions: Counter[str],
    daemons: int,
) -> dict[str, Any]:
    ttft = sorted(result.ttft)
    per_backend = [result.backends.get(k, 0) for k in result.backends] or [0]
    mean = sum(per_backend) / max(1, daemons)
    judged = sum(predictions[k] for k in ("exact", "over", "under"))
    return {
        "run": name,
        "requests": result.requests,
        "hit_rate": hits / queried if queried else 0.0,
        "ttft_p50_ms": 1000 * statistics.median(ttft) if ttft else None,
        "ttft_p95_ms": 1000 * ttft[int(0.95 * (len(ttft) - 1))] if ttft else None,
        "max_over_mean": max(per_backend) / mean if mean else None,
        "per_backend": dict(result.backends),
        "exact_predictions": predictions["exact"] / judged if judged else None,
        "predictions": dict(predictions),
        "failed_before_first_byte": result.failed_before_first_byte,
        "failed_after_first_byte": result.failed_after_first_byte,
        "wall_s": wall,
    }


def table(rows: list[dict[str, Any]]) -> str:
    def fmt(v: Any, spec: str) -> str:
        return "–" if v is None else format(v, spec)

    lines = [
        "| run | requests | fleet hit rate | TTFT p50 (ms) | TTFT p95 (ms) | max/mean requests "
        "| exact predictions | failed before / after 1st byte |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['requests']} | {r['hit_rate']:.1%} "
            f"| {fmt(r['ttft_p50_ms'], ',.0f')} | {fmt(r['ttft_p95_ms'], ',.0f')} "
            f"| {fmt(r['max_over_mean'], '.2f')} "
            f"| {fmt(r['exact_predictions'], '.1%')} "
            f"| {r['failed_before_first_byte']} / {r['failed_after_first_byte']} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--daemons", type=int, default=4)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--cache-memory-mb", type=int, default=12, help="per daemon")
    p.add_argument(
        "--think", type=float, default=1.0, help="mean seconds between a session's turns"
    )
    p.add_argument("--no-warm", action="store_true", help="do not warm the agents' prompts")
    p.add_argument("--block-size", type=int)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--kill-one", action="store_true", help="also: prefix with a daemon killed")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--json", type=Path, help="write the rows here too")
    p.add_argument(
        "--mispredictions", type=Path, help="write the decisions whose prediction was off here"
    )
    args = p.parse_args()
    load = workload(args.sessions, args.turns)
    rows = []
    if not args.no_baseline:
        rows.append(run_single(load, args))
        print(table(rows[-1:]), flush=True)
    daemons = [
        daemon(args.model, args.cache_memory_mb, args.block_size) for _ in range(args.daemons)
    ]
    try:
        for policy in args.policies.split(","):
            rows.append(run_policy(policy, daemons, load, args))
            print(table(rows[-1:]), flush=True)
        if args.kill_one:
            rows.append(run_policy("prefix", daemons, load, args, kill=True))
    finally:
        for d in daemons:
            d.stop()
    print(
        f"\n{args.daemons} daemons ({args.model}, {args.cache_memory_mb} MiB cache each), "
        f"{args.sessions} sessions x {args.turns} turns, {args.concurrency} at a time, "
        f"{args.think:g} s between turns, agents {'not ' if args.no_warm else ''}warmed:\n"
    )
    print(table(rows))
    for r in rows:  # what the exact-prediction column leaves out, and why
        if r.get("predictions"):
            print(f"{r['run']}: predictions by source and result: {r['predictions']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
