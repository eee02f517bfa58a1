"""The router at fleet scale, measured where it counts: a simulated fleet of N Macs
(`warmfleet_cli.local_fleet`, as `warmfleet up --engine sim` starts it, the agents'
heads warm as `sim run` warms them), then agent sessions through its router, closed
loop: `--sessions` sessions of a generated trace (`warmfleet sim trace`: Claude Code
and Codex bodies as the CLIs send them, session headers), their first `--turns` steps
each, `--concurrency` sessions at a time (the first ones starting over `--ramp`
seconds), each step sent when the previous one's response has ended. The router (and
its key workers) run on CPU 0, everything else (the simulated Macs, the operator, this
client) on the other CPUs (`sched_setaffinity`, as `taskset` does).

Per fleet size: the router's CPU per request (its process, from /proc) and by stage
(`warmfleet_router_request_cpu_seconds_total`: prepare, the body parsed and keyed;
route, the index and the policy), its decision time p50/p99 (arrival to backend chosen,
from its histogram's buckets, interpolated within a bucket), its CPU over an idle
window before the load, its RSS and index bytes after it, and the fleet's token hit
rate (the responses' usage). `--peer-checkout DIR` runs the same fleet from another
checkout's code (e.g. `git worktree add /tmp/parent HEAD~1`) right after each, so two
routers are measured side by side in each run. Medians of `--runs` with their range.

    .venv/bin/python bench/router_fleet.py [--nodes 4,25,100,250] [--runs 3]
        [--sessions 300] [--turns 3] [--concurrency 32] [--ramp 10] [--peer-checkout DIR]

Linux only (/proc, sched_setaffinity).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from warmfleet_cli import local_fleet
from warmfleet_cli.local_fleet import FleetOptions, LocalFleet
from warmfleet_cli.sim import trace as traces
from warmfleet_cli.sim.bodies import BodyOptions, SessionBodies
from warmfleet_cli.sim.replay import Outcome
from warmfleet_cli.sim.replay import _send as send_streaming  # the replay's own client
from warmfleet_cli.sim.run import cpu_model
from warmfleet_cli.sim.sampling import process_usage
from warmfleet_cli.sim.warm_sets import captured_prompts, warm_prompt_set
from warmfleet_common.crd import FLEET_LABEL

PROFILE = "m4-max-qwen3-30b-a3b-4bit"
CPU_METRIC = "warmfleet_router_request_cpu_time_seconds"
DECISION_METRIC = "warmfleet_router_decision_duration_seconds"
ROUTER_CPU = 0


@dataclass
class Figures:
    """One fleet size, one run, one code."""

    requests: int = 0
    failed: int = 0
    cpu_ms: float = 0.0  # the router process's, per request
    system_share: float = 0.0  # of that CPU, in the kernel (sockets, epoll)
    stages_ms: dict[str, float] = field(default_factory=dict)  # per request
    decision_p50_ms: float = 0.0
    decision_p99_ms: float = 0.0
    idle_share: float = 0.0  # of one core
    rss_mb: float = 0.0
    index_mb: float = 0.0
    hit_rate: float = 0.0
    errors: list[tuple[str, int]] = field(default_factory=list)  # the commonest, counted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="4,25,100,250", help="fleet sizes, comma-separated")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sessions", type=int, default=300)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument(
        "--ramp",
        type=float,
        default=10.0,
        help="s over which the first sessions start (0: all at once, a burst of "
        "--concurrency first requests that queue behind each other's keying)",
    )
    p.add_argument("--idle-window", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=20.0, help="s after warm, before idle")
    p.add_argument("--sim-speed", type=float, default=20.0)
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--peer-checkout", help="a second fleet's code (another checkout)")
    p.add_argument(
        "--learn-min-sessions", type=int, default=0,
        help="the router's learning (0: off, as routers before it had none; up's default 3)",
    )  # fmt: skip
    args = p.parse_args()
    signal.signal(signal.SIGTERM, stop)  # a kill stops the fleet too (its finally blocks)
    sizes = [int(n) for n in args.nodes.split(",")]
    header, records = make_trace(args.sessions)
    codes = [("this", None)] + ([("peer", Path(args.peer_checkout))] if args.peer_checkout else [])
    results: dict[tuple[int, str], list[Figures]] = {}
    for run in range(args.runs):
        for nodes in sizes:
            for label, checkout in codes:
                figures = one(args, nodes, checkout, header, records)
                results.setdefault((nodes, label), []).append(figures)
                print(f"run {run + 1}, {nodes} nodes, {label}: {brief(figures)}", flush=True)
    print(f"\n{cpu_model()}, {os.cpu_count()} CPUs; the router on CPU {ROUTER_CPU}; profile "
          f"{PROFILE} at {args.sim_speed:g}x; {args.sessions} sessions x {args.turns} turns, "
          f"{args.concurrency} at a time; medians of {args.runs} (range)")  # fmt: skip
    for (nodes, label), runs in sorted(results.items()):
        print(f"{nodes:4d} nodes, {label}:")
        for line in table(runs):
            print("    " + line)


def stop(signum: int, _: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def make_trace(sessions: int) -> tuple[dict[str, Any], list[traces.Record]]:
    """A trace with enough sessions of at least one step, no node events."""
    params = traces.TraceParams(
        developers=max(20, sessions // 3), upgrades=(), node_lost=None, nodes_added=None,
        rolling_restart=None,
    )  # fmt: skip
    trace = traces.generate(params)
    return trace.header, list(trace.records)


def one(
    args: argparse.Namespace,
    nodes: int,
    checkout: Path | None,
    header: dict[str, Any],
    records: list[traces.Record],
) -> Figures:
    env_path = os.environ.get("PYTHONPATH")
    if checkout is not None:
        code = ("common", "daemon", "router", "operator", "cli")
        os.environ["PYTHONPATH"] = os.pathsep.join(str(checkout / c) for c in code)
    try:
        with tempfile.TemporaryDirectory() as folder:
            options = FleetOptions(
                nodes=nodes, engine="sim", profile=PROFILE, sim_speed=args.sim_speed,
                port=args.port, log_level="warning", output_to_stderr=True,
                max_context=int(header["params"]["context_tokens"]),
                learn_min_sessions=args.learn_min_sessions,
            )  # fmt: skip
            warm = [warm_prompt_set(captured_prompts(header, records), {FLEET_LABEL: "local"})]
            fleet = LocalFleet(options, Path(folder) / "fleet", secrets.token_urlsafe(16), warm)
            with older_router(checkout is not None and not args.learn_min_sessions):
                fleet.start()
            try:
                return measure(args, fleet, nodes, header, records)
            finally:
                fleet.stop()
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path


@contextlib.contextmanager
def older_router(older: bool) -> Iterator[None]:
    """A router from before learning takes no --learn-min-sessions: with learning off,
    leave the flag out of the command that starts it."""
    spawn = local_fleet._spawn
    if older:

        def without_learning(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
            if "--learn-min-sessions" in cmd:
                at = cmd.index("--learn-min-sessions")
                cmd = cmd[:at] + cmd[at + 2 :]
            return spawn(cmd, *args, **kwargs)

        local_fleet._spawn = without_learning
    try:
        yield
    finally:
        local_fleet._spawn = spawn


def measure(
    args: argparse.Namespace,
    fleet: LocalFleet,
    nodes: int,
    header: dict[str, Any],
    records: list[traces.Record],
) -> Figures:
    wait_warm(fleet, nodes)
    router = next(c for c in fleet.children if c.name == "router").process.pid
    pin(router)
    time.sleep(args.settle)
    figures = Figures()
    before = process_usage(router)["cpu_seconds"]
    time.sleep(args.idle_window)
    figures.idle_share = (process_usage(router)["cpu_seconds"] - before) / args.idle_window
    auth = {"Authorization": f"Bearer {fleet.token}"}
    metrics_before = read_metrics(fleet.router_url, auth)
    cpu_before = process_usage(router)["cpu_seconds"]
    kernel_before = kernel_seconds(router)
    outcomes = asyncio.run(load(fleet.router_url, header, records, args))
    usage = process_usage(router)
    spent = usage["cpu_seconds"] - cpu_before
    figures.system_share = (kernel_seconds(router) - kernel_before) / max(spent, 1e-9)
    metrics_after = read_metrics(fleet.router_url, auth)
    figures.requests = len(outcomes)
    figures.failed = sum(o.error is not None for o in outcomes)
    figures.errors = Counter(o.error[:120] for o in outcomes if o.error).most_common(3)
    served = max(1, figures.requests - figures.failed)
    figures.cpu_ms = (usage["cpu_seconds"] - cpu_before) * 1e3 / served
    decided = metrics_after["decisions"] - metrics_before["decisions"]
    for stage, seconds in metrics_after["stages"].items():
        spent = seconds - metrics_before["stages"].get(stage, 0.0)
        figures.stages_ms[stage] = spent * 1e3 / max(1, decided)
    buckets = {
        le: metrics_after["buckets"][le] - metrics_before["buckets"].get(le, 0.0)
        for le in metrics_after["buckets"]
    }
    figures.decision_p50_ms = quantile(buckets, 0.5) * 1e3
    figures.decision_p99_ms = quantile(buckets, 0.99) * 1e3
    figures.rss_mb = usage["rss_bytes"] / 2**20
    status = httpx.get(f"{fleet.router_url}/v1/router/status", headers=auth, timeout=30).json()
    figures.index_mb = int(status.get("index", {}).get("estimated_bytes", 0)) / 2**20
    prompt = sum(o.prompt_tokens or 0 for o in outcomes)
    figures.hit_rate = sum(o.cached_tokens or 0 for o in outcomes) / max(1, prompt)
    return figures


def kernel_seconds(pid: int) -> float:
    """The system CPU time of `pid` (stime, from /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[12]) / os.sysconf("SC_CLK_TCK")


def wait_warm(fleet: LocalFleet, nodes: int, timeout: float = 900.0) -> None:
    """Every node ready at the router and holding its warm set, every prompt warm."""
    deadline = time.monotonic() + timeout
    urls = [fleet.node_url(i) for i in range(1, nodes + 1)]
    auth = {"Authorization": f"Bearer {fleet.token}"}
    pending = list(urls)
    while pending:
        dead = fleet.dead()
        if dead is not None:
            raise RuntimeError(f"{dead.name} exited with {dead.process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not warm in {timeout:.0f} s: {len(pending)} nodes")
        if fleet.ready():
            pending = [u for u in pending if not warm(u, auth)]
        time.sleep(0.5)


def warm(url: str, auth: dict[str, str]) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        if httpx.get(f"{url}/readyz", params={"warm": "true"}, timeout=5).status_code == 200:
            status = httpx.get(f"{url}/v1/status", headers=auth, timeout=5).json()
            return int((status.get("warm_set_counts") or {}).get("sets", 0)) >= 1
    return False


def pin(router: int) -> None:
    """The router and its children (key workers) on ROUTER_CPU, every other process of
    this machine's fleet (and this one) on the rest."""
    others = set(range(os.cpu_count() or 1)) - {ROUTER_CPU} or {ROUTER_CPU}
    mine = set(process_tree(router))
    for pid in process_tree(os.getpid()):
        for tid in threads(pid):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, {ROUTER_CPU} if pid in mine else others)


def process_tree(root: int) -> Iterator[int]:
    yield root
    with contextlib.suppress(OSError):
        for tid in threads(root):
            children = Path(f"/proc/{root}/task/{tid}/children").read_text().split()
            for child in children:
                yield from process_tree(int(child))


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


async def load(
    url: str, header: dict[str, Any], records: list[traces.Record], args: argparse.Namespace
) -> list[Outcome]:
    """`args.sessions` sessions' first `args.turns` steps, `args.concurrency` at a time."""
    sessions = [s for s in traces.sessions(records).values() if s[0]["turn"] == 0]
    chosen = [s[: args.turns] for s in sessions[: args.sessions]]
    queue: asyncio.Queue[list[traces.Record]] = asyncio.Queue()
    for steps in chosen:
        queue.put_nowait(steps)
    options = BodyOptions.of(header)
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def worker(slot: int) -> None:
            await asyncio.sleep(slot * args.ramp / args.concurrency)  # sessions start apart
            while not queue.empty():
                steps = queue.get_nowait()
                bodies, reply = SessionBodies(options), None
                for step in steps:
                    request = bodies.request(step, reply)
                    outcome = Outcome(
                        step["session"], step["dev"], step["agent"], step["version"],
                        step["turn"], step["kind"], sent_s=0.0,
                    )  # fmt: skip
                    outcomes.append(outcome)
                    try:
                        reply = await send_streaming(
                            client, request.path, request.headers, request.body, outcome,
                            time.monotonic(),
                        )  # fmt: skip
                    except (httpx.HTTPError, ValueError) as exc:
                        outcome.error = f"{type(exc).__name__}: {exc}"
                        break

        await asyncio.gather(*(worker(slot) for slot in range(args.concurrency)))
    return outcomes


def read_metrics(url: str, auth: dict[str, str]) -> dict[str, Any]:
    text = httpx.get(f"{url}/metrics", headers=auth, timeout=30).text
    stages: dict[str, float] = {}
    buckets: dict[float, float] = {}
    decisions = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == CPU_METRIC:
            for s in family.samples:
                if s.name.endswith("_total"):
                    stage = s.labels.get("warmfleet_stage", "?")
                    stages[stage] = stages.get(stage, 0.0) + s.value
        elif family.name == DECISION_METRIC:
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    decisions += s.value
    return {"stages": stages, "buckets": buckets, "decisions": decisions}


def quantile(cumulative: dict[float, float], q: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower  # past the last finite bucket: its bound, as Prometheus says
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def brief(f: Figures) -> str:
    stages = ", ".join(f"{k} {v:.2f}" for k, v in sorted(f.stages_ms.items()))
    return (
        f"{f.requests} requests ({f.failed} failed), router {f.cpu_ms:.2f} ms CPU each "
        f"({f.system_share * 100:.0f}% in the kernel; {stages}), decision p50 "
        f"{f.decision_p50_ms:.2f} ms p99 {f.decision_p99_ms:.2f} ms, "
        f"idle {f.idle_share * 100:.1f}% of a core, RSS {f.rss_mb:.0f} MB, index "
        f"{f.index_mb:.1f} MB, hit rate {f.hit_rate:.3f}"
        + "".join(f"\n  failed {n}x: {error}" for error, n in f.errors)
    )


def table(runs: list[Figures]) -> list[str]:
    def row(name: str, values: list[float], unit: str, digits: int = 2) -> str:
        med = statistics.median(values)
        return f"{name}: {med:.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    stages = sorted({s for r in runs for s in r.stages_ms})
    lines = [
        row("router CPU per request", [r.cpu_ms for r in runs], " ms"),
        row("  of it in the kernel", [r.system_share * 100 for r in runs], "%", 0),
        *(row(f"  {s} stage", [r.stages_ms.get(s, 0.0) for r in runs], " ms") for s in stages),
        row("decision p50", [r.decision_p50_ms for r in runs], " ms"),
        row("decision p99", [r.decision_p99_ms for r in runs], " ms"),
        row("idle", [r.idle_share * 100 for r in runs], "% of a core", 1),
        row("RSS", [r.rss_mb for r in runs], " MB", 0),
        row("index", [r.index_mb for r in runs], " MB", 1),
        row("token hit rate", [r.hit_rate for r in runs], "", 3),
        row("failed requests", [float(r.failed) for r in runs], "", 0),
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
