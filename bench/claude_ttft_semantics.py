"""What Claude Code's `ttft_ms` measures: a fake Anthropic server streams a message whose
first text comes at --first seconds and whose end comes at --end seconds; the script
runs `claude -p` against it and prints when the CLI streamed the first text (its
`--include-partial-messages` events) next to the `ttft_ms` it reports.

    .venv/bin/python bench/claude_ttft_semantics.py --agents ~/agents [--first 1 --end 8]

Claude Code 2.1.332 printed first text at 1.17 s and ttft_ms 8,158: its ttft_ms is the end
of its first message, which is why bench/agents_ttft.py times the first text itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from harness.processes import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def app(first: float, end: float) -> Starlette:
    async def messages(request: Request) -> Response:
        model = (await request.json())["model"]

        async def events() -> Any:
            message = {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                       "content": [], "stop_reason": None, "stop_sequence": None,
                       "usage": {"input_tokens": 10, "output_tokens": 0}}  # fmt: skip
            yield sse("message_start", {"type": "message_start", "message": message})
            await asyncio.sleep(first)
            block = {"type": "text", "text": ""}
            yield sse("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": block})  # fmt: skip
            for _ in range(max(1, round(end - first))):  # a word a second until `end`
                delta = {"type": "text_delta", "text": "word "}
                yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                  "delta": delta})  # fmt: skip
                await asyncio.sleep(1)
            yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            stop = {"stop_reason": "end_turn", "stop_sequence": None}
            yield sse("message_delta", {"type": "message_delta", "delta": stop,
                                        "usage": {"output_tokens": 5}})  # fmt: skip
            yield sse("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def other(_: Request) -> Response:
        body = {"type": "error", "error": {"type": "not_found_error", "message": "not here"}}
        return JSONResponse(body, status_code=404)

    methods = ["GET", "POST"]
    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"]),
                             Route("/{path:path}", other, methods=methods)])  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--agents", type=Path, required=True, help="where the CLI was npm-installed")
    ap.add_argument("--first", type=float, default=1.0, help="seconds to the first text")
    ap.add_argument("--end", type=float, default=8.0, help="seconds to the message's end")
    args = ap.parse_args()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app(args.first, args.end), port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    home = tempfile.mkdtemp(prefix="claude-home-")
    env = {"PATH": os.environ["PATH"], "HOME": home, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
           "ANTHROPIC_API_KEY": "unused", "ANTHROPIC_MODEL": "fake",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}  # fmt: skip
    command = [str(args.agents / "node_modules/.bin/claude"), "-p", "hi", "--output-format",
               "stream-json", "--verbose", "--include-partial-messages"]  # fmt: skip
    started = time.monotonic()
    first_text = ttft_ms = None
    with subprocess.Popen(
        command, env=env, cwd=home, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if first_text is None and '"content_block_delta"' in line:
                first_text = time.monotonic() - started
            if line.startswith("{") and json.loads(line).get("type") == "result":
                ttft_ms = json.loads(line).get("ttft_ms")
    server.should_exit = True
    print(f"server: first text at {args.first:.1f} s, end at {args.end:.1f} s")
    shown = f"{first_text:.2f} s" if first_text is not None else "never"
    print(f"claude: first text streamed at {shown}; its ttft_ms {ttft_ms}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
