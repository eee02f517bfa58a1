"""Prefill fairness under overload on the embedded SmolLM2-135M: TTFT by prompt length,
with the prefill order's aging off (plain shortest-first) and on, side by side.

For each setting, one `warmfleet serve --prefill-aging-picks N`, then 16 clients for
`--seconds`: 12 send ~150-token prompts, 4 send ~2,400-token prompts (a nonce first in
each, so nothing is cached), one after another, 16 tokens each. No new requests start
after `--seconds`; the ones in flight finish (their TTFT counts). Prints TTFT p50/p99 by
prompt-length bucket and how many requests each bucket finished.

    .venv/bin/python bench/prefill_fairness.py [--seconds 90] [--aging 0,4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import defaultdict

from harness.client import stream
from harness.warmfleet import serve
from harness.workloads import QUESTIONS, system_prompt

CLIENTS = [("short", 150)] * 12 + [("long", 2400)] * 4


def percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(aging: int, seconds: float, tokenizer: object) -> dict[str, list[float]]:
    prompts = {
        (kind, i): system_prompt(tokenizer, tokens, f"fair-{aging}-{kind}-{i}")
        for kind, tokens in set(CLIENTS)
        for i in range(8)
    }
    ttfts: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()
    with serve("--prefill-aging-picks", str(aging), "--log-level", "warning") as s:
        stop_at = time.perf_counter() + seconds

        def client(n: int, kind: str) -> None:
            i = n
            while time.perf_counter() < stop_at:
                system = f"{n}-{i} " + prompts[(kind, i % 8)]
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
                ]
                ttft = stream(s.url, s.model, messages, 16).ttft_s
                with lock:
                    ttfts[kind].append(ttft)
                i += len(CLIENTS)

        threads = [
            threading.Thread(target=client, args=(n, kind)) for n, (kind, _) in enumerate(CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return ttfts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--aging", default="0,16", help="--prefill-aging-picks values to compare")
    args = ap.parse_args()
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    tokenizer = load_gguf_tokenizer_only()
    print(f"{'aging':>5} {'bucket':>6} {'done':>5} {'p50 TTFT':>10} {'p99 TTFT':>10} {'max':>8}")
    for aging in (int(a) for a in args.aging.split(",")):
        ttfts = run(aging, args.seconds, tokenizer)
        for kind in ("short", "long"):
            xs = ttfts.get(kind, [])
            if not xs:
                print(f"{aging:>5} {kind:>6} {0:>5} {'-':>10} {'-':>10}")
                continue
            print(
                f"{aging:>5} {kind:>6} {len(xs):>5} {statistics.median(xs):9.2f}s "
                f"{percentile(xs, 0.99):9.2f}s {max(xs):7.2f}s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
