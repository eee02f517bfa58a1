"""A warmfleet daemon that answers every chat at once, for measuring what the router
alone costs: it serves a real daemon's cache layout (so the router tokenizes and keys
as it would in front of real ones) and a 128k-token context. A non-streamed chat gets
one token; a streamed one gets `max_tokens` events of one token each, `GAP` seconds
apart (a token stream's pace, each event its own write), then the finish, the usage
and `[DONE]` as a daemon sends them.

    python bench/harness/fake_daemon.py PORT LAYOUT_FILE [GAP]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "x", "object": "chat.completion.chunk", "choices": [choice], **extra}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def serve(port: int, layout_file: str, gap: float = 0.0) -> None:
    layout = Path(layout_file).read_bytes()
    fingerprint = json.loads(layout)["fingerprint"]
    answer = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "length"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                      "prompt_tokens_details": {"cached_tokens": 0}},
        }
    ).encode()  # fmt: skip

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=answer, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": ""}))
        tokens = int(body.get("max_tokens") or 16)
        for _ in range(tokens):
            await asyncio.sleep(gap)
            await response.write(chunk({"content": " ok"}))
        await response.write(chunk({}, "length"))
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        body = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        await response.write(b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(b'{"type":"hello","epoch":"e1","seq":0}\n')
        beat = float(request.query.get("heartbeat", "5"))
        while True:
            await asyncio.sleep(beat)
            await response.write(b'{"type":"heartbeat","seq":0}\n')

    def fixed(body: Any) -> Any:
        async def handler(_: web.Request) -> web.Response:
            return web.json_response(body)

        return handler

    async def layout_route(_: web.Request) -> web.Response:
        return web.Response(body=layout, content_type="application/json")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/readyz", fixed({"status": "ready"}))
    app.router.add_get("/health", fixed({"status": "ok"}))
    app.router.add_get("/v1/models", fixed({"object": "list", "data": [{"id": "default"}]}))
    app.router.add_get(
        "/v1/status", fixed({"model": {"id": "default", "aliases": ["default"],
                                       "context_length": 131072}})
    )  # fmt: skip
    app.router.add_get(
        "/v1/cache/snapshot",
        fixed({"epoch": "e1", "seq": 0, "fingerprint": fingerprint, "blocks": []}),
    )
    app.router.add_get("/v1/cache/layout", layout_route)
    app.router.add_get("/v1/cache/events", events)
    app.router.add_get("/v1/warm-sets", fixed({"sets": []}))
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
