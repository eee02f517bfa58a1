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

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.client import aggregate_tok_s, concurrent, decode_tok_s, stream
from harness.peers import arguments, prepare, server
from harness.workloads import QUESTIONS, stories, system_prompt


@dataclass
class Figures:
    cold_ttft: list[float] = field(default_factory=list)
    warm_ttft: list[float] = field(default_factory=list)
    warm_cached: list[int | None] = field(default_factory=list)
    decode_c1: list[float] = field(default_factory=list)
    decode_c8: list[float] = field(default_factory=list)
    short_solo: list[float] = field(default_factory=list)
    short_among_long: list[float] = field(default_factory=list)


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
        f.decode_c1.append(decode_tok_s(stream(url, model, essay, 128)))
        f.decode_c8.append(aggregate_tok_s(concurrent(url, model, stories(rep), 128)))

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


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    args = ap.parse_args()
    tokenizer, model_dir = prepare(args.model_dir)

    figures: dict[str, Figures] = {}
    for kind in ("warmfleet", "mlx_lm.server"):
        print(f"measuring {kind} ...", flush=True)
        with server(kind, model_dir) as s:
            figures[kind] = measure(
                kind, s.url, s.model, tokenizer, args.repeats, args.system_tokens
            )

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
