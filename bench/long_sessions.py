"""Long agent sessions on one daemon whose RAM holds two of them: the disk tier, the next
turn's prefix, quantized KV, and vllm-mlx's SSD cache on the same workload.

Eight sessions (a shared agent system prompt, then a history of tasks, tool calls and
tool results of 8-16k tokens each) take turns on one server, the embedded SmolLM2-135M
served with a context long enough (`--max-context`). The RAM budget holds about two
sessions, so by a session's next turn the others have pushed it out of RAM. A client
waits `--think` seconds (default 1) between requests, as an agent does between turns.

Phases, per server:
  cold       each session's first request: its whole history is prefilled. This is also
             what a session costs when it comes back to a server that dropped it (the
             re-prefill the disk tier saves).
  resumed    `--rounds` rounds of one turn per session (the history, the previous
             answer, a new user message): the session comes back from disk.
  restart    warmfleet only: the daemon is stopped (gracefully) and started again on the
             same --state-dir; one more round.

Figures: TTFT medians with their spread (min-max), the resumed/cold ratio per session,
multi-turn reuse = cached / (previous prompt + previous completion) (warmfleet reports
cached tokens; vllm-mlx does not), and for `--kv-bits 8`: bytes per cached token, the
sessions the same RAM budget holds, and the greedy agreement of its answers with the
unquantized run's. Also the README's two-turn example (reuse on its second turn).

vllm-mlx lives in its own virtualenv, as bench/decode_c8.py says:

    python3.11 -m venv ~/.cache/peers/vllm-mlx
    ~/.cache/peers/vllm-mlx/bin/pip install vllm-mlx==0.6.0 'mlx[cpu]'
    .venv/bin/python bench/long_sessions.py [--sessions 8] [--rounds 2] [--skip vllm-mlx]

It is served from the same weights (`warmfleet convert default DIR`) with
`--continuous-batching --ssd-cache-dir DIR --ssd-cache-max-gb 20 --cache-memory-mb B
--timeout 3600` (its default, 300 s without output, aborts a 14k-token prefill on a CPU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from harness.client import Turn, turn
from harness.figures import spread
from harness.peers import DEFAULT_VLLM_MLX, prepare, vllm_mlx
from harness.warmfleet import serve
from harness.workloads import ASKS, Session, transcripts

KV_BYTES_PER_TOKEN = 46_080  # SmolLM2-135M, float32: 30 layers x 2 x 3 KV heads x 64 x 4


@contextmanager
def warmfleet(state_dir: Path, budget_mb: int, context: int, kv_bits: int | None) -> Iterator[str]:
    options = ["--max-context", str(context), "--cache-memory-mb", str(budget_mb)]
    options += ["--state-dir", str(state_dir), "--log-level", "warning"]
    if kv_bits:
        options += ["--kv-bits", str(kv_bits)]
    with serve(*options) as s:
        yield s.url


@contextmanager
def vllm_mlx_ssd(binary: Path, model_dir: str, ssd: Path, budget_mb: int) -> Iterator[str]:
    """vllm-mlx with its SSD cache; `--timeout 3600`: its default, 300 s without output,
    aborts a long prefill on a CPU."""
    options = ["--cache-memory-mb", str(budget_mb), "--ssd-cache-dir", str(ssd)]
    options += ["--ssd-cache-max-gb", "20", "--timeout", "3600"]
    with vllm_mlx(binary, model_dir, *options, home=ssd.parent / "vllm-mlx-home") as s:
        yield s.url


def think(seconds: float) -> None:
    time.sleep(seconds)


def cold(url: str, model: str, sessions: list[Session], args: argparse.Namespace) -> None:
    for i, s in enumerate(sessions):
        t = turn(url, model, s.messages, args.answer_tokens)
        s.turns.append(t)
        s.messages.append({"role": "assistant", "content": t.text})
        print(f"  cold {i}: {t.prompt_tokens} tokens, TTFT {t.ttft_s:.2f} s", flush=True)
        think(args.think)


def resumed(
    url: str, model: str, sessions: list[Session], args: argparse.Namespace, label: str, rnd: int
) -> None:
    for i, s in enumerate(sessions):
        s.messages.append({"role": "user", "content": ASKS[(rnd + i) % len(ASKS)]})
        t = turn(url, model, s.messages, args.answer_tokens)
        previous = s.turns[-1]
        s.turns.append(t)
        s.messages.append({"role": "assistant", "content": t.text})
        reuse = (
            f", reuse {t.cached_tokens / (previous.prompt_tokens + previous.completion_tokens):.3f}"
            if t.cached_tokens is not None
            else ""
        )
        print(f"  {label} {i}: TTFT {t.ttft_s:.2f} s, cached {t.cached_tokens}{reuse}", flush=True)
        think(args.think)


@dataclass
class Run:
    name: str
    sessions: list[Session]
    labels: list[str]  # per turn index: cold, resumed, restart

    def ttfts(self, label: str) -> list[float]:
        return [
            t.ttft_s for s in self.sessions for t, lab in zip(s.turns, self.labels) if lab == label
        ]

    def ratios(self, label: str) -> list[float]:
        return [
            t.ttft_s / s.turns[0].ttft_s
            for s in self.sessions
            for t, lab in zip(s.turns, self.labels)
            if lab == label
        ]

    def reuse(self) -> list[float]:
        out = []
        for s in self.sessions:
            for prev, t, lab in zip(s.turns, s.turns[1:], self.labels[1:]):
                if lab == "resumed" and t.cached_tokens is not None:
                    out.append(t.cached_tokens / (prev.prompt_tokens + prev.completion_tokens))
        return out


def workload(url: str, model: str, base: list[Session], args: argparse.Namespace, name: str) -> Run:
    sessions = [Session([dict(m) for m in s.messages]) for s in base]
    print(f"{name}: cold (load {os.getloadavg()[0]:.1f})", flush=True)
    cold(url, model, sessions, args)
    labels = ["cold"]
    for rnd in range(args.rounds):
        print(f"{name}: round {rnd + 1} (load {os.getloadavg()[0]:.1f})", flush=True)
        resumed(url, model, sessions, args, "resumed", rnd)
        labels.append("resumed")
    return Run(name, sessions, labels)


def status(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/status", timeout=30).json())


def readme_example(url: str) -> tuple[int, int, int]:
    """The README's two-turn example (with the client's 1 s between turns): the second
    turn's cached tokens, and the first turn's prompt and completion."""
    system = {
        "role": "system",
        "content": "You are the on-call assistant of the platform team. ...",
    }
    history_: list[dict[str, Any]] = [system]
    first: Turn | None = None
    for question in ["What is a Helm chart?", "What does kubectl apply do?"]:
        history_.append({"role": "user", "content": question})
        t = turn(url, "default", history_, 64)
        history_.append({"role": "assistant", "content": t.text})
        if first is None:
            first = t
            think(1.0)
    assert first is not None and t.cached_tokens is not None
    return t.cached_tokens, first.prompt_tokens, first.completion_tokens


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--min-tokens", type=int, default=8000)
    ap.add_argument("--max-tokens", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--think", type=float, default=1.0, help="seconds between requests")
    ap.add_argument("--ram-sessions", type=float, default=2.0, help="sessions the RAM holds")
    ap.add_argument("--model-dir", default=None, help="converted model (default: a temp dir)")
    ap.add_argument("--vllm-mlx", type=Path, default=DEFAULT_VLLM_MLX, help="its serve binary")
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["warmfleet", "vllm-mlx", "kv8", "restart", "readme"],
    )
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}", flush=True)
    tokenizer, model_dir = prepare(args.model_dir)
    base = transcripts(tokenizer, args.sessions, args.min_tokens, args.max_tokens)
    targets = [s.target for s in base]
    mean_tokens = statistics.mean(targets)
    budget_mb = int(args.ram_sessions * mean_tokens * KV_BYTES_PER_TOKEN * 1.05 / (1 << 20))
    context = args.max_tokens + 4096
    print(
        f"{args.sessions} sessions of {min(targets)}-{max(targets)} tokens (mean "
        f"{mean_tokens:.0f}); RAM budget {budget_mb} MiB (~{args.ram_sessions} sessions); "
        f"context {context}",
        flush=True,
    )
    runs: list[Run] = []
    work = Path(tempfile.mkdtemp(prefix="long-sessions-"))
    try:
        info: dict[str, Any] = {}
        if "warmfleet" not in args.skip:
            with warmfleet(work / "wf", budget_mb, context, None) as url:
                if "readme" not in args.skip:
                    cached, prompt, completion = readme_example(url)
                    print(
                        f"README example: second turn cached {cached} = "
                        f"{cached / (prompt + completion):.3f} of the first turn's "
                        f"{prompt} + {completion} tokens",
                        flush=True,
                    )
                run = workload(url, "default", base, args, "warmfleet")
                info = status(url)
            if "restart" not in args.skip:
                print("warmfleet: restart on the same --state-dir", flush=True)
                with warmfleet(work / "wf", budget_mb, context, None) as url:
                    resumed(url, "default", run.sessions, args, "restart", args.rounds)
                    run.labels.append("restart")
                    info = status(url)
            runs.append(run)
            tier = info.get("disk_tier") or {}
            print(
                f"warmfleet disk tier: {tier.get('blocks')} blocks, "
                f"{(tier.get('bytes') or 0) / (1 << 30):.2f} GiB, read "
                f"{(tier.get('read_bytes') or 0) / (1 << 30):.2f} GiB in "
                f"{tier.get('read_seconds', 0):.1f} s",
                flush=True,
            )
        if "kv8" not in args.skip:
            with warmfleet(work / "kv8", budget_mb, context, 8) as url:
                kv8 = workload(url, "default", base, args, "warmfleet --kv-bits 8")
                kv8_info = status(url)
            runs.append(kv8)
        if "vllm-mlx" not in args.skip and args.vllm_mlx.exists():
            with vllm_mlx_ssd(args.vllm_mlx, model_dir, work / "ssd", budget_mb) as url:
                runs.append(workload(url, model_dir, base, args, "vllm-mlx"))
        elif "vllm-mlx" not in args.skip:
            print(f"vllm-mlx not found at {args.vllm_mlx}: skipped")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nload at the end: {os.getloadavg()}")
    print("TTFT in seconds, median (min-max, n); ratio = a turn's TTFT / its session's cold TTFT")
    for r in runs:
        print(f"{r.name}:")
        print(f"  cold (re-prefill)   {spread(r.ttfts('cold'))}")
        print(f"  resumed             {spread(r.ttfts('resumed'))}")
        print(f"  resumed / cold      {spread(r.ratios('resumed'))}")
        if "restart" in r.labels:
            print(f"  after a restart     {spread(r.ttfts('restart'))}")
            print(f"  restart / cold      {spread(r.ratios('restart'))}")
        if r.reuse():
            print(f"  multi-turn reuse    {spread(r.reuse())}")
    by_name = {r.name: r for r in runs}
    if "vllm-mlx" in by_name:
        wf, vm = by_name["warmfleet"], by_name["vllm-mlx"]
        ratio = statistics.median(wf.ttfts("resumed")) / statistics.median(vm.ttfts("resumed"))
        print(f"warmfleet / vllm-mlx resumed TTFT (medians): {ratio:.3f}")
    if "warmfleet --kv-bits 8" in by_name:
        wf, q = by_name["warmfleet"], by_name["warmfleet --kv-bits 8"]
        per_token = kv8_info["kv_transfer"]["kv_bytes_per_token"]
        full = info["kv_transfer"]["kv_bytes_per_token"]
        prompts = statistics.mean(s.turns[0].prompt_tokens for s in wf.sessions)
        held = budget_mb * (1 << 20) / (per_token * prompts)
        print(
            f"--kv-bits 8: {per_token} bytes per cached token (float32: {full}, "
            f"{per_token / full:.3f}x); the {budget_mb} MiB RAM budget holds {held:.1f} "
            f"sessions of {prompts:.0f} prompt tokens (float32: "
            f"{budget_mb * (1 << 20) / (full * prompts):.1f})"
        )
        # The cold turns only: later turns' histories hold each run's own earlier answers.
        agree = []
        for a, b in zip(wf.sessions, q.sessions):
            x, y = tokenizer.encode(a.turns[0].text), tokenizer.encode(b.turns[0].text)
            common = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            agree.append(common / max(len(x), 1))
        same = sum(v == 1.0 for v in agree)
        print(
            f"--kv-bits 8 vs float32, greedy answers to the {len(agree)} cold prompts: "
            f"{same} identical; the tokens before the first difference: "
            f"{spread(agree)} of an answer"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
