"""What a full garbage collection costs in a loaded daemon or router, with the startup heap
frozen (as `warmfleet serve` and `warmfleet router` do, warmfleet_common.heap) and without.

Runs the command with gc callbacks in the process, drives chat requests at it, then
times one full collection at exit, and counts the full collections Python ran on its own
(not a `gc.collect()`) while the requests ran: each one stops every thread. Without the
freeze, the command's `gc.freeze()` is made a no-op; all else is the same process.

    .venv/bin/python bench/gc_heap.py --target daemon --runs 2   # the embedded model
    .venv/bin/python bench/gc_heap.py --target router --runs 2   # over a tiny-random daemon
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from harness.processes import free_port, launch, tmp_log
from harness.warmfleet import serve

HERE = Path(__file__).resolve()


def child(report: str, freeze: bool, argv: list[str]) -> int:
    """In the measured process: record every full collection, then time one at exit."""
    import atexit

    started: list[float] = []
    fulls: list[tuple[float, float]] = []  # (when, seconds)
    freezes: list[float] = []  # when the command froze its heap

    explicit = [0]  # gc.collect() calls in progress (the command's own freeze has one)
    collect = gc.collect

    def counted_collect(generation: int = 2) -> int:
        explicit[0] += 1
        try:
            return collect(generation)
        finally:
            explicit[0] -= 1

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif info["generation"] == 2 and started and not explicit[0]:
            fulls.append((time.time(), time.perf_counter() - started[0]))

    def write() -> None:
        began = time.perf_counter()
        collect()
        seconds = time.perf_counter() - began
        Path(report).write_text(json.dumps({
            "explicit_s": seconds, "fulls": fulls, "freezes": freezes,
            "frozen": gc.get_freeze_count(), "scanned": len(gc.get_objects()),
        }))  # fmt: skip

    gc.callbacks.append(watch)
    gc.collect = counted_collect
    real_freeze = gc.freeze

    def counted_freeze() -> None:
        freezes.append(time.time())
        if freeze:
            real_freeze()

    gc.freeze = counted_freeze
    atexit.register(write)
    from warmfleet_cli.main import main as warmfleet

    return warmfleet(argv)


def child_command(report: str, freeze: bool, argv: list[str]) -> list[str]:
    setting = "--freeze" if freeze else "--no-freeze"
    return [sys.executable, str(HERE), "--child", report, setting, "--", *argv]


async def drive(url: str, requests: int, concurrency: int, max_tokens: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(i: int) -> None:
            async with gate:
                words = f"Request {i}: " + "tell me more. " * 40
                body = {
                    "model": "default", "max_tokens": max_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": words}],
                }  # fmt: skip
                answer = await client.post(f"{url}/v1/chat/completions", json=body)
                answer.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(requests)))


def run_once(args: argparse.Namespace, freeze: bool, backend: str | None) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if args.target == "daemon":
        argv = ["serve", "--model", args.model, "--port", str(port)]
    else:
        argv = ["router", "--backend", str(backend), "--port", str(port)]
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        command = child_command(report.name, freeze, argv)
        log = tmp_log(f"gc-heap-{args.target}")
        measured = launch(command, port, name=args.target, log=log, poll=0.2)
        try:
            began = time.time()
            asyncio.run(drive(url, args.requests, args.concurrency, args.max_tokens))
            ended = time.time()
        finally:
            measured.stop()  # SIGINT: the child writes its report as it exits
        result: dict[str, Any] = json.loads(Path(report.name).read_text())
    during = [seconds for when, seconds in result["fulls"] if began <= when <= ended]
    at = [when - began for when, _ in result["fulls"] if began <= when <= ended]
    froze = [when - began for when in result["freezes"]]
    return {**result, "during": during, "at": at, "froze_at": froze, "load_s": ended - began}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", choices=["daemon", "router"], default="daemon")
    p.add_argument("--model", default="default", help="the daemon's model (--target daemon)")
    p.add_argument("--runs", type=int, default=2, help="per setting, alternating")
    p.add_argument("--requests", type=int, help="default: 16 (daemon), 1500 (router)")
    p.add_argument("--concurrency", type=int, help="default: 8 (daemon), 16 (router)")
    p.add_argument("--max-tokens", type=int, help="default: 64 (daemon), 1 (router)")
    args = p.parse_args()
    daemon = args.target == "daemon"
    args.requests = args.requests or (16 if daemon else 1500)
    args.concurrency = args.concurrency or (8 if daemon else 16)
    args.max_tokens = args.max_tokens or (64 if daemon else 1)

    server = None
    if not daemon:  # the router's backend: a tiny-random daemon, outside the measurement
        log = tmp_log("gc-heap-backend")
        server = serve("--block-size", "32", model="tiny-random", name="backend", log=log, poll=0.2)
    backend = server.url if server else None
    results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    try:
        for run in range(args.runs):
            for freeze in (False, True):
                results[freeze].append(run_once(args, freeze, backend))
                r = results[freeze][-1]
                print(
                    f"run {run + 1} {'frozen' if freeze else 'unfrozen'}: full collection "
                    f"{r['explicit_s'] * 1000:.1f} ms over {r['scanned']:,} objects "
                    f"({r['frozen']:,} frozen); {len(r['during'])} on its own in "
                    f"{r['load_s']:.0f} s of load"
                    + "".join(
                        f"; {ms * 1000:.0f} ms at {t:.1f} s" for ms, t in zip(r["during"], r["at"])
                    )
                    + f"; froze at {', '.join(f'{t:.1f}' for t in r['froze_at'])} s",
                    flush=True,
                )
    finally:
        if server is not None:
            server.stop()

    print(f"\n{args.target}, {args.requests} requests at c={args.concurrency}, {args.runs} runs:")
    for freeze in (False, True):
        ms = [r["explicit_s"] * 1000 for r in results[freeze]]
        print(
            f"  {'frozen  ' if freeze else 'unfrozen'} full collection: median "
            f"{statistics.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f})"
        )
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        at = sys.argv.index("--child")
        report, setting = sys.argv[at + 1], sys.argv[at + 2]
        sys.exit(child(report, setting == "--freeze", sys.argv[sys.argv.index("--") + 1 :]))
    sys.exit(main())
