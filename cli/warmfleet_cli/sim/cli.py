"""`warmfleet sim`'s verbs: each one a (help, description, add_arguments, run) entry of
VERBS, so a new verb is one function pair and one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
        "(claude-code@12:00; repeat for more; none: no upgrade)",
    )
    p.add_argument(
        "--node-lost",
        type=lambda v: _timed(v, 0),
        default=(10.5, 0),
        metavar="HH:MM[/NODE]",
        help="a node leaves the fleet (10:30/0; none)",
    )
    p.add_argument(
        "--nodes-added",
        type=lambda v: _timed(v, 2),
        default=(14.0, 2),
        metavar="HH:MM[/COUNT]",
        help="nodes join the fleet (14:00/2; none)",
    )
    p.add_argument(
        "--rolling-restart",
        type=lambda v: None if v == "none" else hour(v),
        default=16.0,
        metavar="HH:MM",
        help="every node restarts, one after another (16:00; none)",
    )


def run_trace(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from warmfleet_cli.sim.trace import TraceParams, dump, generate, write

    upgrades = args.upgrade if args.upgrade is not None else [("claude-code", 12.0)]
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
        node_lost=args.node_lost,
        nodes_added=args.nodes_added,
        rolling_restart=args.rolling_restart,
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
    print(
        f"{s['requests']:,} requests in {s['sessions']:,} sessions of {s['developers']} "
        f"developers ({s['compactions']} compactions) over {s['duration_s']:,.0f} s, "
        f"{len(trace.records) - s['requests']} events{where}",
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
            "applied (node events need control of the fleet's processes: not built yet)",
            file=sys.stderr,
        )
    return 1 if result["failed"] else 0


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
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "A simulated fleet's workloads."
    verbs = p.add_subparsers(dest="sim_command", required=True, metavar="VERB")
    for name, verb in VERBS.items():
        verb.add_arguments(verbs.add_parser(name, help=verb.help, description=verb.description))


def run(args: argparse.Namespace) -> int:
    return VERBS[args.sim_command].run(args)
