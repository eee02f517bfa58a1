"""What the router costs to relay a token stream: its CPU per streamed event and per
request, with the router on a core of its own and everything else on the others.

Two fake warmfleet daemons (`harness/fake_daemon.py`) stream `--events` one-token
events a request, `--gap` seconds apart (a daemon's pace, each event its own write);
`--concurrency` clients stream chat completions through the router (`stream: true`,
`stream_options.include_usage`, a ~1k-token system prompt) and read every event. The
router's CPU (its process and its children, from /proc) over the load, divided by the
events and the requests relayed. `--peer-checkout DIR` runs the same load through the
router of another checkout (e.g. `git worktree add /tmp/parent HEAD~1`) in the same run,
alternating, so the two are measured side by side. Medians of `--runs` with their range.

    .venv/bin/python bench/router_relay.py [--events 600] [--requests 200]
        [--concurrency 32] [--runs 3] [--peer-checkout DIR]

Linux only (/proc, sched_setaffinity).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from harness.figures import spread
from harness.processes import Proc, cpu_seconds, free_port, launch, tmp_log
from harness.warmfleet import router as warmfleet_router
from harness.warmfleet import serve
from router_overhead import system_prompt

FAKE_DAEMON = str(Path(__file__).parent / "harness" / "fake_daemon.py")
CODE = ("common", "daemon", "router", "operator", "cli")


async def load(url: str, system: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """`args.requests` streamed chats, `args.concurrency` at a time: (requests answered in
    full, events read, failures)."""
    import aiohttp

    answered = events = failed = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(args.requests):
        queue.put_nowait(i)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:

        async def worker() -> None:
            nonlocal answered, events, failed
            while not queue.empty():
                i = queue.get_nowait()
                body = {
                    "model": "default", "max_tokens": args.events, "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": f"Request {i}: go on."}],
                }  # fmt: skip
                seen, done = 0, False
                async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                    async for line in r.content:
                        seen += line.startswith(b"data: ")
                        done = done or line.startswith(b"data: [DONE]")
                if r.status == 200 and done:
                    answered += 1
                    events += seen
                else:
                    failed += 1

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return answered, events, failed


def measure(router: Proc, system: str, args: argparse.Namespace) -> dict[str, float]:
    asyncio.run(load(router.url, system, argparse.Namespace(**{**vars(args), "requests": 8})))
    cpu = cpu_seconds(router.process.pid)
    began = time.perf_counter()
    answered, events, failed = asyncio.run(load(router.url, system, args))
    wall = time.perf_counter() - began
    cpu = cpu_seconds(router.process.pid) - cpu
    return {
        "us_per_event": cpu * 1e6 / max(1, events),
        "ms_per_request": cpu * 1e3 / max(1, answered),
        "core_share": cpu / wall,
        "events": events,
        "failed": failed,
    }


def start_router(urls: list[str], checkout: Path | None, cpus: set[int], name: str) -> Proc:
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(checkout / c) for c in CODE)
    log = tmp_log(f"router-relay-{name}")
    return warmfleet_router(urls, "--log-level", "warning", env=env, cpus=cpus, log=log)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, default=600, help="streamed tokens a request")
    p.add_argument("--gap", type=float, default=0.002, help="seconds between two events")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--router-cpu", type=int, default=0)
    p.add_argument("--peer-checkout", type=Path, help="another checkout's router, side by side")
    args = p.parse_args()
    router_cpus = {args.router_cpu}
    others = (os.sched_getaffinity(0) - router_cpus) or router_cpus
    os.sched_setaffinity(0, others)
    cpu_model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor())  # fmt: skip
    print(f"{cpu_model}; router on CPU {args.router_cpu}, the rest on {sorted(others)}; "
          f"{args.events} events a request, {args.gap * 1e3:g} ms apart, {args.requests} "
          f"requests, {args.concurrency} at a time", flush=True)  # fmt: skip

    procs: list[Proc] = []
    try:
        tiny = serve("--log-level", "warning", model="tiny-random", cpus=others)
        layout_file = str(Path(tempfile.gettempdir()) / "router-relay-layout.json")
        Path(layout_file).write_bytes(httpx.get(f"{tiny.url}/v1/cache/layout", timeout=60).content)
        system = system_prompt(1000, layout_file)
        tiny.stop()
        for _ in range(2):
            port = free_port()
            cmd = [sys.executable, FAKE_DAEMON, str(port), layout_file, str(args.gap)]
            procs.append(launch(cmd, port, name=f"fake-{port}", cpus=others))
        urls = [b.url for b in procs]
        codes: dict[str, Path | None] = {"this": None}
        if args.peer_checkout:
            codes["peer"] = args.peer_checkout
        results: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
        for run in range(args.runs):
            for name, checkout in codes.items():
                router = start_router(urls, checkout, router_cpus, name)
                try:
                    time.sleep(2.0)  # layouts loaded, first health checks done
                    figures = measure(router, system, args)
                finally:
                    router.stop()
                results[name].append(figures)
                print(f"run {run + 1} {name}: {figures['us_per_event']:.1f} us an event, "
                      f"{figures['ms_per_request']:.2f} ms a request, router core "
                      f"{figures['core_share'] * 100:.0f}% busy, {figures['failed']} failed",
                      flush=True)  # fmt: skip
    finally:
        for proc in procs:
            proc.stop()
    print()
    print("| router | CPU per event, us | CPU per request, ms | router core busy | failed |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {spread([r['us_per_event'] for r in runs])} | "
              f"{spread([r['ms_per_request'] for r in runs])} | "
              f"{statistics.median([r['core_share'] for r in runs]) * 100:.0f}% | "
              f"{sum(int(r['failed']) for r in runs)} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
