"""Aggregate decode at concurrency 8: warmfleet vs mlx_lm.server vs vllm-mlx, side by side.

All servers run the embedded SmolLM2-135M (float32, `warmfleet convert default DIR` for
the peers) with Debian's OpenBLAS (warmfleet loads it; the peers get it with
LD_PRELOAD, and warmfleet's OPENBLAS_THREAD_TIMEOUT). They are started together and
measured in interleaved rounds (round 1: each server in turn, round 2: the same in
another order, ...), so a noisy spell on the machine lands on every server rather than
on one. Prints medians and ratios.

vllm-mlx lives in its own virtualenv (its dependencies pin other versions of mlx-lm):

    python3.11 -m venv ~/.cache/peers/vllm-mlx
    ~/.cache/peers/vllm-mlx/bin/pip install vllm-mlx==0.6.0 'mlx[cpu]'
    .venv/bin/python bench/decode_c8.py [--rounds 5] [--vllm-mlx PATH/TO/bin/vllm-mlx]

With `--kv-bits 8` (or 4) a second warmfleet daemon with quantized KV runs in the same
rounds (`warmfleet --kv-bits 8`); the peers are compared with the float32 one.

Figures per server and round:
  c=8 tok/s     completion tokens of 8 simultaneous 128-token streams / (last token -
                first request sent): the aggregate a client sees, prefills included
  c=1 tok/s     one 128-token stream, tokens after the first / time after the first
  8th TTFT      time to first token of the stream whose first token came last
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from harness.client import aggregate_tok_s, concurrent, decode_tok_s, stream
from harness.peers import DEFAULT_VLLM_MLX, VENV_BIN, prepare, server, vllm_mlx
from harness.processes import Proc
from harness.workloads import stories


@dataclass
class Figures:
    c8: list[float] = field(default_factory=list)
    c1: list[float] = field(default_factory=list)
    last_ttft: list[float] = field(default_factory=list)


def one_round(url: str, model: str, rnd: int, figures: Figures) -> None:
    eight = concurrent(url, model, stories(rnd), 128)
    figures.c8.append(aggregate_tok_s(eight))
    figures.last_ttft.append(max(r.ttft_s for r in eight))
    essay = [{"role": "user", "content": f"Write a long essay about computing, part {rnd}."}]
    figures.c1.append(decode_tok_s(stream(url, model, essay, 128)))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-dir", default=None, help="converted model (default: a temp dir)")
    ap.add_argument("--vllm-mlx", type=Path, default=DEFAULT_VLLM_MLX, help="its serve binary")
    ap.add_argument("--kv-bits", type=int, choices=[8, 4], help="also warmfleet --kv-bits N")
    args = ap.parse_args()
    _, model_dir = prepare(args.model_dir)
    kinds = ["warmfleet", "mlx_lm.server"]
    quantized = f"warmfleet --kv-bits {args.kv_bits}" if args.kv_bits else None
    if quantized:
        kinds.insert(1, quantized)
    if args.vllm_mlx.exists():
        kinds.append("vllm-mlx")
    else:
        print(f"vllm-mlx not found at {args.vllm_mlx}: comparing with mlx_lm.server only")
    figures = {kind: Figures() for kind in kinds}
    with ExitStack() as stack:
        endpoints: dict[str, Proc] = {}
        for kind in kinds:
            if kind == "vllm-mlx":
                home = stack.enter_context(tempfile.TemporaryDirectory(prefix="vllm-mlx-home-"))
                s = stack.enter_context(vllm_mlx(args.vllm_mlx, model_dir, home=Path(home)))
                endpoints[kind] = s
                stream(s.url, s.model, [{"role": "user", "content": "hi"}], 1)  # prime
            elif kind == quantized:
                extra = ["--kv-bits", str(args.kv_bits)]
                endpoints[kind] = stack.enter_context(server("warmfleet", model_dir, extra))
            else:
                endpoints[kind] = stack.enter_context(server(kind, model_dir))
        print(f"servers up: {', '.join(kinds)}; warmfleet from {VENV_BIN}", flush=True)
        for rnd in range(args.rounds):
            order = kinds[rnd % len(kinds) :] + kinds[: rnd % len(kinds)]
            for kind in order:
                one_round(endpoints[kind].url, endpoints[kind].model, rnd, figures[kind])
            print(
                f"round {rnd + 1}: "
                + "  ".join(
                    f"{k} c8 {figures[k].c8[-1]:.1f} tok/s, c1 {figures[k].c1[-1]:.1f}, "
                    f"8th TTFT {figures[k].last_ttft[-1]:.2f} s"
                    for k in kinds
                ),
                flush=True,
            )

    def med(kind: str, name: str) -> float:
        return float(statistics.median(getattr(figures[kind], name)))

    title = f"median of {args.rounds} rounds"
    width = max(15, *(len(k) + 2 for k in kinds))
    print(f"\n{title:34}" + "".join(f"{k:>{width}}" for k in kinds))
    for name, label in (
        ("c8", "aggregate decode c=8 (tok/s)"),
        ("c1", "decode c=1 (tok/s)"),
        ("last_ttft", "TTFT of the 8th stream (s)"),
    ):
        print(f"{label:34}" + "".join(f"{med(k, name):{width}.2f}" for k in kinds))
    peers = [k for k in kinds if not k.startswith("warmfleet")]
    best = max(peers, key=lambda k: med(k, "c8"))
    print(
        f"\nwarmfleet c=8 / best peer ({best}): {med('warmfleet', 'c8') / med(best, 'c8'):.2f}x "
        "(target >= 1.2x)"
    )
    # Round by round: each ratio compares servers measured minutes apart at most.
    ratios = [
        figures["warmfleet"].c8[i] / max(figures[k].c8[i] for k in peers)
        for i in range(args.rounds)
    ]
    print(
        "warmfleet c=8 / best peer of the same round: "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + f" (median {statistics.median(ratios):.2f}x)"
    )
    print(
        "warmfleet 8th-stream TTFT / mlx_lm.server's: "
        f"{med('warmfleet', 'last_ttft') / med('mlx_lm.server', 'last_ttft'):.2f}x (target <= 1x)"
    )
    if quantized:
        ratios = [figures[quantized].c8[i] / figures["warmfleet"].c8[i] for i in range(args.rounds)]
        print(
            f"{quantized} c=8 / float32 KV's, round by round: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
            + f" (median {statistics.median(ratios):.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
