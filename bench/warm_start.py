"""Warm start on the embedded SmolLM2-135M: a deploy's first request, side by side in one run.

Each repetition starts, one after another on this machine, with a fresh ~1.5k-token
system prompt (a nonce first, so nothing is shared between repetitions):

  warm   `warmfleet serve --warm-prompts F` (F holds that system prompt): process start
         to port open, to model loaded and to warm (the daemon's log lines for both),
         the warm-up's own duration; then, once /readyz?warm=1, the first request's TTFT.
  cold   `warmfleet serve` without warm prompts: the same first request's TTFT.
  mlx    mlx_lm.server on the same float32 weights and OpenBLAS: the same first request.

The first request is the system prompt plus a short user question, streamed, as a
client sees it. Prints medians.

Warm without prefill (`--part kv`, or `all`), with another fresh prompt per repetition:

  prefill  `warmfleet serve --warm-prompts F --state-dir S` on an empty S: the warm-up
           prefills (today's cost of every restart) and writes KV snapshots to S.
  peer     while it runs, `warmfleet serve --warm-prompts F --warm-from URL`: a new
           daemon that copies the blocks over loopback instead of prefilling.
  restart  the first daemon stopped and started again on S: reloads the snapshots.

For each: process start -> warm (`/readyz?warm=1`; the log line's time), the warm-up
itself (its log line), and the first request's TTFT; plus the bytes per cached token
and the disk the snapshots use.

    .venv/bin/python bench/warm_start.py [--repeats 3] [--part start|kv|all]
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from harness.client import stream
from harness.peers import arguments, mlx_lm_server, prepare
from harness.processes import Proc
from harness.warmfleet import serve, wait_warm
from harness.workloads import QUESTIONS, system_prompt

PEER_WARM_UP_S = 12.0  # the best peer's start-up warm-up of 1.6k tokens on this machine
WARM_UP_LINE = re.compile(r"Warm-up done \(strict-prefix\).*?(\d+) prompt tokens in ([\d.]+)s")
MODEL_READY_LINE = re.compile(r"Model .* ready in")


@dataclass
class Figures:
    port_open: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)  # process start -> all warm
    warm_up: list[float] = field(default_factory=list)  # the warm-up itself (its log line)
    warm_tokens: list[int] = field(default_factory=list)
    ttft_warm: list[float] = field(default_factory=list)
    cached_warm: list[int | None] = field(default_factory=list)
    ttft_cold: list[float] = field(default_factory=list)
    ttft_mlx: list[float] = field(default_factory=list)


def logged_at(log: str, pattern: re.Pattern[str], since: float) -> tuple[re.Match[str], float]:
    """The first log line matching `pattern` and its time in seconds after `since`."""
    for line in log.splitlines():
        found = pattern.search(line)
        if found:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return found, stamp.timestamp() - since
    raise AssertionError(f"no log line matches {pattern.pattern}:\n{log}")


def measure(repeat: int, tokenizer: object, model_dir: str, tokens: int, f: Figures) -> None:
    system = {"role": "system", "content": system_prompt(tokenizer, tokens, f"start-{repeat}")}
    first = [system, {"role": "user", "content": QUESTIONS[repeat % len(QUESTIONS)]}]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as warm_file:
        json.dump([{"name": "agent", "messages": [system]}], warm_file)

    with serve("--warm-prompts", warm_file.name, "--log-level", "info") as s:
        wait_warm(s.url)
        log = s.log.read_text()
        f.port_open.append(s.port_open_s)
        f.loaded.append(logged_at(log, MODEL_READY_LINE, s.started_at)[1])
        done, at = logged_at(log, WARM_UP_LINE, s.started_at)
        f.warm.append(at)
        f.warm_tokens.append(int(done.group(1)))
        f.warm_up.append(float(done.group(2)))
        result = stream(s.url, s.model, first, 8)
        f.ttft_warm.append(result.ttft_s)
        f.cached_warm.append(result.cached_tokens)
    os.unlink(warm_file.name)

    with serve("--log-level", "warning") as s:
        f.ttft_cold.append(stream(s.url, s.model, first, 8).ttft_s)

    with mlx_lm_server(model_dir) as s:  # the same BLAS as warmfleet loads itself
        f.ttft_mlx.append(stream(s.url, s.model, first, 8).ttft_s)


@dataclass
class KVFigures:
    tokens: list[int] = field(default_factory=list)
    warm: dict[str, list[float]] = field(default_factory=dict)  # process start -> warm
    warm_up: dict[str, list[float]] = field(default_factory=dict)  # the log line's time
    ttft: dict[str, list[float]] = field(default_factory=dict)
    cached: dict[str, list[int | None]] = field(default_factory=dict)
    bytes_per_token: list[int] = field(default_factory=list)
    disk_bytes: list[int] = field(default_factory=list)
    later_ttft: dict[str, list[float]] = field(default_factory=dict)  # 2nd-4th requests

    def add(self, kind: str, s: Proc, first: list[dict[str, Any]], tokens: int) -> None:
        log = s.log.read_text()
        done, at = logged_at(log, WARM_UP_LINE, s.started_at)
        assert int(done.group(1)) == tokens, log
        self.warm.setdefault(kind, []).append(at)
        self.warm_up.setdefault(kind, []).append(float(done.group(2)))
        result = stream(s.url, s.model, first, 8)
        self.ttft.setdefault(kind, []).append(result.ttft_s)
        self.cached.setdefault(kind, []).append(result.cached_tokens)
        # Then warm hits on the same daemon (other questions): the spread to compare with.
        for i in range(1, 4):
            question = f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"
            later = [first[0], {"role": "user", "content": question}]
            hit = stream(s.url, s.model, later, 8)
            self.later_ttft.setdefault(kind, []).append(hit.ttft_s)


def measure_kv(repeat: int, tokenizer: object, tokens: int, f: KVFigures) -> None:
    system = {"role": "system", "content": system_prompt(tokenizer, tokens, f"kv-{repeat}")}
    first = [system, {"role": "user", "content": QUESTIONS[repeat % len(QUESTIONS)]}]
    work = Path(tempfile.mkdtemp(prefix="warmfleet-kv-bench-"))
    warm_file, state = work / "warm.json", work / "state"
    warm_file.write_text(json.dumps([{"name": "agent", "messages": [system]}]))
    base = ("--warm-prompts", str(warm_file), "--log-level", "info")
    try:
        with serve(*base, "--state-dir", str(state)) as first_daemon:
            wait_warm(first_daemon.url)
            warm_set = httpx.get(f"{first_daemon.url}/v1/warm-sets/local/warm-prompts").json()
            prompt_tokens = warm_set["prompts"][0]["tokens"]
            f.tokens.append(prompt_tokens)
            while True:  # the snapshot writer runs in the background
                kv = httpx.get(f"{first_daemon.url}/v1/status").json()["kv_transfer"]
                snaps = kv["snapshots"]
                if snaps["files"] and snaps["written"] >= snaps["files"]:
                    time.sleep(1.0)
                    kv = httpx.get(f"{first_daemon.url}/v1/status").json()["kv_transfer"]
                    break
                time.sleep(0.5)
            f.bytes_per_token.append(kv["kv_bytes_per_token"])
            f.disk_bytes.append(kv["snapshots"]["bytes"])
            # The peer first (it needs the first daemon up), then the first daemon's own
            # first request: a warm hit, the TTFT to match.
            with serve(*base, "--warm-from", first_daemon.url) as peer:
                wait_warm(peer.url)
                f.add("peer", peer, first, prompt_tokens)
            f.add("prefill", first_daemon, first, prompt_tokens)
        with serve(*base, "--state-dir", str(state)) as again:
            wait_warm(again.url)
            f.add("restart", again, first, prompt_tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# An 8B model on a Mac, computed from its shapes (Llama-3.1-8B: 32 layers, 8 KV heads of
# 128 dims, fp16 KV). The rates are assumptions, not measurements: printed as such.
EIGHT_B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "bytes": 2}
ASSUMED_PREFILL_TOK_S = 800.0  # 8B 4-bit prefill on an M2 Pro-class Mac
ASSUMED_SSD_GB_S = 3.0
ASSUMED_LINK_GB_S = {"10 GbE": 1.1, "1 GbE": 0.11}


def report_kv(f: KVFigures, repeats: int) -> None:
    med = statistics.median
    print(f"\nwarm without prefill: {med(f.tokens):.0f}-token warm prompt; medians of {repeats}\n")
    print(f"{'':28} {'start -> warm':>14} {'warm-up':>9} {'first TTFT':>11}  cached")
    for kind in ("prefill", "restart", "peer"):
        print(
            f"{kind:28} {med(f.warm[kind]):12.2f} s {med(f.warm_up[kind]):7.2f} s "
            f"{med(f.ttft[kind]):9.3f} s  {f.cached[kind]}"
        )
    prefill = med(f.warm_up["prefill"])
    print(
        f"\nrestart warm-up / re-prefill {med(f.warm_up['restart']) / prefill:.3f}x "
        f"(target <= 0.1x); start->warm {med(f.warm['restart']) / med(f.warm['prefill']):.3f}x"
    )
    print(
        f"peer warm-up / prefill {med(f.warm_up['peer']) / prefill:.3f}x (target <= 0.2x); "
        f"start->warm {med(f.warm['peer']) / med(f.warm['prefill']):.3f}x"
    )
    hit = med(f.ttft["prefill"])
    print(
        f"first TTFT after restart / warm hit {med(f.ttft['restart']) / hit:.2f}x, "
        f"after peer copy / warm hit {med(f.ttft['peer']) / hit:.2f}x"
    )
    for kind in ("prefill", "restart", "peer"):
        later = f.later_ttft[kind]
        print(
            f"{kind}: first request {', '.join(f'{t:.3f}' for t in f.ttft[kind])} s; the next "
            f"{len(later)} warm hits on the same daemons {min(later):.3f}-{max(later):.3f} s "
            f"(median {med(later):.3f})"
        )
    per_token = med(f.bytes_per_token)
    disk = med(f.disk_bytes)
    print(
        f"KV bytes per cached token {per_token:.0f} ({per_token / 1024:.1f} KiB); "
        f"snapshot disk {disk / 2**20:.1f} MiB for {med(f.tokens):.0f} tokens "
        f"({disk / med(f.tokens) / 1024:.1f} KiB/token with headers and block rounding)"
    )
    e = EIGHT_B
    per_token_8b = 2 * e["layers"] * e["kv_heads"] * e["head_dim"] * e["bytes"]
    tokens_8b = 10 * 8000
    size = per_token_8b * tokens_8b
    print(
        f"\nESTIMATE (not measured) for Llama-3.1-8B on a Mac, ten 8k-token agent prompts: "
        f"{per_token_8b / 1024:.0f} KiB/token, {size / 2**30:.1f} GiB of KV; re-prefill at an "
        f"assumed {ASSUMED_PREFILL_TOK_S:.0f} tok/s {tokens_8b / ASSUMED_PREFILL_TOK_S:.0f} s; "
        f"from an SSD at an assumed {ASSUMED_SSD_GB_S:.0f} GB/s "
        f"{size / ASSUMED_SSD_GB_S / 1e9:.1f} s; "
        + ", ".join(
            f"from a peer over {name} {size / rate / 1e9:.0f} s"
            for name, rate in ASSUMED_LINK_GB_S.items()
        )
    )


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--part", choices=["start", "kv", "all"], default="all")
    args = parser.parse_args()
    tokenizer, model_dir = prepare(args.model_dir)

    if args.part in ("kv", "all"):
        kv = KVFigures()
        for repeat in range(args.repeats):
            print(f"warm without prefill, repetition {repeat + 1}/{args.repeats} ...", flush=True)
            measure_kv(repeat, tokenizer, args.system_tokens, kv)
        report_kv(kv, args.repeats)
        if args.part == "kv":
            return 0

    f = Figures()
    for repeat in range(args.repeats):
        print(f"repetition {repeat + 1}/{args.repeats} ...", flush=True)
        measure(repeat, tokenizer, model_dir, args.system_tokens, f)

    med = statistics.median
    warm_up = med(f.warm_up)
    print(f"\nwarm prompt: {med(f.warm_tokens):.0f} tokens; medians of {args.repeats} runs\n")
    rows = [
        ("process start -> port open", med(f.port_open), ""),
        ("process start -> model loaded", med(f.loaded), ""),
        ("process start -> prompt warm", med(f.warm), ""),
        ("warm-up itself (its log line)", warm_up, f"<= {0.4 * PEER_WARM_UP_S:.1f} s"),
        ("first request TTFT, warm daemon", med(f.ttft_warm), "<= 0.200 s"),
        ("first request TTFT, daemon without warm-up", med(f.ttft_cold), ""),
        ("first request TTFT, mlx_lm.server", med(f.ttft_mlx), ""),
    ]
    for name, value, target in rows:
        print(f"{name:44} {value:8.3f} s  {target}")
    opened_first = all(p < w for p, w in zip(f.port_open, f.warm))
    print(
        f"\nport open before warm-up ends: {'yes' if opened_first else 'NO'} in every run; "
        f"warm-up {warm_up / PEER_WARM_UP_S:.2f}x the peer's {PEER_WARM_UP_S:.0f} s "
        f"(target <= 0.4x); first request warm/cold {med(f.ttft_warm) / med(f.ttft_cold):.3f}x, "
        f"warm/mlx_lm.server {med(f.ttft_warm) / med(f.ttft_mlx):.3f}x; "
        f"cached tokens on it: {f.cached_warm}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
