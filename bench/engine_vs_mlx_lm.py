"""warmfleet serve vs mlx_lm.server on the embedded SmolLM2-135M, side by side in one run.

Both servers run the same float32 weights (`warmfleet convert default DIR` for
mlx_lm.server) with the same OpenBLAS (preloaded by warmfleet, LD_PRELOAD for
mlx_lm.server), one at a time on this machine, and are measured over HTTP with
streaming requests exactly as a client sees them. Prints medians and ratios.

    .venv/bin/python bench/engine_vs_mlx_lm.py [--repeats 3] [--json out.json]

Figures:
  cold TTFT     ~1.6k-token prompt (1.5k system + short user message), nothing cached
  warm TTFT     a second request with the same system prompt, another question
  decode c=1    tokens/s of one stream after its first token
  decode c=8    aggregate tokens/s of 8 simultaneous streams
  short|long    TTFT of a short prompt sent right after three long cold ones,
                relative to the same short prompt alone
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from warmfleet_daemon.support.blas import THREAD_TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

PARAGRAPHS = [
    "You are Forge, an autonomous coding agent working inside a large Python and Go "
    "monorepo. You receive tasks from engineers and you complete them by reading files, "
    "running commands and proposing patches.",
    "Always explain your plan before acting. Prefer small, reviewable changes. Never "
    "delete tests to make them pass, and never commit secrets, tokens or credentials.",
    "When a command fails, read its output carefully, state the most likely cause and "
    "try the smallest fix first. If two attempts fail, stop and ask for guidance.",
    "The repository uses Bazel for builds, pytest and go test for tests, ruff and "
    "golangci-lint for linting, and conventional commit messages.",
    "Tool read_file(path, start_line, end_line) returns the text of a file. Tool "
    "search_code(query, path_glob) returns matching lines with their locations. Tool "
    "run_command(cmd, timeout_s) runs a shell command in the sandbox and returns stdout, "
    "stderr and the exit code.",
    "Tool propose_patch(diff, rationale) submits a unified diff for review. Tool "
    "open_issue(title, body, labels) files an issue in the tracker when a task is "
    "blocked by something outside the repository.",
    "Answer in English. Use Markdown code fences for code. Keep summaries under ten "
    "lines unless the engineer asks for detail, and list the files you changed.",
    "Security review checklist: validate inputs at trust boundaries, avoid shell "
    "interpolation of user data, pin dependency versions, and prefer constant-time "
    "comparison for secrets.",
]
QUESTIONS = [
    "Why does the CI job for the payments service time out?",
    "Add a retry with backoff to the HTTP client in pkg/fetch.",
    "Explain what the Bazel target //tools:lint does.",
    "Rename the config flag --cache-dir to --cache-path everywhere.",
    "Find where we parse RFC 3339 timestamps and add tests.",
    "Is the Redis connection pool shared across goroutines?",
]


def system_prompt(tokenizer: object, target_tokens: int, nonce: str) -> str:
    """~target_tokens of agent instructions; the nonce first, so nothing is shared."""
    rng = random.Random(nonce)
    text = f"Session {nonce}. "
    while len(tokenizer.encode(text)) < target_tokens:  # type: ignore[attr-defined]
        text += rng.choice(PARAGRAPHS) + "\n\n"
    return text


@dataclass
class Result:
    ttft_s: float
    completion_tokens: int
    first_token_at: float
    last_token_at: float
    cached_tokens: int | None = None


def stream(url: str, model: str, messages: list[dict], max_tokens: int) -> Result:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    tokens = 0
    usage: dict = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    tokens += 1
    assert first is not None and last is not None, "no content streamed"
    return Result(
        ttft_s=first - start,
        completion_tokens=usage.get("completion_tokens", tokens),
        first_token_at=first,
        last_token_at=last,
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openblas() -> str | None:
    found = sorted(glob.glob("/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0"))
    return found[0] if found else None


def vllm_mlx_env(home: Path) -> dict[str, str]:
    """vllm-mlx's environment: the BLAS warmfleet loads, and a HOME of its own, because
    it saves its prefix cache under ~/.cache/vllm-mlx at exit and loads it at start (an
    earlier run's prompts would be warm in this one)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    blas = openblas()
    if blas:
        env["LD_PRELOAD"] = blas
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)  # as warmfleet sets it
    return env


@dataclass
class Started:
    url: str
    model: str
    started_at: float  # process start, wall clock (the daemon's log lines carry it)
    port_open_s: float  # process start -> the port answers
    log: Path


@contextmanager
def started(cmd: list[str], model: str, ready_path: str, env: dict[str, str]) -> Iterator[Started]:
    """Start a server and time it: polls every 10 ms until the port answers, then every
    0.5 s until `ready_path` says 200. Polling fast all along would slow what it
    measures: 100 requests/s take enough CPU on 2 cores to slow a warm-up by half."""
    port = int(cmd[cmd.index("--port") + 1])
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkstemp(prefix="bench-server-", suffix=".log")[1])
    with log.open("wb") as out:
        t0, wall = time.perf_counter(), time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        port_open = None
        with httpx.Client(timeout=5) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}: {log.read_text()}")
                try:
                    status = client.get(f"{url}{ready_path}").status_code
                    port_open = port_open or time.perf_counter() - t0
                    if status == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() - t0 > 300:
                    raise RuntimeError(f"{cmd[0]} did not come up: {log.read_text()}")
                time.sleep(0.01 if port_open is None else 0.5)
        assert port_open is not None
        yield Started(url, model, wall, port_open, log)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.unlink(missing_ok=True)


@contextmanager
def server(kind: str, model_dir: str, extra: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """A started server, primed with one tiny request (not shared with any prompt);
    `extra`: more `warmfleet serve` options."""
    port = free_port()
    env = {**os.environ}
    if kind == "warmfleet":
        cmd = [str(VENV_BIN / "warmfleet"), "serve", "--model", "default", "--port", str(port)]
        cmd += extra
        model, ready_path = "default", "/readyz"
    else:
        cmd = [str(VENV_BIN / "mlx_lm.server"), "--model", model_dir, "--port", str(port)]
        model, ready_path = model_dir, "/health"
        blas = openblas()
        if blas:
            env["LD_PRELOAD"] = blas  # same BLAS as warmfleet
            env.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)  # as warmfleet sets it
    cmd += ["--log-level", "warning" if kind == "warmfleet" else "WARNING"]
    with started(cmd, model, ready_path, env) as s:
        hi = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        httpx.post(f"{s.url}/v1/chat/completions", json=hi, timeout=60).raise_for_status()
        yield s.url, s.model


@dataclass
class Figures:
    cold_ttft: list[float] = field(default_factory=list)
    warm_ttft: list[float] = field(default_factory=list)
    warm_cached: list[int | None] = field(default_factory=list)
    decode_c1: list[float] = field(default_factory=list)
    decode_c8: list[float] = field(default_factory=list)
    short_solo: list[float] = field(default_factory=list)
    short_among_long: list[float] = field(default_factory=list)


def concurrent(
    url: str,
    model: str,
    conversations: list[list[dict]],
    max_tokens: int,
    delays: list[float] | None = None,
) -> list[Result]:
    results: list[Result | None] = [None] * len(conversations)

    def go(i: int) -> None:
        if delays:
            time.sleep(delays[i])
        results[i] = stream(url, model, conversations[i], max_tokens)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def measure(
    kind: str, url: str, model: str, tokenizer: object, repeats: int, system_tokens: int
) -> Figures:
    f = Figures()
    tag = f"{kind}-{time.time_ns()}"
    for rep in range(repeats):
        system = {
            "role": "system",
            "content": system_prompt(tokenizer, system_tokens, f"{tag}-{rep}"),
        }
        cold = stream(url, model, [system, {"role": "user", "content": QUESTIONS[0]}], 8)
        warm = stream(url, model, [system, {"role": "user", "content": QUESTIONS[1]}], 8)
        f.cold_ttft.append(cold.ttft_s)
        f.warm_ttft.append(warm.ttft_s)
        f.warm_cached.append(warm.cached_tokens)

        essay = [
            {
                "role": "user",
                "content": f"Write a long, detailed essay about the history of "
                f"computing, part {rep}.",
            }
        ]
        one = stream(url, model, essay, 128)
        f.decode_c1.append((one.completion_tokens - 1) / (one.last_token_at - one.first_token_at))
        eight = concurrent(
            url,
            model,
            [
                [{"role": "user", "content": f"Write a long story about {topic}, part {rep}."}]
                for topic in [
                    "dragons",
                    "the sea",
                    "a robot",
                    "Paris",
                    "a garden",
                    "winter",
                    "a train",
                    "the moon",
                ]
            ],
            128,
        )
        start = min(r.first_token_at - r.ttft_s for r in eight)
        end = max(r.last_token_at for r in eight)
        f.decode_c8.append(sum(r.completion_tokens for r in eight) / (end - start))

        short = [{"role": "user", "content": f"Say hello to Ada ({rep})."}]
        f.short_solo.append(stream(url, model, short, 4).ttft_s)
        longs = [
            [
                {
                    "role": "system",
                    "content": system_prompt(tokenizer, system_tokens, f"{tag}-{rep}-long-{i}"),
                },
                {"role": "user", "content": QUESTIONS[i]},
            ]
            for i in range(3)
        ]
        mixed = concurrent(url, model, [*longs, short], 4, delays=[0.0, 0.0, 0.0, 0.3])
        f.short_among_long.append(mixed[-1].ttft_s)
    return f


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options both side-by-side benchmarks take."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--model-dir", default=None, help="converted model (default: a temp dir)")
    return ap


def prepare(model_dir: str | None) -> tuple[object, str]:
    """The embedded model's tokenizer, and the model converted for mlx_lm.server."""
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    model_dir = model_dir or str(Path(tempfile.gettempdir()) / "warmfleet-bench-smollm2")
    if not Path(model_dir, "config.json").exists():
        subprocess.run([str(VENV_BIN / "warmfleet"), "convert", "default", model_dir], check=True)
    return load_gguf_tokenizer_only(), model_dir


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    args = ap.parse_args()
    tokenizer, model_dir = prepare(args.model_dir)

    figures: dict[str, Figures] = {}
    for kind in ("warmfleet", "mlx_lm.server"):
        print(f"measuring {kind} ...", flush=True)
        with server(kind, model_dir) as (url, model):
            figures[kind] = measure(kind, url, model, tokenizer, args.repeats, args.system_tokens)

    w, m = figures["warmfleet"], figures["mlx_lm.server"]
    rows = [
        ("cold TTFT, ~1.6k-token prompt (s)", median(w.cold_ttft), median(m.cold_ttft), "<= 0.70x"),
        (
            "warm TTFT, shared system prompt (s)",
            median(w.warm_ttft),
            median(m.warm_ttft),
            "<= 0.50x",
        ),
        ("decode tok/s, concurrency 1", median(w.decode_c1), median(m.decode_c1), ">= 1.00x"),
        ("decode tok/s, concurrency 8 (aggregate)", median(w.decode_c8), median(m.decode_c8), ""),
        ("short prompt TTFT alone (s)", median(w.short_solo), median(m.short_solo), ""),
        (
            "short prompt TTFT among 3 long (s)",
            median(w.short_among_long),
            median(m.short_among_long),
            "",
        ),
    ]
    print(f"\n{'figure':42} {'warmfleet':>10} {'mlx_lm':>10} {'ratio':>7}  target")
    for name, a, b, target in rows:
        print(f"{name:42} {a:10.3f} {b:10.3f} {a / b:6.2f}x  {target}")
    print(
        f"\nwarmfleet c8/c1 aggregate decode: {median(w.decode_c8) / median(w.decode_c1):.2f}x "
        f"(target >= 3x); mlx_lm.server: {median(m.decode_c8) / median(m.decode_c1):.2f}x"
    )
    print(
        "warmfleet short-among-long / solo: "
        f"{median(w.short_among_long) / median(w.short_solo):.2f}x (target <= 2x); "
        f"mlx_lm.server: {median(m.short_among_long) / median(m.short_solo):.2f}x"
    )
    print(
        f"cached tokens on the warm request: warmfleet {w.warm_cached}, "
        f"mlx_lm.server {m.warm_cached}"
    )
    print(f"repeats: {args.repeats}; medians of each figure")
    if args.json:
        Path(args.json).write_text(
            json.dumps({k: v.__dict__ for k, v in figures.items()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
