"""The router's whole route stage at fleet scale: every backend scored (admission of each,
one walk for the fleet, a candidate and the policy's scores for every backend: the
planner before the shortlist) against the shortlist (the fleet's view kept between
requests, one walk, a sample of each group of alike backends scored:
`warmfleet_router.shortlist`).

The fleet and the requests are bench/router_index.py's: every backend holds an agent's
warm head (12 blocks) by its events and three sessions' histories of its own; each
request is one session's next turn (`--blocks` blocks, its history on one backend), with
random loads of 0-3 in flight. The last column: how often the two picked the same
backend, and how often the shortlist picked the session's (its longest run; bounded
load may spill a request elsewhere). Thread CPU time per request, medians of
`--runs` runs of `--requests` requests with their range, the two interleaved.

    .venv/bin/python bench/router_route_stage.py [--backends 4,25,100,250] [--blocks 120]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import subprocess
import time

from router_index import fleet, session

from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.index import BlockIndex
from warmfleet_router.planning import scored
from warmfleet_router.policy import Candidate, RoutingRequest, admit, build
from warmfleet_router.shortlist import fleet_view, shortlist


def every_backend(index: BlockIndex, backends: list[Backend], request: object, turn: int) -> str:
    """The planner's route stage before the shortlist."""
    everyone = [Candidate(b.name, b.in_flight, ready=b.usable, models=b.models) for b in backends]
    admitted = {c.name for c in admit(everyone, RoutingRequest(None, fleet=everyone))}
    chosen = [b for b in backends if b.name in admitted]
    predictions = index.predict_fleet({b.name: request for b in chosen})  # type: ignore[misc]
    candidates = [scored(b, predictions[b.name].hit) for b in chosen]
    tie = str(turn).encode()
    return build("prefix").decide(candidates, RoutingRequest(tie_key=tie, turn=turn)).backend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="4,25,100,250")
    p.add_argument("--blocks", type=int, default=120)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    policy = build("prefix")
    print(f"{cpu_model()}; {args.blocks}-block requests, {args.requests} a run, {args.runs} runs")
    print(
        "| backends | every backend scored, ms | the shortlist, ms | ratio "
        "| same pick / the session's backend, before and after (last run) |"
    )
    print("|---|---|---|---|---|")
    for size in (int(n) for n in args.backends.split(",")):
        index, names = fleet(size, args.blocks)
        rng = random.Random(size)
        backends = [
            Backend(
                BackendSpec(n, f"http://{n}"),
                health="ready",
                fingerprint="f",
                index_mode="following",
                in_flight=rng.randint(0, 3),
            )
            for n in names
        ]
        view = fleet_view(backends, index, {b.name: "f" for b in backends})
        in_flight = sum(b.in_flight for b in backends)
        old: list[float] = []
        new: list[float] = []
        for _ in range(args.runs):
            spent_old = spent_new = 0.0
            same = longest = longest_before = 0
            for turn in range(args.requests):
                owner = turn % size
                request = session(owner, 0, args.blocks)
                started = time.thread_time()
                before = every_backend(index, backends, request, turn)
                spent_old += time.thread_time() - started
                started = time.thread_time()
                short = shortlist(view, index, {"f": request}, view.admitted(None), b"%d" % turn)
                candidates = [scored(b, short.predictions[b.name].hit) for b in short.backends]
                tie = str(turn).encode()
                sampled = len(short.backends) < size
                asked = RoutingRequest(
                    tie_key=tie, turn=turn, fleet_load=(in_flight, size) if sampled else None
                )
                after = policy.decide(candidates, asked).backend
                spent_new += time.thread_time() - started
                same += before == after
                longest += after == names[owner]
                longest_before += before == names[owner]
            old.append(spent_old / args.requests * 1e3)
            new.append(spent_new / args.requests * 1e3)
        ratio = statistics.median(old) / statistics.median(new)
        n = args.requests
        agree = f"{same / n:.0%} / {longest_before / n:.0%}, {longest / n:.0%}"
        print(f"| {size} | {figure(old)} | {figure(new)} | {ratio:.1f}x | {agree} |", flush=True)


def figure(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line
        )
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = platform.processor() or platform.machine()
    return name


if __name__ == "__main__":
    main()
