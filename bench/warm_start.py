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

    .venv/bin/python bench/warm_start.py [--repeats 3]
"""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx
from engine_vs_mlx_lm import (
    QUESTIONS,
    VENV_BIN,
    arguments,
    free_port,
    openblas,
    prepare,
    started,
    stream,
    system_prompt,
)

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


def warmfleet(port: int, *extra: str) -> list[str]:
    return [str(VENV_BIN / "warmfleet"), "serve", "--model", "default", "--port", str(port), *extra]


def measure(repeat: int, tokenizer: object, model_dir: str, tokens: int, f: Figures) -> None:
    system = {"role": "system", "content": system_prompt(tokenizer, tokens, f"start-{repeat}")}
    first = [system, {"role": "user", "content": QUESTIONS[repeat % len(QUESTIONS)]}]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as warm_file:
        json.dump([{"name": "agent", "messages": [system]}], warm_file)
    env = {**os.environ}

    cmd = warmfleet(free_port(), "--warm-prompts", warm_file.name, "--log-level", "info")
    with started(cmd, "default", "/readyz", env) as s:
        while httpx.get(f"{s.url}/readyz", params={"warm": 1}).status_code != 200:
            time.sleep(0.5)
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

    with started(warmfleet(free_port(), "--log-level", "warning"), "default", "/readyz", env) as s:
        f.ttft_cold.append(stream(s.url, s.model, first, 8).ttft_s)

    blas = openblas()
    if blas:
        env["LD_PRELOAD"] = blas  # the same BLAS as warmfleet loads itself
    cmd = [str(VENV_BIN / "mlx_lm.server"), "--model", model_dir, "--port", str(free_port())]
    with started([*cmd, "--log-level", "WARNING"], model_dir, "/health", env) as s:
        f.ttft_mlx.append(stream(s.url, s.model, first, 8).ttft_s)


def main() -> int:
    args = arguments(__doc__).parse_args()
    tokenizer, model_dir = prepare(args.model_dir)

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
