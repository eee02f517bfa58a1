"""The router's memory against backends that never end (issue #23's cases): its
resident size at idle, then the most it reaches while each case runs for `--seconds`.

Cases (a fake backend for each, aiohttp): an endless chat body, an endless 500 body,
one endless line on /v1/cache/events, an endless /v1/cache/snapshot, an endless
/v1/models and /v1/status, a flood of distinct `stored` events, a chat that trickles a
byte at a time, clients sending 60 KB session keys, and 7 MB requests. Requests are sent 8 at a time
throughout (non-streamed, except for the trickle); the router runs with its defaults.

    .venv/bin/python bench/router_bounds.py --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from harness.processes import free_port, launch, rss_mib, tmp_log
from harness.warmfleet import router

CASES = (
    "endless-chat-body",
    "endless-error-body",
    "endless-event-line",
    "endless-snapshot",
    "endless-models",
    "stored-flood",
    "trickling-chat",
    "huge-session-keys",
    "7mb-requests",
)
CHUNK = b"x" * 65536


def serve(case: str, port: int) -> None:
    from aiohttp import web

    async def endless(request: web.Request, status: int = 200, pause: float = 0.0,
                      piece: bytes = CHUNK) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(status=status, headers={"content-type": "application/json"})
        await response.prepare(request)
        while True:
            await response.write(piece)
            await asyncio.sleep(pause)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        if case == "endless-chat-body":
            return await endless(request)
        if case == "endless-error-body":
            return await endless(request, status=500)
        if case == "trickling-chat":
            return await endless(request, pause=1.0, piece=b" ")
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 1}})

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(b'{"type":"hello","epoch":"e1","seq":0}\n')
        if case == "endless-event-line":
            while True:
                await response.write(CHUNK)
                await asyncio.sleep(0)
        seq = 0
        while case == "stored-flood":
            lines = []
            for _ in range(1000):
                seq += 1
                key = seq.to_bytes(16, "big").hex()
                lines.append(f'{{"type":"stored","seq":{seq},"key":"{key}","logits":false}}\n')
            await response.write("".join(lines).encode())
            await asyncio.sleep(0)
        while True:
            await asyncio.sleep(1)
            await response.write(f'{{"type":"heartbeat","seq":{seq}}}\n'.encode())

    def fixed(body: Any) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.json_response(body)

        return handler

    async def models(request: web.Request) -> web.StreamResponse:
        if case == "endless-models":
            return await endless(request)
        return web.json_response({"data": [{"id": "m"}]})

    async def snapshot(request: web.Request) -> web.StreamResponse:
        if case == "endless-snapshot":
            return await endless(request)
        return web.json_response({"epoch": "e1", "seq": 0, "fingerprint": None, "blocks": []})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/readyz", fixed({"status": "ready"}))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/status", models)
    app.router.add_get("/v1/cache/snapshot", snapshot)
    app.router.add_get("/v1/cache/events", events)
    app.router.add_get("/v1/warm-sets", fixed({"sets": []}))
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def load(url: str, case: str, seconds: float) -> int:
    import aiohttp

    sent = 0
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int) -> None:
            nonlocal sent
            while time.monotonic() < deadline:
                headers = {}
                if case == "huge-session-keys":
                    headers["x-session-affinity"] = f"{i}-{sent}-" + "k" * 60_000
                content = f"hi {sent} " + ("x" * (7 << 20) if case == "7mb-requests" else "")
                body = {"model": "m", "messages": [{"role": "user", "content": content}]}
                sent += 1
                try:
                    async with session.post(f"{url}/v1/chat/completions", json=body,
                                            headers=headers) as r:  # fmt: skip
                        await r.read()
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass

        await asyncio.gather(*(one(i) for i in range(8)))
    return sent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return 0
    rows = []
    for case in args.cases.split(","):
        port = free_port()
        serve_cmd = [sys.executable, __file__, "--serve", case, str(port)]
        log = tmp_log(f"router-bounds-{case}")
        backend = launch(serve_cmd, port, name=f"bounds-{case}", log=log, poll=0.2)
        log = tmp_log(f"router-bounds-router-{case}")
        front = router([backend.url], "--log-level", "error", ready="/healthz", log=log, poll=0.2)
        try:
            time.sleep(3)
            idle = rss_mib(front.process.pid)
            peak = idle
            loop = asyncio.new_event_loop()
            task = loop.create_task(load(front.url, case, args.seconds))
            while not task.done():
                loop.run_until_complete(asyncio.sleep(0.25))
                peak = max(peak, rss_mib(front.process.pid))
            sent = task.result()
            loop.close()
            end = rss_mib(front.process.pid)
            row = {"case": case, "idle_mb": idle, "peak_mb": peak, "end_mb": end,
                   "above_idle_mb": peak - idle, "requests": sent}  # fmt: skip
            rows.append(row)
            print(f"{case:20} idle {idle:6.0f} MB  peak {peak:6.0f} MB  (+{peak - idle:4.0f})  "
                  f"after {end:6.0f} MB  requests sent {sent}", flush=True)  # fmt: skip
        finally:
            front.stop()
            backend.stop()
    worst = max(r["above_idle_mb"] for r in rows)
    print(f"\nworst: +{worst:.0f} MB above idle (documented bound: 256 MB): "
          f"{'within' if worst <= 256 else 'OVER'}")  # fmt: skip
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
