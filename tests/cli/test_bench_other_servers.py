"""bench-serve against servers that are not warmfleet, emulated in process: one like
mlx_lm.server without a Hugging Face cache (GET /v1/models: 200 and an empty body; the
served model answers to "default_model") that, like vllm-mlx, sends no
`prompt_tokens_details.cached_tokens`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from rich.console import Console

from support.processes import serving
from warmfleet_cli.bench_serve import compare
from warmfleet_cli.bench_serve.prompt_sets import load_prompt_sets
from warmfleet_cli.bench_serve.report import results_table
from warmfleet_cli.bench_serve.serve import BenchOptions, run


def mlx_lm_like() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> Response:
        return Response(b"", media_type="application/json")  # its scan of the HF cache failed

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        if body.get("model") != "default_model":
            return JSONResponse({"error": "model not found"}, status_code=404)

        async def events() -> AsyncIterator[bytes]:
            for text in ("Hello", " there"):
                chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            usage = {"prompt_tokens": 900, "completion_tokens": 2, "total_tokens": 902}
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            yield f"data: {json.dumps(end)}\n\n".encode()
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_an_empty_model_list_falls_back_and_missing_cached_tokens_are_said() -> None:
    with serving(mlx_lm_like()) as url:
        bench = run(
            BenchOptions(
                url=url, prompt_sets=load_prompt_sets("short"), concurrency=[2], max_tokens=2
            )
        )
    assert bench.server.model == "default_model"
    [row] = bench.rows
    assert row["ok"] == 2 and row["cached_token_share"] is None
    console = Console(width=200, record=True)
    console.print(results_table(bench))
    assert "not reported" in console.export_text()
    table = compare.markdown(compare.compare(bench.rows, bench.rows), "cold", "warm")
    assert "not reported" in table
