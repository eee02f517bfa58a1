"""`warmfleet sim`'s verbs: each one a (help, description, add_arguments, run) entry of
VERBS, so a new verb is one function pair and one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warmfleet_cli.sim import report


@dataclass(frozen=True)
class Verb:
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def hour(value: str) -> float:
    """HH:MM (or a plain number of hours) as hours."""
    hours, _, minutes = value.partition(":")
    try:
        at = int(hours) + (int(minutes) / 60 if minutes else 0.0)
    except ValueError:
        try:
            at = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r}: expected HH:MM") from None
    if not 0 <= at <= 24:
        raise argparse.ArgumentTypeError(f"{value!r}: not an hour of the day")
    return at


def _timed(value: str, default: int) -> tuple[float, int] | None:
    """HH:MM[/N], or none."""
    if value == "none":
        return None
    at, _, n = value.partition("/")
    try:
        return hour(at), int(n) if n else default
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected HH:MM[/N] or none") from None


# An event option not given (None is its "none"); not a str, which argparse would parse.
_UNSET: Any = object()
UPGRADE = ("claude-code", 12.0)


def _upgrade(value: str) -> tuple[str, float] | None:
    if value == "none":
        return None
    agent, at, when = value.partition("@")
    if not at:
        raise argparse.ArgumentTypeError(f"{value!r}: expected AGENT@HH:MM or none")
    return agent, hour(when)


TRACE_DESCRIPTION = """\
Write an agent-population trace: N developers' (--developers) Claude Code and Codex sessions over
a working day, compressed in time, with an agent upgrade, a node lost, nodes added and a
rolling restart. JSONL: a header (format warmfleet-trace/1, the parameters, and where
every number comes from: this repository's measurements of the real CLIs, published
agent traces, or an assumption that is a parameter), then one compact record per request
or event, in time order, from which a replay rebuilds each request's exact body
(warmfleet_cli.sim.bodies). The same parameters and seed give the same file, byte for byte."""


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="FILE", help="the trace (- for stdout)")
    p.add_argument("--developers", type=int, default=20, metavar="N", help="(20)")
    p.add_argument("--seed", type=int, default=0, help="(0)")
    p.add_argument("--start", type=hour, default=9.0, metavar="HH:MM", help="the day's (9:00)")
    p.add_argument("--end", type=hour, default=17.0, metavar="HH:MM", help="the day's (17:00)")
    p.add_argument(
        "--compress",
        type=float,
        default=24.0,
        metavar="X",
        help="the day's seconds per trace second (24: 8 hours in 20 minutes)",
    )
    p.add_argument(
        "--claude-share",
        type=float,
        default=None,
        metavar="F",
        help="of developers on Claude Code, the rest on Codex (0.63, TraceLab's sessions)",
    )
    p.add_argument(
        "--sessions-per-day",
        type=float,
        default=None,
        metavar="F",
        help="per developer, Poisson (4.2, a published month of Claude Code use)",
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        default=65_536,
        metavar="N",
        help="the context served to the agents; they compact at --compact-at of it (65536)",
    )
    p.add_argument("--compact-at", type=float, default=None, metavar="F", help="(0.75)")
    p.add_argument(
        "--claude-memory",
        action="store_true",
        help="Claude Code names each developer's memory directory in its system prompt "
        "(its default; without: CLAUDE_CODE_DISABLE_AUTO_MEMORY=1, one prompt for all)",
    )
    p.add_argument("--date", default="2026-12-07", help="the day the agents write (2026-12-07)")
    p.add_argument(
        "--upgrade",
        type=_upgrade,
        action="append",
        metavar="AGENT@HH:MM",
        help="an agent's upgrade: new sessions from then on use its next version "
        "(claude-code@12:00 if within the day; repeat for more; none: no upgrade)",
    )
    p.add_argument(
        "--node-lost",
        type=lambda v: _timed(v, 0),
        default=_UNSET,
        metavar="HH:MM[/NODE]",
        help="a node leaves the fleet (10:30/0 if within the day; none)",
    )
    p.add_argument(
        "--nodes-added",
        type=lambda v: _timed(v, 2),
        default=_UNSET,
        metavar="HH:MM[/COUNT]",
        help="nodes join the fleet (14:00/2 if within the day; none)",
    )
    p.add_argument(
        "--rolling-restart",
        type=lambda v: None if v == "none" else hour(v),
        default=_UNSET,
        metavar="HH:MM",
        help="every node restarts, one after another (16:00 if within the day; none)",
    )


def run_trace(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from warmfleet_cli.sim.trace import TraceParams, dump, generate, write

    def default(given: Any, value: Any, at: float) -> Any:
        """An event not asked for: its default, where that falls within the day."""
        if given is not _UNSET:
            return given
        return value if args.start <= at < args.end else None

    upgrades = args.upgrade if args.upgrade is not None else [default(_UNSET, UPGRADE, 12.0)]
    params = TraceParams(
        developers=args.developers,
        seed=args.seed,
        day_start=args.start,
        day_end=args.end,
        compress=args.compress,
        context_tokens=args.context_tokens,
        claude_memory=args.claude_memory,
        date=args.date,
        upgrades=tuple(u for u in upgrades if u is not None),
        node_lost=default(args.node_lost, (10.5, 0), 10.5),
        nodes_added=default(args.nodes_added, (14.0, 2), 14.0),
        rolling_restart=default(args.rolling_restart, 16.0, 16.0),
    )
    for name in ("claude_share", "sessions_per_day", "compact_at"):
        if getattr(args, name) is not None:
            params = replace(params, **{name: getattr(args, name)})
    try:
        trace = generate(params)
    except ValueError as exc:
        print(f"warmfleet sim trace: {exc}", file=sys.stderr)
        return 2
    if args.out == "-":
        dump(trace, sys.stdout)
    else:
        try:
            write(trace, args.out)
        except OSError as exc:
            print(f"warmfleet sim trace: cannot write {args.out}: {exc}", file=sys.stderr)
            return 2
    s = trace.header["summary"]
    where = "" if args.out == "-" else f" -> {args.out}"
    events = len(trace.records) - s["requests"]
    print(
        f"{s['requests']:,} requests in {s['sessions']:,} sessions of {s['developers']} "
        f"developers ({s['compactions']} compactions) over {s['duration_s']:,.0f} s, "
        f"{events} event{'' if events == 1 else 's'}{where}",
        file=sys.stderr,
    )
    return 0


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help="a trace file (`warmfleet sim trace`)")
    p.add_argument("--url", required=True, help="the fleet's router (or any agent API server)")
    p.add_argument(
        "--time-scale",
        type=float,
        metavar="X",
        help="the fleet's --sim-speed: wall seconds x X are the Mac's seconds (default: the "
        "trace's compression, which the fleet should run at)",
    )
    p.add_argument("--sessions", type=int, metavar="N", help="only the first N sessions")
    p.add_argument("--model", default="default", help="the model every request names")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--out", metavar="FILE", help="one JSON line per request to FILE")
    p.add_argument("--api-key", default="unused", help="sent as each API's key header")


def run_replay(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from warmfleet_cli.sim.replay import (
        ReplayError,
        ReplayOptions,
        check_fleet,
        outcome_row,
        replay,
        summary,
    )
    from warmfleet_cli.sim.trace import read

    try:
        header, records = read(args.trace)
    except (OSError, ValueError) as exc:
        print(f"warmfleet sim replay: {exc}", file=sys.stderr)
        return 2
    scale = args.time_scale or float(header.get("params", {}).get("compress", 1.0))
    if scale <= 0 or (args.sessions is not None and args.sessions < 1):
        print("warmfleet sim replay: --time-scale > 0, --sessions >= 1", file=sys.stderr)
        return 2
    options = ReplayOptions(
        args.url.rstrip("/"), scale, args.model, args.timeout, args.sessions, args.api_key
    )
    try:
        asyncio.run(check_fleet(header, options))
    except ReplayError as exc:
        print(f"warmfleet sim replay: {exc}", file=sys.stderr)
        return 2
    rows = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115

    def keep(outcome: Any) -> None:
        if rows is not None:
            rows.write(json.dumps(outcome_row(outcome)) + "\n")
            rows.flush()

    try:
        outcomes, skipped = asyncio.run(replay(header, records, options, keep))
    finally:
        if rows is not None:
            rows.close()
    result = summary(outcomes, skipped)
    print(json.dumps(result, indent=2))
    for event in result["node_events_not_applied"]:
        print(
            f"warmfleet sim replay: {event['event']} at trace second {event['t']:.0f} not "
            "applied (`warmfleet sim run` starts a fleet and applies them)",
            file=sys.stderr,
        )
    return 1 if result["failed"] else 0


RUN_DESCRIPTION = """\
Run a trace against a simulated fleet, start to report: start --nodes simulated Macs of
--profile (many to a process), the operator in local mode and the router (--policy); warm
the agents' heads a team would have captured before the day (--no-warm-sets: none); replay
the trace closed-loop at its compression; apply its node events to the fleet's processes
(a node killed, nodes added, a rolling restart in batches); sample the router, the nodes
and the operator; write DIR/run.json, rows.jsonl, events.jsonl, samples.jsonl,
summary.json and DIR/report/. A run the machine could not keep up with is marked invalid
(run.json `valid`, the report's first line) and exits 3."""


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    from warmfleet_cli.local_fleet import MAX_NODES

    p.add_argument("trace", metavar="TRACE", help="a trace file (`warmfleet sim trace`)")
    p.add_argument("--out", required=True, metavar="DIR", help="the run directory")
    p.add_argument("--profile", required=True, metavar="NAME|FILE", help="the Macs' profile")
    p.add_argument(
        "--nodes", type=int, default=10, help=f"simulated Macs (10; at most {MAX_NODES['sim']})"
    )
    p.add_argument(
        "--policy",
        choices=["prefix", "least-load", "round-robin", "session"],
        default="prefix",
        help="the router's (prefix)",
    )
    p.add_argument(
        "--no-warm-sets",
        dest="warm",
        action="store_false",
        help="no WarmPromptSet (default: the agents' heads at the day's start, captured)",
    )
    p.add_argument(
        "--learn-min-sessions",
        type=int,
        default=3,
        metavar="K",
        help="the router learns a head from K sessions and the operator warms it everywhere "
        "(3, as warmfleet up; 0: off)",
    )
    p.add_argument("--sim-speed", type=float, metavar="X", help="default: the trace's compression")
    p.add_argument("--sim-per-process", type=int, default=50, metavar="N", help="(50)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="the router's; the nodes the next")
    p.add_argument("--sessions", type=int, metavar="N", help="only the first N sessions")
    p.add_argument(
        "--restart-batch", type=int, metavar="N", help="nodes restarted at once (a tenth)"
    )
    p.add_argument("--cache-memory-mb", type=int, help="each node's (default: the profile's)")
    p.add_argument("--max-num-seqs", type=int, metavar="N", help="each node's (serve's default)")
    p.add_argument(
        "--disk-tier",
        action="store_true",
        help="each node keeps a disk tier and its warm snapshots (under DIR/state), so a "
        "restarted node reads its blocks back",
    )
    p.add_argument("--sample-every", type=float, default=5.0, metavar="S", help="wall s (5)")
    p.add_argument("--label", help='the run\'s name in reports (default "POLICY, warm sets")')
    p.add_argument("--no-report", dest="report", action="store_false", help="no DIR/report/")


def run_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from warmfleet_cli.sim.run import RunError, RunOptions, main_say
    from warmfleet_cli.sim.run import run as run_trace_on_fleet

    if args.nodes < 1 or (args.sessions is not None and args.sessions < 1):
        print("warmfleet sim run: --nodes >= 1, --sessions >= 1", file=sys.stderr)
        return 2
    if args.learn_min_sessions < 0:
        print("warmfleet sim run: --learn-min-sessions must be >= 0", file=sys.stderr)
        return 2
    if (args.sim_speed is not None and args.sim_speed <= 0) or args.sample_every <= 0:
        print("warmfleet sim run: --sim-speed and --sample-every must be > 0", file=sys.stderr)
        return 2
    options = RunOptions(
        trace=Path(args.trace),
        out=Path(args.out),
        profile=args.profile,
        nodes=args.nodes,
        policy=args.policy,
        warm=args.warm,
        speed=args.sim_speed,
        sim_per_process=args.sim_per_process,
        host=args.host,
        port=args.port,
        sessions=args.sessions,
        sample_every_s=args.sample_every,
        restart_batch=args.restart_batch,
        label=args.label,
        cache_memory_mb=args.cache_memory_mb,
        report=args.report,
        max_num_seqs=args.max_num_seqs,
        disk_tier=args.disk_tier,
        learn_min_sessions=args.learn_min_sessions,
    )
    try:
        meta = run_trace_on_fleet(options, main_say)
    except RunError as exc:
        print(f"warmfleet sim run: {exc}", file=sys.stderr)
        return 2
    summary = (Path(args.out) / "summary.json").read_text()
    print(summary, end="")
    if not meta.get("valid", False):
        main_say(f"INVALID: {meta.get('invalid_reason')}")
        return 3
    return 0


PLAN_DESCRIPTION = """\
How many Macs for how many developers: the smallest simulated fleet of --profile's Macs
that keeps the first request's time to first token (p95, the Mac's seconds) under
--target for --developers developers' Claude Code and Codex sessions over --start to
--end (the busy hours; no fleet events). Each fleet size is a `warmfleet sim run` of the
same trace (DIR/nodes-N/); sizes are doubled from --min-nodes until one meets the
target, then bisected. Prints the table it decided from and writes DIR/plan.json.
Exit 0: decided; 1: no size up to --max-nodes met the target; 3: a run this machine
could not keep up with (lower --compress)."""


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    from warmfleet_cli.local_fleet import MAX_NODES

    p.description = PLAN_DESCRIPTION
    p.add_argument("--profile", required=True, metavar="NAME|FILE", help="the Macs' profile")
    p.add_argument("--developers", type=int, required=True, metavar="N")
    p.add_argument(
        "--target", type=float, required=True, metavar="S",
        help="first-request TTFT p95, the Mac's seconds",
    )  # fmt: skip
    p.add_argument("--out", required=True, metavar="DIR", help="the trace, each run, plan.json")
    p.add_argument("--start", type=hour, default=9.0, metavar="HH:MM", help="(9:00)")
    p.add_argument("--end", type=hour, default=11.0, metavar="HH:MM", help="(11:00)")
    p.add_argument(
        "--compress", type=float, default=24.0, metavar="X",
        help="the simulation's speed-up over the Macs (24); lower it if runs are invalid",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="(0)")
    p.add_argument("--claude-share", type=float, metavar="F", help="(0.63)")
    p.add_argument("--sessions-per-day", type=float, metavar="F", help="per developer (4.2)")
    p.add_argument("--context-tokens", type=int, default=65_536, metavar="N", help="(65536)")
    p.add_argument("--min-nodes", type=int, default=1, metavar="N", help="(1)")
    p.add_argument(
        "--max-nodes", type=int, default=MAX_NODES["sim"], metavar="N",
        help=f"({MAX_NODES['sim']})",
    )  # fmt: skip
    p.add_argument(
        "--policy", choices=["prefix", "least-load", "round-robin", "session"], default="prefix"
    )
    p.add_argument("--no-warm-sets", dest="warm", action="store_false")
    p.add_argument("--cache-memory-mb", type=int, help="each Mac's (default: the profile's)")
    p.add_argument("--port", type=int, default=8000, help="the router's; the Macs the next")
    p.add_argument("--sim-per-process", type=int, default=50, metavar="N", help="(50)")


def run_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from warmfleet_cli.local_fleet import MAX_NODES
    from warmfleet_cli.sim.plan import PlanOptions, plan, table
    from warmfleet_cli.sim.run import RunError
    from warmfleet_cli.sim.trace import TraceParams

    if args.developers < 1 or args.target <= 0 or not 1 <= args.min_nodes <= args.max_nodes:
        print("warmfleet plan: --developers >= 1, --target > 0, "
              "1 <= --min-nodes <= --max-nodes", file=sys.stderr)  # fmt: skip
        return 2
    if args.max_nodes > MAX_NODES["sim"]:
        print(f"warmfleet plan: --max-nodes at most {MAX_NODES['sim']}", file=sys.stderr)
        return 2
    trace = TraceParams(
        developers=args.developers, seed=args.seed, day_start=args.start, day_end=args.end,
        compress=args.compress, context_tokens=args.context_tokens,
        upgrades=(), node_lost=None, nodes_added=None, rolling_restart=None,  # busy hours only
    )  # fmt: skip
    for name in ("claude_share", "sessions_per_day"):
        if getattr(args, name) is not None:
            trace = replace(trace, **{name: getattr(args, name)})
    try:
        trace.check()
    except ValueError as exc:
        print(f"warmfleet plan: {exc}", file=sys.stderr)
        return 2
    options = PlanOptions(
        profile=args.profile, developers=args.developers, target_p95_s=args.target,
        out=Path(args.out), trace=trace, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
        policy=args.policy, warm=args.warm, port=args.port,
        sim_per_process=args.sim_per_process, cache_memory_mb=args.cache_memory_mb,
    )  # fmt: skip

    def say(line: str) -> None:
        print(f"warmfleet plan: {line}", file=sys.stderr, flush=True)

    try:
        decided = plan(options, say)
    except RunError as exc:
        print(f"warmfleet plan: {exc}", file=sys.stderr)
        return 2
    print(table(decided, args.target))
    print()
    print(f"{args.developers} developers, {args.profile}, first-request TTFT p95 <= "
          f"{args.target:g} s: {decided.reason}")  # fmt: skip
    if decided.nodes is not None:
        return 0
    return 3 if any(not t.valid for t in decided.trials) else 1


VERBS: dict[str, Verb] = {
    "trace": Verb(
        "write an agent-population trace (Claude Code and Codex sessions over a day)",
        TRACE_DESCRIPTION,
        add_trace_arguments,
        run_trace,
    ),
    "replay": Verb(
        "replay a trace's sessions against a fleet, closed-loop; TTFT and hits per request",
        "Send a trace's sessions to a fleet (its router) as their CLIs would: each step "
        "after the previous response and its gap, streaming; print TTFT percentiles (first "
        "requests and later ones, in the profiled Mac's seconds) and hit rates.",
        add_replay_arguments,
        run_replay,
    ),
    "report": Verb(report.HELP, report.DESCRIPTION, report.add_arguments, report.run),
    "run": Verb(
        "run a trace on a simulated fleet it starts, node events applied; its report",
        RUN_DESCRIPTION,
        add_run_arguments,
        run_run,
    ),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "A simulated fleet's workloads."
    verbs = p.add_subparsers(dest="sim_command", required=True, metavar="VERB")
    for name, verb in VERBS.items():
        verb.add_arguments(verbs.add_parser(name, help=verb.help, description=verb.description))


def run(args: argparse.Namespace) -> int:
    return VERBS[args.sim_command].run(args)
