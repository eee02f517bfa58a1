"""`warmfleet bench-serve --profile-out` without a model: against a fake warmfleet daemon
in process (a prefix cache of chained blocks cut at message starts, RAM and a disk tier,
warm sets, the status figures), and the arithmetic from samples to a profile on made-up
samples. Nothing here asserts a speed: only which figures are measured, where, and how
they are computed; and the profile shipped for this machine loads."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from support.processes import serving
from warmfleet_cli.bench_serve.profile_build import build_profile, run_rates
from warmfleet_cli.bench_serve.profiling import (
    Chunk,
    DiskSample,
    Measurements,
    PositionSample,
    ProfileOptions,
    RunSample,
    ServerFacts,
    plan_chunks,
)
from warmfleet_cli.main import main
from warmfleet_common.perf_profile import load_profile, parse_profile

BLOCK, CONTEXT, KV, LOGITS, MAX_SEQS = 16, 512, 1000, 64, 4
SHIPPED = "linux-x86-2core-smollm2-135m-f32"


class FakeDaemon:
    """Caches chunks keyed by the tokens up to their end; a prompt is cut at its message
    starts and every block between; its last chunk keeps the logits (a repeat computes
    nothing). Every stored chunk is on disk too; deleting a warm set drops its chunks
    from RAM only. Computing and restoring sleep per token, far above the jitter of a
    busy machine."""

    def __init__(self, *, report_kv: bool) -> None:
        self.ram: dict[tuple[int, ...], int] = {}  # prefix -> bytes
        self.disk: set[tuple[int, ...]] = set()
        self.warm: dict[str, list[tuple[int, ...]]] = {}
        self.report_kv = report_kv
        self.requests = 0

    @staticmethod
    def ends(tokens: list[int], cuts: list[int]) -> list[int]:
        bounds = [0, *cuts, len(tokens)]
        out: list[int] = []
        for start, stop in itertools.pairwise(bounds):
            out += [*range(start + BLOCK, stop, BLOCK), stop]
        return sorted(set(out) - {0})

    def serve(self, tokens: list[int], cuts: list[int]) -> tuple[int, int, float]:
        """(cached from RAM, from disk, seconds before the first token); stores it all,
        the logits with the last chunk."""
        ram = disk = start = 0
        ends = self.ends(tokens, cuts)
        for end in ends:
            key = tuple(tokens[:end])
            if key in self.ram:
                ram += end - start
            elif key in self.disk:
                disk += end - start
            else:
                break
            start = end
        for i, end in enumerate(ends):
            size = (end - (ends[i - 1] if i else 0)) * KV + (LOGITS if end == len(tokens) else 0)
            self.ram.setdefault(tuple(tokens[:end]), size)
            self.disk.add(tuple(tokens[:end]))
        computed = len(tokens) - ram - disk
        # A cached prompt's first token comes from its logits: RAM restores wait for the next.
        seconds = 1e-3 * computed + 1e-3 * disk + (1e-4 * ram if computed else 0.0)
        return ram, disk, seconds

    def render(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        tokens, cuts = [1, 2, 3], []
        for m in messages:
            cuts.append(len(tokens))
            tokens += [10] + [100 + hash(w) % 5000 for w in str(m["content"]).split()] + [11]
        return tokens, cuts

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> Any:
            return {"data": [{"id": "fake", "max_model_len": CONTEXT}]}

        @app.get("/v1/status")
        async def status() -> Any:
            return {
                "version": "0.1.0",
                "model": {"id": "fake", "context_length": CONTEXT},
                "engine": {"running": 0, "block_size": BLOCK, "max_num_seqs": MAX_SEQS},
                "cache": {"bytes": sum(self.ram.values()), "budget_bytes": 1 << 30},
                "disk_tier": {"state": "on", "queued_blocks": 0},
                "tier_costs": {"kv_bytes_per_token": KV} if self.report_kv else None,
            }

        @app.delete("/v1/cache/prefix")
        async def clear() -> Any:
            self.ram.clear()
            self.disk.clear()
            return {"status": "cleared", "rewarm_scheduled": False, "entries_removed": 0}

        @app.put("/v1/warm-sets/{namespace}/{name}")
        async def put(name: str, request: Request) -> Any:
            body = await request.json()
            self.warm[name] = []
            for prompt in body["prompts"]:
                tokens, cuts = self.render(prompt["messages"])
                self.serve(tokens, cuts)
                self.warm[name] += [tuple(tokens[:e]) for e in self.ends(tokens, cuts)]
            return JSONResponse({}, status_code=202)

        @app.get("/v1/warm-sets/{namespace}/{name}")
        async def get(name: str) -> Any:
            return {"prompts": [{"state": "warm"} for _ in range(2)]}

        @app.delete("/v1/warm-sets/{namespace}/{name}")
        async def delete(name: str) -> Any:
            for key in reversed(self.warm.pop(name)):  # from RAM where nothing extends it
                if not any(len(k) > len(key) and k[: len(key)] == key for k in self.ram):
                    self.ram.pop(key, None)
            return {"status": "deleted"}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            return await self.stream(body, list(body["prompt"]), [], "text")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            tokens, cuts = self.render(body["messages"])
            return await self.stream(body, [*tokens, 12], [*cuts, len(tokens)], "delta")

        return app

    async def stream(
        self, body: dict[str, Any], tokens: list[int], cuts: list[int], shape: str
    ) -> StreamingResponse:
        assert body["ignore_eos"] and body["stream"]
        ram, disk, seconds = self.serve(tokens, cuts)
        n = body["max_tokens"]

        async def events() -> AsyncIterator[bytes]:
            await asyncio.sleep(seconds)
            for i in range(n):
                if i:
                    await asyncio.sleep(1e-3 + (1e-4 * len(tokens) if i == 1 else 0))
                piece = {"text": "x"} if shape == "text" else {"delta": {"content": "x"}}
                yield f"data: {json.dumps({'choices': [piece]})}\n\n".encode()
            usage = {
                "prompt_tokens": len(tokens),
                "completion_tokens": n,
                "prompt_tokens_details": {"cached_tokens": ram + disk},
                "cached_tokens_by_tier": {"ram": ram, "disk": disk, "peer": 0},
            }
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def _run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench-serve", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("report_kv", [True, False], ids=["kv-reported", "kv-derived"])
def test_a_profile_of_a_fake_daemon(tmp_path: Path, report_kv: bool) -> None:
    daemon = FakeDaemon(report_kv=report_kv)
    out = tmp_path / "My Fake.json"
    with serving(daemon.app()) as url:
        code, stdout, stderr = _run_cli(
            "--url", url, "--profile-out", str(out), "--profile-contexts", "128,300,480,1000",
            "--concurrency", "1,2,4,8", "--max-tokens", "6", "--repetitions", "2",
        )  # fmt: skip
    assert code == 0, stderr
    profile = parse_profile(out.read_text())
    assert profile.name == "my-fake" and profile.model == "fake"
    assert "cores" in profile.machine  # this machine's, the daemon being local
    assert profile.source.startswith("measured by warmfleet bench-serve 0.1.0 against " + url)
    assert (profile.context_length, profile.block_size) == (CONTEXT, BLOCK)
    assert (profile.kv_bytes_per_token, profile.logits_bytes) == (KV, LOGITS)
    assert profile.memory_budget_bytes == 1 << 30
    # Chunks of 256 tokens centred on each position, block-aligned (300: 160-416), the
    # last one ending where a decode still fits (480: 240-496); 1000 beyond the context.
    assert [p.at for p in profile.prefill] == [128, 288, 368]
    assert [p.at for p in profile.decode] == [1, 2, 4]  # max_num_seqs is 4
    assert [p.at for p in profile.decode_by_context] == [259, 419, 499]  # prompt + 6/2
    assert profile.decode_reference_context == 259
    assert set(profile.restore) == {"ram", "disk"}
    assert "medians over 2 run(s)" in profile.notes and "1000 exceed" in profile.notes
    assert "peer restore: not measured" in profile.notes
    assert ("from the cache's growth" in profile.notes) is not report_kv
    assert f"profile my-fake: fake on {profile.machine}" in stdout
    assert "prefill at 288: 256 tokens after 160 cached" in stderr


def test_a_remote_daemon_needs_the_machine_named(tmp_path: Path) -> None:
    code, _, stderr = _run_cli(
        "--url", "http://mac-17.example:8000", "--profile-out", str(tmp_path / "p.json")
    )  # fmt: skip
    assert code == 2 and "--profile-machine is required" in stderr


def test_chunks_are_block_aligned_centred_and_fit_the_context() -> None:
    chunks, dropped = plan_chunks([512, 1024, 8192, 16384], 128, 8192, 32)
    assert dropped == [16384]
    assert chunks == [Chunk(512, 384, 640), Chunk(1024, 896, 1152), Chunk(7936, 7808, 8064)]
    small, _ = plan_chunks([100], 16, 4096, 32)  # at least 256 tokens computed
    assert small == [Chunk(128, 0, 256)]


def _sample(ram_s: float, prefill_s: float, disk_s: float) -> RunSample:
    """A run where restoring a RAM token takes `ram_s`, computing one `prefill_s` and
    reading one from disk `disk_s`, over a constant 10 ms."""
    positions = []
    for start, end in ((128, 384), (896, 1152)):
        chunk = Chunk((start + end) // 2, start, end)
        extend = 0.01 + start * ram_s + (end - start) * prefill_s
        positions.append(PositionSample(chunk, extend, 0.01, 0.002 + end * ram_s, 5.0, end + 16))
    disk = DiskSample(
        ram_ttft_s=0.01 + 1000 * ram_s,
        disk_ttft_s=0.01 + 20 * ram_s + 980 * disk_s,
        ram_tokens=1000,
        disk_ram_tokens=20,
        disk_tokens=980,
    )
    return RunSample(
        tiny_tokens=128,
        tiny_restore_gap_s=0.002 + 128 * ram_s,
        kv_bytes_per_token=KV,
        logits_bytes=LOGITS,
        positions=positions,
        decode={1: 10.0, 2: 8.0},
        decode_context=400,
        disk=disk,
    )


def test_rates_from_samples() -> None:
    rates = run_rates(_sample(ram_s=1e-4, prefill_s=5e-3, disk_s=1e-3))
    assert rates.ram == pytest.approx(1e4)
    assert rates.prefill == {256: pytest.approx(200), 1024: pytest.approx(200)}
    assert rates.disk == pytest.approx(1e3)
    assert rates.decode_by_context == {400: 5.0, 1168: 5.0}


def test_medians_and_spread() -> None:
    facts = ServerFacts("http://h:1", "m", "0.1.0", 4096, 128, 16, 1 << 30, None, True)
    runs = [_sample(1e-4, s, 1e-3) for s in (5e-3, 4e-3, 10e-3)]
    measured = Measurements(facts, ProfileOptions(url="http://h:1"), [], [1, 2], runs)
    profile = build_profile(measured, name="p", machine="M", model="m (float32)")
    assert [(p.at, p.tokens_per_s) for p in profile.prefill] == [(256, 200.0), (1024, 200.0)]
    assert "256: 200 [100-250]" in profile.notes  # the median and the runs' range
    assert profile.restore == {"ram": pytest.approx(1e4), "disk": pytest.approx(1e3)}
    assert profile.kv_bytes_per_token == KV and profile.model == "m (float32)"


def test_the_shipped_profile_of_this_machine_loads() -> None:
    profile = load_profile(SHIPPED)
    assert profile.name == SHIPPED and "SmolLM2-135M" in profile.model
    assert "AMD EPYC" in profile.machine
    assert profile.source.startswith("measured by warmfleet bench-serve")
    assert profile.block_size == 128 and profile.kv_bytes_per_token == 46080
    assert len(profile.prefill) >= 5 and [p.at for p in profile.decode][:3] == [1, 2, 4]
    assert "ram" in profile.restore and profile.decode_by_context
