"""The router's route stage at fleet scale: predicting a request's cached tokens on every
backend, one walk per backend (`predict_tiers` of each backend's keying: the router
before the inverted index) against one walk for the fleet (`predict_fleet`).

Each backend holds an agent's warm head (12 blocks: ~1.5k tokens at the daemons' 128)
by its events; every backend also holds the history of a few sessions of its own; the
request is one session's next turn (`--blocks` blocks, its head and history held by one
backend, its last block new). Both ways give the same predictions (checked here, and
by tests/router/test_index_fleet.py); the figures are CPU time per request, medians of
`--runs` runs of `--requests` requests each, with their range.

    .venv/bin/python bench/router_index.py [--backends 4,25,100,250] [--blocks 120]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time

from warmfleet_router.index import BlockIndex
from warmfleet_router.keys import RequestBlocks

BLOCK_TOKENS = 128
HEAD_BLOCKS = 12
SESSIONS_PER_BACKEND = 3


def key(*parts: int) -> bytes:
    return b"".join(p.to_bytes(4, "big") for p in parts).ljust(16, b"\0")


def session(backend: int, n: int, blocks: int) -> RequestBlocks:
    keys = [key(0, i) for i in range(HEAD_BLOCKS)]
    keys += [key(1 + backend, n, i) for i in range(blocks - HEAD_BLOCKS)]
    ends = tuple(BLOCK_TOKENS * (i + 1) for i in range(blocks))
    return RequestBlocks(tuple(keys), ends, ends[-1] + 40)


def fleet(backends: int, blocks: int) -> tuple[BlockIndex, list[str]]:
    index = BlockIndex(budget_bytes=1 << 30)
    names = [f"node-{i}" for i in range(backends)]
    for b, name in enumerate(names):
        entries = [(key(0, i), False) for i in range(HEAD_BLOCKS)]
        for n in range(SESSIONS_PER_BACKEND):
            entries += [(k, False) for k in session(b, n, blocks).keys[HEAD_BLOCKS:-1]]
        index.load_snapshot(name, entries)
    return index, names


def per_backend(index: BlockIndex, names: list[str], request: RequestBlocks) -> dict[str, int]:
    return {n: index.predict_tiers(n, index.on(n, request)).total for n in names}


def one_walk(index: BlockIndex, names: list[str], request: RequestBlocks) -> dict[str, int]:
    return {n: p.hit.total for n, p in index.predict_fleet(dict.fromkeys(names, request)).items()}


def cpu_per_request(
    fn, index: BlockIndex, names: list[str], requests: list[RequestBlocks]
) -> float:  # type: ignore[no-untyped-def]
    started = time.thread_time()
    for request in requests:
        fn(index, names, request)
    return (time.thread_time() - started) / len(requests)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="4,25,100,250")
    parser.add_argument("--blocks", type=int, default=120, help="the request's blocks")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; request: {args.blocks} blocks of {BLOCK_TOKENS} tokens")
    print("| backends | one walk per backend, ms | one walk for the fleet, ms | ratio |")
    print("|---|---|---|---|")
    for count in (int(c) for c in args.backends.split(",")):
        index, names = fleet(count, args.blocks)
        requests = [
            session(i % count, i % SESSIONS_PER_BACKEND, args.blocks) for i in range(args.requests)
        ]
        for request in requests[:5]:
            assert per_backend(index, names, request) == one_walk(index, names, request)
        old, new = [], []
        for _ in range(args.runs):  # interleaved, so load on the machine hits both
            old.append(cpu_per_request(per_backend, index, names, requests) * 1e3)
            new.append(cpu_per_request(one_walk, index, names, requests) * 1e3)
        o, n = statistics.median(old), statistics.median(new)
        print(
            f"| {count} | {o:.3f} ({min(old):.3f}-{max(old):.3f}) "
            f"| {n:.3f} ({min(new):.3f}-{max(new):.3f}) | {o / n:.1f}x |"
        )


if __name__ == "__main__":
    main()
