"""What the router adds to a request: latency at p50/p99 and routed requests per second,
the router (and its key workers) on one core, everything else on the other cores.

Cells: prompts of about 1k, 8k and 32k tokens (a shared system prompt of that size and
a short question unique to each request, as agents send them) at concurrency 1, 16 and
128, `max_tokens: 1`, non-streamed. Each cell is sent directly to the backends
(round-robin from the client) and through the router, one after the other, in the same
run; the router's added latency is the difference of the two. Backends:

- `instant`: two fake warmfleet daemons (`harness/fake_daemon.py`) that answer at once,
  serving a real daemon's cache layout (so the router tokenizes and keys as it would
  in front of real ones) and a 128k-token context;
- `daemons`: two real `warmfleet serve --model tiny-random` daemons (8,192-token
  context: the 32k rows are left out).

With `--peer sglang` (the `sglang-router` wheel from PyPI, in its own virtualenv:
`--peer-python`), the same instant cells go through SGLang's router (`--policy
cache_aware`) too.

    .venv/bin/python bench/router_overhead.py                       # everything
    .venv/bin/python bench/router_overhead.py --backends instant --peer sglang \\
        --peer-python /tmp/peer-venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from harness.processes import Proc, cpu_seconds, free_port, launch, tmp_log
from harness.warmfleet import router as warmfleet_router
from harness.warmfleet import serve

TARGETS = {  # the (#23)
    "added_p50_1k_c1_ms": 2.0,
    "added_p99_share_c16_c128": 0.10,
    "routed_per_s_one_core": 1000,
}
FAKE_DAEMON = str(Path(__file__).parent / "harness" / "fake_daemon.py")
WORDS = ("alert", "deploy", "latency", "runbook", "owner", "quota", "region", "shard")


def kept(name: str, cpus: set[int]) -> dict[str, Any]:
    """launch()'s options here: these CPUs, the output kept in router-overhead-NAME.log."""
    return {"name": name, "cpus": cpus, "log": tmp_log(f"router-overhead-{name}"), "poll": 0.2}


# -- load ------------------------------------------------------------------------------


def system_prompt(tokens: int, layout_file: str) -> str:
    """A system prompt of at most `tokens` tokens (within 2%) in the daemon's tokenizer."""
    from warmfleet_common.cache_layout import CacheLayout, LayoutTokenizer

    tokenizer = LayoutTokenizer(CacheLayout.model_validate_json(Path(layout_file).read_bytes()))

    def text(words: int) -> str:
        body = " ".join(f"{WORDS[k % len(WORDS)]}-{k % 97}" for k in range(words))
        return "You are the on-call agent. Rules: " + body

    words = tokens // 4
    for _ in range(6):  # scale the word count towards the target
        count = len(tokenizer.encode(text(words), add_special_tokens=False))
        if 0.98 * tokens <= count <= tokens:
            break
        words = max(1, int(words * tokens / count * (0.99 if count > tokens else 1.0)))
    return text(words)


async def drive(urls: list[str], system: str, concurrency: int, count: int) -> dict[str, float]:
    """`count` requests, `concurrency` at a time, over `urls` in turn: latency and rate."""
    import aiohttp

    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal failures
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = {
                    "model": "default",
                    "max_tokens": 1,
                    "temperature": 0,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"Request {i}: which shard is hot?"},
                    ],
                }
                began = time.perf_counter()
                async with session.post(
                    f"{urls[i % len(urls)]}/v1/chat/completions", json=body
                ) as r:
                    await r.read()
                    if r.status != 200:
                        failures += 1
                        continue
                latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        if latencies else float("nan"),
        "per_s": len(latencies) / elapsed,
        "failed": failures,
    }  # fmt: skip


def requests_for(concurrency: int, scale: float) -> int:
    return max(concurrency * 4, int({1: 200, 16: 800, 128: 2000}[concurrency] * scale))


# -- main ------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="instant,daemons")
    p.add_argument("--sizes", default="1000,8000,32000")
    p.add_argument("--concurrency", default="1,16,128")
    p.add_argument("--scale", type=float, default=1.0, help="requests per cell x this")
    p.add_argument("--repeats", type=int, default=3, help="runs of each cell (medians)")
    p.add_argument("--router-cpu", type=int, default=0, help="the core the router runs on")
    p.add_argument("--key-workers", type=int, default=2)
    p.add_argument(
        "--peer",
        choices=["", "sglang", "warmfleet"],
        default="",
        help="a router measured the same way: SGLang's, or another warmfleet build "
        "(e.g. an earlier commit's venv) run with --peer-python",
    )
    p.add_argument("--peer-python", default="python3")
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args()
    all_cpus = os.sched_getaffinity(0)
    router_cpus = {args.router_cpu}
    others = (all_cpus - router_cpus) or all_cpus
    os.sched_setaffinity(0, others)  # the load generator
    sizes = [int(s) for s in args.sizes.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"router on CPU {sorted(router_cpus)}; backends and client on {sorted(others)}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip

    procs: list[Proc] = []
    rows: list[dict[str, Any]] = []
    try:
        tiny = [
            serve("--block-size", "32", "--log-level", "warning", model="tiny-random",
                  **kept(f"daemon-{i}", others))
            for i in range(2)
        ]  # fmt: skip
        procs += tiny
        layout_file = str(Path(tempfile.gettempdir()) / "router-overhead-layout.json")
        Path(layout_file).write_bytes(
            httpx.get(f"{tiny[0].url}/v1/cache/layout", timeout=60).content
        )
        prompts = {n: system_prompt(n, layout_file) for n in sizes}
        for kind in args.backends.split(","):
            if kind == "instant":
                ports = [free_port(), free_port()]
                backends = [
                    launch([sys.executable, FAKE_DAEMON, str(port), layout_file],
                           port, **kept(f"fake-{port}", others))
                    for port in ports
                ]  # fmt: skip
                procs += backends
            else:
                backends = tiny
            urls = [b.url for b in backends]
            routers = {"warmfleet": ["prefix"]}
            if args.peer == "sglang" and kind == "instant":
                routers["sglang"] = ["cache_aware"]
            if args.peer == "warmfleet":
                routers["warmfleet-peer"] = ["prefix"]
            for router_name in routers:
                options = kept(f"router-{router_name}", router_cpus)
                if router_name.startswith("warmfleet"):
                    python = args.peer_python if router_name == "warmfleet-peer" else sys.executable
                    workers = ["--key-workers", str(args.key_workers)]
                    router = warmfleet_router(
                        urls, "--log-level", "warning", *workers, python=python, **options
                    )
                else:
                    port = free_port()
                    cmd = [args.peer_python, "-m", "sglang_router.launch_router",
                           "--worker-urls", *urls, "--policy", "cache_aware", "--port", str(port),
                           "--health-check-endpoint", "/readyz", "--log-level", "warn"]  # fmt: skip
                    router = launch(cmd, port, "/v1/models", **options)
                time.sleep(2.0)  # layouts loaded, first health checks done
                try:
                    for size in sizes:
                        if kind == "daemons" and size > 8000:
                            continue
                        for c in levels:
                            count = requests_for(c, args.scale if kind == "instant" else
                                                 args.scale / 10)  # fmt: skip
                            if kind == "daemons" and size >= 8000:
                                count = max(c * 2, count // 4)
                            runs: list[tuple[dict[str, float], dict[str, float], float]] = []
                            asyncio.run(drive([router.url], prompts[size], c, min(count, 20)))
                            for _ in range(args.repeats):
                                direct = asyncio.run(drive(urls, prompts[size], c, count))
                                cpu = cpu_seconds(router.process.pid)
                                via = asyncio.run(drive([router.url], prompts[size], c, count))
                                cpu = cpu_seconds(router.process.pid) - cpu
                                runs.append((direct, via, cpu / max(1, count)))
                            row = summarize(kind, router_name, size, c, count, runs)
                            rows.append(row)
                            print(line(row), flush=True)
                finally:
                    router.stop()
    finally:
        for proc in procs:
            proc.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(verdict(rows))
    return 0


def summarize(
    kind: str, router: str, size: int, c: int, count: int,
    runs: list[tuple[dict[str, float], dict[str, float], float]],
) -> dict[str, Any]:  # fmt: skip
    def med(values: list[float]) -> float:
        return statistics.median(values)

    def spread(values: list[float]) -> str:
        return f"{min(values):.1f}-{max(values):.1f}"

    added50 = [v["p50_ms"] - d["p50_ms"] for d, v, _ in runs]
    added99 = [v["p99_ms"] - d["p99_ms"] for d, v, _ in runs]
    return {
        "backends": kind, "router": router, "tokens": size, "concurrency": c, "requests": count,
        "direct_p50_ms": med([d["p50_ms"] for d, _, _ in runs]),
        "direct_p99_ms": med([d["p99_ms"] for d, _, _ in runs]),
        "via_p50_ms": med([v["p50_ms"] for _, v, _ in runs]),
        "via_p99_ms": med([v["p99_ms"] for _, v, _ in runs]),
        "added_p50_ms": med(added50), "added_p50_spread": spread(added50),
        "added_p99_ms": med(added99), "added_p99_spread": spread(added99),
        "routed_per_s": med([v["per_s"] for _, v, _ in runs]),
        "router_cpu_ms_per_request": 1000 * med([cpu for _, _, cpu in runs]),
        "failed": sum(v["failed"] for _, v, _ in runs),
    }  # fmt: skip


def line(row: dict[str, Any]) -> str:
    return (
        f"{row['backends']:8} {row['router']:9} {row['tokens']:>6} tok c={row['concurrency']:<3} "
        f"direct p50/p99 {row['direct_p50_ms']:8.1f}/{row['direct_p99_ms']:8.1f} ms  "
        f"via {row['via_p50_ms']:8.1f}/{row['via_p99_ms']:8.1f} ms  "
        f"added p50 {row['added_p50_ms']:7.1f} ({row['added_p50_spread']}) "
        f"p99 {row['added_p99_ms']:8.1f} ({row['added_p99_spread']})  "
        f"{row['routed_per_s']:7.0f} req/s  cpu {row['router_cpu_ms_per_request']:.2f} ms/req  "
        f"failed {row['failed']}"
    )


def verdict(rows: list[dict[str, Any]]) -> str:
    ours = [r for r in rows if r["router"] == "warmfleet"]
    out = ["", "targets (issue #23):"]
    for r in ours:
        if r["backends"] == "instant" and r["tokens"] == 1000 and r["concurrency"] == 1:
            ok = r["added_p50_ms"] <= TARGETS["added_p50_1k_c1_ms"]
            out.append(f"  added p50, 1k tokens, c=1: {r['added_p50_ms']:.2f} ms (target <= 2 ms): "
                       f"{'met' if ok else 'MISSED'}")  # fmt: skip
    for r in ours:
        if r["backends"] == "daemons" and r["concurrency"] in (16, 128):
            share = r["added_p99_ms"] / r["direct_p99_ms"]
            ok = share <= TARGETS["added_p99_share_c16_c128"]
            out.append(f"  added p99, daemons, {r['tokens']} tokens, c={r['concurrency']}: "
                       f"{100 * share:.0f}% of direct (target <= 10%): "
                       f"{'met' if ok else 'MISSED'}")  # fmt: skip
    best = max((r["routed_per_s"] for r in ours if r["backends"] == "instant"), default=0.0)
    ok = best >= TARGETS["routed_per_s_one_core"]
    out.append(f"  routed requests/s on one core, instant backends: {best:.0f} (target >= 1000): "
               f"{'met' if ok else 'MISSED'}")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
