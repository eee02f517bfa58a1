"""One tenant's burst against another's time to first token, with and without quotas.

One `warmfleet serve` on the embedded SmolLM2-135M behind a `warmfleet router`, both with
a keys file naming `steady` and `burst`. `steady` sends its requests one after another
(a shared 300-token system prompt, warm, and a question of its own; 8 tokens each) and
its TTFT is measured: first alone, then while `burst` sends ten times as much: 10 clients,
each a fresh 600-token prompt after another (nothing cached; 32 tokens each). The router
runs once without quotas and once with `burst` held to `--burst-quota` (by default one
request in flight, `concurrent_requests: 1`; a 429 with Retry-After for the rest, which
its clients wait out as the SDKs do). Prints `steady`'s TTFT p50 and p95 in each phase
and the ratio of the loaded p95 to the unloaded one, and how many of `burst`'s requests
were served and refused.

    .venv/bin/python bench/tenant_burst.py [--requests 40] [--only-quotas] \
        [--burst-quota '{concurrent_requests: 1, prompt_tokens_per_minute: 2400}']

With `--fleet N`: N simulated Macs (`warmfleet serve --engine sim --profile P`, one
process each, as one daemon a Mac) behind the router instead, no quotas, the router's
tenant share off (`--tenant-share-window 0`) and then on (its default): a tenant holding
its share of the fleet is kept off the backends the other tenant uses. Also prints how
many of `burst`'s requests were served by a backend `steady` was served by.

    .venv/bin/python bench/tenant_burst.py --fleet 4 [--profile NAME] [--requests 40]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from cache_timing_probe import cpu_model
from harness.client import stream_chat
from harness.warmfleet import router, serve, wait_following
from harness.workloads import QUESTIONS, system_prompt

KEYS = {"steady": "sk-steady-0123456789abcdef", "burst": "sk-burst-0123456789abcdefg"}
TOKEN = "burst-admin-token-0123"


def percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def steady_ttfts(
    url: str, system: str, requests: int, tag: str, backends: set[str] | None = None
) -> list[float]:
    out = []
    headers = {"Authorization": f"Bearer {KEYS['steady']}"}
    for i in range(requests):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({tag} {i})"},
        ]
        s = stream_chat(url, "default", messages, 8, headers)
        if backends is not None:
            backends.add(s.backend)
        first = s.first_at if s.first_at is not None else s.ended_at
        out.append(first - s.sent_at)
        time.sleep(0.2)
    return out


def burst(
    url: str, tokenizer: object, stop: threading.Event, counts: dict[str, int], where: list[str]
) -> None:
    """Ten clients sending fresh long prompts back to back, waiting out 429s."""
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {KEYS['burst']}"}

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            prompt = system_prompt(tokenizer, 600, f"burst-{n}-{i}-{time.monotonic_ns()}")
            messages = [{"role": "system", "content": prompt}, {"role": "user", "content": "Go."}]
            try:
                served = stream_chat(url, "default", messages, 32, headers)
                with lock:
                    counts["served"] += 1
                    where.append(served.backend)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 429:
                    raise
                with lock:
                    counts["refused"] += 1
                wait = float(exc.response.headers.get("retry-after", "1"))
                stop.wait(wait)
            i += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(10)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=120)


def phase(url: str, tokenizer: object, system: str, requests: int, tag: str) -> dict:
    steady_at: set[str] = set()
    alone = steady_ttfts(url, system, requests, f"{tag}-alone", steady_at)
    stop, counts, where = threading.Event(), {"served": 0, "refused": 0}, []
    loader = threading.Thread(target=burst, args=(url, tokenizer, stop, counts, where))
    loader.start()
    time.sleep(5)  # the burst is under way
    loaded = steady_ttfts(url, system, requests, f"{tag}-loaded", steady_at)
    stop.set()
    loader.join()
    shared = sum(1 for backend in where if backend in steady_at)
    return {"alone": alone, "loaded": loaded, "on_steadys": shared, **counts}


def report(label: str, found: dict) -> None:
    alone, loaded = found["alone"], found["loaded"]
    p95_alone, p95_loaded = percentile(alone, 0.95), percentile(loaded, 0.95)
    print(
        f"{label:>9}: steady TTFT alone p50 {statistics.median(alone):.3f} s p95 "
        f"{p95_alone:.3f} s; under the burst p50 {statistics.median(loaded):.3f} s p95 "
        f"{p95_loaded:.3f} s (p95 x{p95_loaded / p95_alone:.2f}); burst served "
        f"{found['served']} ({found['on_steadys']} on a backend steady used), refused "
        f"{found['refused']}",
        flush=True,
    )


def fleet_phases(args: argparse.Namespace, folder: Path, tokenizer: object, system: str) -> None:
    """`--fleet N`: simulated Macs, one process each; the tenant share off, then on."""
    print(
        f"settings: {args.fleet} simulated Macs (--engine sim --profile {args.profile}, one "
        f"process each) behind a router, no quotas; steady: {args.requests} requests one after "
        "another (300-token shared system prompt, 8 tokens); burst: 10 clients of fresh "
        "600-token prompts (32 tokens)"
    )
    keys = ["--api-keys-file", str(folder / "api-keys")]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    sim = ["--engine", "sim", "--profile", args.profile, "--log-level", "warning"]
    for label, share in (("share off", ["--tenant-share-window", "0"]), ("share on", [])):
        with contextlib.ExitStack() as stack:
            macs = [stack.enter_context(serve(*keys, *sim, token=TOKEN)) for _ in range(args.fleet)]
            front = stack.enter_context(
                router([m.url for m in macs], *keys, *share, "--log-level", "warning", token=TOKEN)
            )
            wait_following(front.url, auth)
            report(label, phase(front.url, tokenizer, system, args.requests, label))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=40, help="steady's requests per phase")
    ap.add_argument(
        "--burst-quota",
        default="{concurrent_requests: 1}",
        help="burst's limits in the quotas file (YAML)",
    )
    ap.add_argument("--only-quotas", action="store_true", help="skip the run without quotas")
    ap.add_argument("--fleet", type=int, default=0, help="simulated Macs instead of one daemon")
    ap.add_argument("--profile", default="linux-x86-2core-smollm2-135m-f32", help="--fleet's")
    args = ap.parse_args()
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    tokenizer = load_gguf_tokenizer_only()
    folder = Path(tempfile.mkdtemp(prefix="tenant-burst-"))
    (folder / "api-keys").write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    (folder / "quotas.yaml").write_text(f"tenants: {{burst: {args.burst_quota}}}\n")
    system = system_prompt(tokenizer, 300, "steady-shared-system-prompt")
    print(f"machine: {cpu_model()}")
    if args.fleet:
        fleet_phases(args, folder, tokenizer, system)
        return 0
    print(
        f"settings: embedded SmolLM2-135M, 1 daemon behind a router; steady: {args.requests} "
        "requests one after another (300-token shared system prompt, 8 tokens); burst: 10 "
        "clients of fresh 600-token prompts (32 tokens)"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    keys = ["--api-keys-file", str(folder / "api-keys")]
    print(f"burst's quota: {args.burst_quota}")
    phases = [("no quotas", []), ("quotas", ["--quotas", str(folder / "quotas.yaml")])]
    for label, quotas in phases[1:] if args.only_quotas else phases:
        with (
            serve(*keys, "--log-level", "warning", token=TOKEN) as daemon,
            router([daemon.url], *keys, *quotas, "--log-level", "warning", token=TOKEN) as front,
        ):
            wait_following(front.url, auth)
            report(label, phase(front.url, tokenizer, system, args.requests, label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
