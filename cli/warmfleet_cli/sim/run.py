"""`warmfleet sim run TRACE --out DIR`: one command from a trace to its report. It starts a
simulated fleet (`warmfleet up --engine sim`'s processes: the daemons many to a process,
the operator in local mode, the router), warms the agents' heads a platform team would
have captured before the day (or none), replays the trace closed-loop, applies its node
events to the fleet's processes as they come (a node killed, nodes started and listed
as WarmNodes, every node drained and restarted in batches), samples router, nodes and
operator as it goes, and writes a run directory (`run.json`, `rows.jsonl`,
`events.jsonl`, `samples.jsonl`, `summary.json`) and its report (`report/`).

A run says when it cannot be trusted: `valid` is false when the simulated engines ran
more than MAX_BEHIND_SHARE late (the machine could not keep up with `--sim-speed`) or the
replay's own event loop lagged more than MAX_CLIENT_LAG_S of the Mac's time.

Times: the fleet runs `speed` times faster than the profiled Macs; every time in the
run directory is the Mac's (wall x speed), except `operator_ready_s`, which is wall
time: the operator and the router are not simulated and run at their own pace.
"""

from __future__ import annotations

import asyncio
import json
import math
import platform
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import httpx

from warmfleet_cli.local_fleet import FleetOptions, LocalFleet, port_free
from warmfleet_cli.sim import sampling
from warmfleet_cli.sim.replay import Outcome, ReplayOptions, outcome_row, replay, summary
from warmfleet_cli.sim.trace import Record, read
from warmfleet_cli.sim.warm_sets import captured_prompts, warm_prompt_set
from warmfleet_common.crd import FLEET_LABEL

MAX_BEHIND_SHARE = 0.10  # of the Mac's time charged, run late by the simulation
MAX_CLIENT_LAG_S = 0.5  # the replay's event-loop lag p99, in the Mac's seconds
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RunOptions:
    trace: Path
    out: Path
    profile: str
    nodes: int = 10
    policy: str = "prefix"
    warm: bool = True
    speed: float | None = None  # default: the trace's compression
    sim_per_process: int = 50
    host: str = "127.0.0.1"
    port: int = 8000
    sessions: int | None = None
    sample_every_s: float = 5.0  # wall
    restart_batch: int | None = None  # nodes restarted at once (default a tenth)
    label: str | None = None
    cache_memory_mb: int | None = None
    timeout_s: float = 600.0
    report: bool = True
    max_num_seqs: int | None = None  # each node's (the serve default otherwise)
    disk_tier: bool = False  # each node keeps its disk tier and snapshots in DIR/state
    learn_min_sessions: int = 3  # the router learns heads (warmfleet up's default; 0: off)


class RunError(RuntimeError):
    """The fleet could not be started or the trace read; the message says why."""


def run(options: RunOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """Runs the trace; returns run.json's content (the report is written too)."""
    try:
        header, lazy = read(options.trace)
        records = list(lazy)
    except (OSError, ValueError) as exc:
        raise RunError(str(exc)) from exc
    params = header.get("params", {})
    speed = options.speed or float(params.get("compress", 1.0))
    busy = [p for p in range(options.port, options.port + options.nodes + 1)
            if not port_free(options.host, p)]  # fmt: skip
    if busy:
        raise RunError(f"port(s) {', '.join(map(str, busy[:5]))} on {options.host} are in use")
    warm = []
    if options.warm:
        warm = [warm_prompt_set(captured_prompts(header, records), {FLEET_LABEL: "local"})]
    fleet_options = FleetOptions(
        nodes=options.nodes,
        engine="sim",
        profile=options.profile,
        sim_speed=speed,
        sim_per_process=options.sim_per_process,
        host=options.host,
        port=options.port,
        policy=options.policy,
        cache_memory_mb=options.cache_memory_mb,
        max_context=int(params["context_tokens"]) if params.get("context_tokens") else None,
        node_control=True,
        drain_seconds=max(2.0, 10.0 / speed),
        output_to_stderr=True,  # stdout is the run's summary
        max_num_seqs=options.max_num_seqs,
        state_dir=str(options.out / "state") if options.disk_tier else None,
        learn_min_sessions=options.learn_min_sessions,
    )
    problem = fleet_options.problem()
    if problem:
        raise RunError(problem)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    fleet = LocalFleet(fleet_options, out / "fleet", secrets.token_urlsafe(24), warm, say)
    label = options.label or f"{options.policy}, {'warm sets' if options.warm else 'no warm sets'}"
    meta: dict[str, Any] = {
        "trace": str(options.trace),
        "trace_params": params,
        "nodes": options.nodes,
        "profile": options.profile,
        "policy": options.policy,
        "warm": options.warm,
        "speed": speed,
        "cpu": cpu_model(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "disk_tier": options.disk_tier,
        "learn_min_sessions": options.learn_min_sessions,
        "label": label,
        "sessions": options.sessions,
    }
    previous = signal.signal(signal.SIGTERM, _terminate)  # the fleet is stopped on a kill too
    try:
        fleet.start()
        meta["operator_ready_s"] = _wait_warm(fleet, options, say)
        say(f"replaying {options.trace} at {speed:g}x on {options.nodes} simulated Macs")
        compress = float(params.get("compress", speed))
        if abs(compress - speed) > 1e-9 * speed:
            say(
                f"--sim-speed {speed:g} is not the trace's compression ({compress:g}): the "
                f"Macs see its arrivals {compress / speed:g}x as dense as the day's, and the "
                "run's times are the Macs' (for a lower speed, `sim trace --compress` too)"
            )
        result = asyncio.run(_replay(fleet, header, records, options, speed, meta))
    finally:
        fleet.stop()
        signal.signal(signal.SIGTERM, previous)
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    if options.report:
        from warmfleet_cli.sim.report import write_reports
        from warmfleet_cli.sim.report_run import load_run

        write_reports([load_run(out)], out / "report", 1800.0)
    return meta


def _terminate(signum: int, _: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _wait_warm(fleet: LocalFleet, options: RunOptions, say: Callable[[str], None]) -> float | None:
    """Until every node is ready at the router and, with warm sets, warm; returns the
    wall seconds from the last node's warm-up to every WarmPromptSet Ready."""
    deadline = time.monotonic() + START_TIMEOUT_S
    urls = [fleet.node_url(i) for i in range(1, options.nodes + 1)]
    last_warm: float | None = None
    while True:
        dead = fleet.dead()
        if dead is not None:
            raise RunError(f"{dead.name} exited with {dead.process.returncode}")
        if time.monotonic() > deadline:
            raise RunError(f"the fleet was not ready in {START_TIMEOUT_S:.0f} s")
        rejected = sampling.rejected_sets(fleet.folder / "warmfleet-status.json")
        if rejected:
            raise RunError(f"the warm set was refused: {rejected[:400]}")
        sets = 1 if options.warm else 0
        if last_warm is None and fleet.ready() and all(_warm(u, sets) for u in urls):
            last_warm = time.monotonic()
            say(f"{options.nodes} nodes ready and warm")
            if not options.warm:
                return None
        if last_warm is not None:
            status = sampling.operator_sets(fleet.folder / "warmfleet-status.json")
            everywhere = f"{options.nodes}/{options.nodes}"
            sets_ready = (
                bool(status.get("warm_sets")) and status["warm_sets_ready"] == status["warm_sets"]
            )
            if sets_ready and all(w == everywhere for w in status["warm_nodes"].values()):
                ready = time.monotonic() - last_warm
                say(f"every WarmPromptSet Ready on {options.nodes} nodes {ready:.1f} s "
                    "after the last node's warm-up")  # fmt: skip
                return ready
        time.sleep(0.2)


def _warm(url: str, sets: int = 0) -> bool:
    """The daemon at `url` holds at least `sets` warm sets and all its prompts are warm."""
    try:
        if httpx.get(f"{url}/readyz", params={"warm": "true"}, timeout=5).status_code != 200:
            return False
        counts = httpx.get(f"{url}/v1/status", timeout=5).json().get("warm_set_counts") or {}
    except (httpx.HTTPError, ValueError):
        return False
    return int(counts.get("sets", 0)) >= sets


async def _replay(
    fleet: LocalFleet,
    header: dict[str, Any],
    records: list[Record],
    options: RunOptions,
    speed: float,
    meta: dict[str, Any],
) -> dict[str, Any]:
    out = options.out
    rows = (out / "rows.jsonl").open("w", encoding="utf-8")
    events = (out / "events.jsonl").open("w", encoding="utf-8")
    samples = (out / "samples.jsonl").open("w", encoding="utf-8")
    lag = sampling.LoopLag()
    lags: list[float] = []
    router = next((c for c in fleet.children if c.name == "router"), None)
    replay_options = ReplayOptions(
        fleet.router_url, speed, timeout_s=options.timeout_s, sessions=options.sessions
    )
    last: dict[str, Any] = {}

    def done(outcome: Outcome) -> None:
        rows.write(json.dumps(outcome_row(outcome)) + "\n")
        rows.flush()

    async def apply_events(start: float) -> None:
        await _Changes(fleet, options, speed, start, events).apply(records)

    async def alongside(start: float) -> None:
        async with httpx.AsyncClient(timeout=10) as client:

            async def sample_forever() -> None:
                nonlocal last
                while True:
                    targets = sampling.Targets(
                        fleet.router_url,
                        router.process.pid if router else None,
                        fleet.token,
                        {f"node-{i}": fleet.node_url(i) for i in range(1, fleet.nodes + 1)},
                        fleet.folder / "warmfleet-status.json",
                    )
                    taken = await sampling.sample(client, targets)
                    recent = lag.take()
                    lags.extend(recent)
                    taken["client_lag_p99_s"] = _p99(recent) * speed
                    taken = {"t": round((time.monotonic() - start) * speed, 3), **taken}
                    samples.write(json.dumps(taken) + "\n")
                    samples.flush()
                    last = taken
                    await asyncio.sleep(options.sample_every_s)

            await asyncio.gather(lag.watch(), sample_forever())

    try:
        outcomes, _ = await replay(header, records, replay_options, done, alongside, apply_events)
    finally:
        for f in (rows, events, samples):
            f.close()
    result = summary(outcomes, [])
    result.pop("node_events_not_applied", None)
    result["operator_ready_s"] = meta.get("operator_ready_s")
    result["added_nodes_first_requests"] = _added_nodes_first(outcomes, options.nodes)
    spent = sum(n.get("sim_spent_s", 0.0) for n in last.get("nodes", {}).values())
    behind = sum(n.get("sim_behind_s", 0.0) for n in last.get("nodes", {}).values())
    share = behind / spent if spent else 0.0
    client_lag = _p99(lags) * speed
    result["sim_behind_share"] = round(share, 4)
    result["client_lag_p99_s"] = round(client_lag, 4)
    reasons = []
    if share > MAX_BEHIND_SHARE:
        reasons.append(f"the simulated engines ran {share:.0%} late (> {MAX_BEHIND_SHARE:.0%}): "
                       "lower --sim-speed with the trace's --compress, or the nodes")  # fmt: skip
    if client_lag > MAX_CLIENT_LAG_S:
        reasons.append(f"the replay's event loop lagged {client_lag:.2f} Mac-s at p99 "
                       f"(> {MAX_CLIENT_LAG_S}): lower --sim-speed with the trace's "
                       "--compress, or the developers")  # fmt: skip
    meta["valid"] = not reasons
    meta["invalid_reason"] = "; ".join(reasons) or None
    return result


class _Changes:
    """The trace's fleet events, applied to the fleet's processes when they come."""

    def __init__(
        self, fleet: LocalFleet, options: RunOptions, speed: float, start: float, log: IO[str]
    ) -> None:
        self.fleet = fleet
        self.options = options
        self.speed = speed
        self.start = start
        self.log = log
        self.lost: set[int] = set()
        self.tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return round((time.monotonic() - self.start) * self.speed, 3)

    def note(self, record: dict[str, Any]) -> None:
        self.log.write(json.dumps({"t": self.now(), **record}) + "\n")
        self.log.flush()

    async def apply(self, records: list[Record]) -> None:
        for event in (r for r in records if "event" in r):
            await asyncio.sleep(max(0.0, self.start + event["t"] - time.monotonic()))
            kind = event["event"]
            if kind == "agent-upgrade":
                self.note({"event": kind, "agent": event.get("agent"), "from": event.get("from"),
                           "to": event.get("to"), "applied": True})  # fmt: skip
            elif kind == "node-lost":
                node = int(event.get("node", 0)) + 1  # the trace counts nodes from 0
                if node > self.fleet.nodes:
                    self.note({"event": kind, "node": f"node-{node}", "applied": False,
                               "detail": f"the fleet has {self.fleet.nodes} nodes"})  # fmt: skip
                    continue
                self.fleet.kill_node(node)
                self.lost.add(node)
                self.note({"event": kind, "node": f"node-{node}", "applied": True})
            elif kind == "nodes-added":
                count = int(event.get("count", 1))
                try:
                    added = await asyncio.to_thread(self.fleet.add_nodes, count)
                except OSError as exc:
                    self.note({"event": kind, "count": count, "applied": False, "detail": str(exc)})
                    continue
                self.note({"event": kind, "count": count, "applied": True,
                           "detail": f"node-{added[0]}..node-{added[-1]}"})  # fmt: skip
            elif kind == "rolling-restart":
                self.note({"event": kind, "applied": True})
                self.tasks.append(asyncio.ensure_future(self.rolling_restart()))
            else:
                self.note({"event": kind, "applied": False, "detail": "unknown event"})
        await asyncio.gather(*self.tasks)

    async def rolling_restart(self) -> None:
        """Every live node drained and restarted, a batch at a time; the next batch once
        this one is ready again (and warm)."""
        nodes = [i for i in range(1, self.fleet.nodes + 1) if i not in self.lost]
        size = self.options.restart_batch or max(1, math.ceil(len(nodes) / 10))
        async with httpx.AsyncClient(timeout=5) as client:
            for at in range(0, len(nodes), size):
                batch = nodes[at : at + size]
                for node in batch:
                    self.fleet.stop_node(node)
                await asyncio.gather(*(self._until(client, n, "down") for n in batch))
                for node in batch:
                    self.fleet.start_node(node)
                await asyncio.gather(*(self._until(client, n, "warm") for n in batch))
                for node in batch:
                    self.note({"event": "node-restarted", "node": f"node-{node}", "applied": True})

    async def _until(self, client: httpx.AsyncClient, node: int, state: str) -> None:
        """Until `node` is down (refuses connections) or warm (ready, holding the warm
        set the operator pushes it once it is back)."""
        url = self.fleet.node_url(node)
        sets = 1 if self.options.warm else 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if state == "warm" and await asyncio.to_thread(_warm, url, sets):
                return
            if state == "down":
                try:
                    await client.get(f"{url}/readyz")
                except httpx.ConnectError:
                    return
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.2)
        self.note({"event": "node-restart-stuck", "node": f"node-{node}", "applied": False,
                   "detail": f"not {state} after 120 s"})  # fmt: skip


def _added_nodes_first(outcomes: list[Outcome], nodes: int) -> list[dict[str, Any]]:
    """Each node added mid-trace: its first routed request, and how much of it was cached."""
    first: dict[str, Outcome] = {}
    for o in sorted(outcomes, key=lambda o: o.sent_s):
        if o.node and o.node.startswith("node-") and int(o.node[5:]) > nodes:
            first.setdefault(o.node, o)
    return [
        {"node": n, "t": o.sent_s, "turn": o.turn, "kind": o.kind, "agent": o.agent,
         "prompt_tokens": o.prompt_tokens, "cached_tokens": o.cached_tokens}
        for n, o in sorted(first.items())
    ]  # fmt: skip


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main_say(line: str) -> None:
    print(f"warmfleet sim run: {line}", file=sys.stderr, flush=True)
