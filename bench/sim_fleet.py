"""Issue 46's fleet-scale figures (and issue 36's after an upgrade): one agent-population
trace replayed on a simulated fleet of profiled Macs (`warmfleet sim run`) with each
router policy, without warm sets, without learning (`prefix-no-learning`), and on the
ideal (every Mac's memory and compute pooled into one: no request ever on the wrong
Mac), each configuration `--repeats` times, interleaved; then the medians with their
ranges, the issue's targets, and the first repeat's report (PNGs side by side).

    .venv/bin/python bench/sim_fleet.py --out DIR [--nodes 100] [--developers 200]
        [--profile m4-max-qwen3-30b-a3b-4bit] [--start 9:00] [--end 10:00]
        [--compress 6] [--sessions-per-day 4.2] [--repeats 3] [--configs ...]

The trace's fleet events fall inside its window: a node lost at a quarter of it, the
Claude Code upgrade at 40%, two nodes added at 55%, a rolling restart (a tenth of the
nodes at a time) at 70%. The ideal replays the same sessions without the node events.
A run the machine could not keep up with is marked invalid by `sim run` and shown so;
its figures are left out of the medians. TTFTs are the profiled Macs' seconds; the
router's decision latency and CPU are this machine's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmfleet_cli.sim.report_run import load_run
from warmfleet_cli.sim.report_series import Headline, headline
from warmfleet_common.perf_profile import dump_profile, load_profile, pooled

CONFIGS = {  # name -> (policy, warm sets, pooled, learning)
    "prefix": ("prefix", True, False, True),
    "least-load": ("least-load", True, False, True),
    "round-robin": ("round-robin", True, False, True),
    "session": ("session", True, False, True),
    "prefix-no-warm": ("prefix", False, False, True),
    "round-robin-no-warm": ("round-robin", False, False, True),
    "prefix-no-learning": ("prefix", True, False, False),
    "pooled": ("prefix", True, True, True),
}


@dataclass
class Outcome:
    config: str
    repeat: int
    exit_code: int
    valid: bool
    invalid_reason: str | None
    headline: Headline | None
    summary: dict[str, Any]
    wall_s: float


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--developers", type=int, default=200)
    p.add_argument("--profile", default="m4-max-qwen3-30b-a3b-4bit")
    p.add_argument("--start", default="9:00")
    p.add_argument("--end", default="10:00")
    p.add_argument("--compress", type=float, default=6.0)
    p.add_argument("--sessions-per-day", type=float, default=None)
    p.add_argument("--context-tokens", type=int, default=40960, help="(the profile's, 40960)")
    p.add_argument("--disk-tier", action="store_true", help="each node with its disk tier")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--first-repeat", type=int, default=1, help="number the repeats from this (add to --out)"
    )
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--sim-per-process", type=int, default=50)
    p.add_argument(
        "--figures-only",
        action="store_true",
        help="run nothing: the figures of the runs already in --out (a campaign cut short)",
    )
    args = p.parse_args()
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    if args.figures_only:
        text = figures(args, configs, finished_runs(args.out, configs))
        (args.out / "figures.md").write_text(text)
        print(text)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    traces = write_traces(args)
    profile = load_profile(args.profile)
    pooled_path = args.out / "pooled-profile.json"
    pooled_path.write_text(dump_profile(pooled(profile, args.nodes)))

    planned = {
        (c, r) for c in configs for r in range(args.first_repeat, args.first_repeat + args.repeats)
    }
    earlier = [o for o in _recorded(args.out) if (o["config"], o["repeat"]) not in planned]
    outcomes: list[Outcome] = []
    for repeat in range(args.first_repeat, args.first_repeat + args.repeats):
        for config in configs:
            outcome = run_one(args, config, repeat, traces, pooled_path)
            outcomes.append(outcome)
            state = "valid" if outcome.valid else f"INVALID ({outcome.invalid_reason})"
            print(f"[repeat {repeat}] {config}: {outcome.wall_s:.0f} s, {state}",
                  file=sys.stderr, flush=True)  # fmt: skip
            (args.out / "outcomes.json").write_text(
                json.dumps(earlier + [_outcome_json(o) for o in outcomes], indent=1) + "\n"
            )
    text = figures(args, configs, finished_runs(args.out, configs))
    (args.out / "figures.md").write_text(text)
    print(text)
    first = [args.out / f"rep1/{c}" for c in configs if (args.out / f"rep1/{c}/run.json").exists()]
    if first:
        subprocess.run(
            [sys.executable, "-m", "warmfleet_cli", "sim", "report", *map(str, first),
             "--out", str(args.out / "report"), "--window", "10"],
            check=False,
        )  # fmt: skip
    return 0


def write_traces(args: argparse.Namespace) -> dict[str, Path]:
    start, end = _hours(args.start), _hours(args.end)

    def at(share: float) -> str:
        h = start + share * (end - start)
        return f"{int(h)}:{round((h % 1) * 60):02d}"

    common = [
        sys.executable, "-m", "warmfleet_cli", "sim", "trace",
        "--developers", str(args.developers), "--start", args.start, "--end", args.end,
        "--compress", str(args.compress), "--context-tokens", str(args.context_tokens),
        "--upgrade", f"claude-code@{at(0.4)}",
    ]  # fmt: skip
    if args.sessions_per_day is not None:
        common += ["--sessions-per-day", str(args.sessions_per_day)]
    fleet, ideal = args.out / "trace.jsonl", args.out / "trace-no-node-events.jsonl"
    events = ["--node-lost", f"{at(0.25)}/3", "--nodes-added", f"{at(0.55)}/2",
              "--rolling-restart", at(0.7)]  # fmt: skip
    none = ["--node-lost", "none", "--nodes-added", "none", "--rolling-restart", "none"]
    subprocess.run([*common, *events, "--out", str(fleet)], check=True)
    subprocess.run([*common, *none, "--out", str(ideal)], check=True)
    return {"fleet": fleet, "ideal": ideal}


def run_one(
    args: argparse.Namespace, config: str, repeat: int, traces: dict[str, Path], pooled: Path
) -> Outcome:
    policy, warm, is_pooled, learning = CONFIGS[config]
    out = args.out / f"rep{repeat}" / config
    cmd = [
        sys.executable, "-m", "warmfleet_cli", "sim", "run",
        str(traces["ideal" if is_pooled else "fleet"]), "--out", str(out),
        "--policy", policy, "--port", str(args.port), "--no-report",
        "--sim-per-process", str(args.sim_per_process), "--label", config,
    ]  # fmt: skip
    if is_pooled:
        cmd += ["--profile", str(pooled), "--nodes", "1",
                "--max-num-seqs", str(min(512, 16 * args.nodes))]  # fmt: skip
    else:
        cmd += ["--profile", args.profile, "--nodes", str(args.nodes)]
    if not warm:
        cmd.append("--no-warm-sets")
    if not learning:
        cmd += ["--learn-min-sessions", "0"]
    if args.disk_tier:
        cmd.append("--disk-tier")
    started = time.monotonic()
    with open(args.out / f"rep{repeat}-{config}.log", "w") as log:
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=log, check=False)
    return _outcome(config, repeat, out, done.returncode, time.monotonic() - started)


def _recorded(directory: Path) -> list[dict[str, Any]]:
    path = directory / "outcomes.json"
    return list(json.loads(path.read_text())) if path.exists() else []


def finished_runs(directory: Path, configs: list[str]) -> list[Outcome]:
    """The outcomes of the runs in `directory` (this invocation's and earlier ones')."""
    recorded = {
        (o["config"], o["repeat"]): (o["exit_code"], o["wall_s"]) for o in _recorded(directory)
    }
    outcomes = []
    for rep in sorted(directory.glob("rep[0-9]*/"), key=lambda d: int(d.name[3:] or 0)):
        for config in configs:
            if (rep / config / "run.json").exists():
                repeat = int(rep.name[3:])
                code, wall = recorded.get((config, repeat), (0, 0.0))
                outcomes.append(_outcome(config, repeat, rep / config, code, wall))
    return outcomes


def _outcome(config: str, repeat: int, out: Path, exit_code: int, wall: float) -> Outcome:
    try:
        loaded = load_run(out)
    except Exception as exc:  # the run never wrote its directory: said in its log
        return Outcome(config, repeat, exit_code, False, f"no run: {exc}", None, {}, wall)
    meta = loaded.meta
    return Outcome(
        config,
        repeat,
        exit_code,
        bool(meta.get("valid")),
        meta.get("invalid_reason"),
        headline(loaded),
        loaded.summary,
        wall,
    )


# -- the figures -------------------------------------------------------------------------


def figures(args: argparse.Namespace, configs: list[str], outcomes: list[Outcome]) -> str:
    by = {c: [o for o in outcomes if o.config == c and o.valid and o.headline] for c in configs}
    lines = [
        f"# {args.nodes} simulated Macs ({args.profile}), {args.developers} developers, "
        f"{args.start}-{args.end} at {args.compress:g}x",
        "",
        f"CPU: {cpu_model()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"repeats {len({o.repeat for o in outcomes})}; medians [min-max] over the valid runs (n).",
        "",
        "| config | n | failed | first-request TTFT p50 (s) | p95 (s) | later p95 (s) "
        "| token hit rate | first-request hit rate | decision p99 (ms) | index peak (MiB) "
        "| router CPU (% core) | sets Ready (wall s) | first after the upgrade p95 (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        runs = [o.headline for o in by[c] if o.headline is not None]
        lines.append(
            f"| {c} | {len(runs)}/{sum(o.config == c for o in outcomes)} "
            f"| {spread([h.failed for h in runs], 0)} "
            f"| {spread([h.first_ttft.get('p50') for h in runs], 2)} "
            f"| {spread([h.first_ttft.get('p95') for h in runs], 2)} "
            f"| {spread([h.later_ttft.get('p95') for h in runs], 2)} "
            f"| {spread([h.hit_rate for h in runs], 3)} "
            f"| {spread([h.first_hit_rate for h in runs], 3)} "
            f"| {spread([ms(h.decision_p99_s) for h in runs], 2)} "
            f"| {spread([mib(h.index_bytes_peak) for h in runs], 1)} "
            f"| {spread([h.router_cpu_percent for h in runs], 1)} "
            f"| {spread([h.operator_ready_s for h in runs], 1)} "
            f"| {spread([_after_upgrade_p95(h) for h in runs], 2)} |"
        )
    lines += ["", "Targets (issues 46 and 36), from the medians:", ""]
    lines += targets(by)
    invalid = [o for o in outcomes if not o.valid]
    if invalid:
        lines += ["", "Runs left out (this machine could not keep up, or they failed):", ""]
        lines += [f"- {o.config} #{o.repeat}: {o.invalid_reason}" for o in invalid]
    return "\n".join(lines) + "\n"


def targets(by: dict[str, list[Outcome]]) -> list[str]:
    def med(config: str, pick: Any) -> float | None:
        values = [pick(o) for o in by.get(config, []) if o.headline is not None]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    out = []
    hit, ideal = (
        med("prefix", lambda o: o.headline.hit_rate),
        med("pooled", lambda o: o.headline.hit_rate),
    )
    out.append(_target("token hit rate, prefix / pooled ideal", _ratio(hit, ideal), ">= 0.95"))
    first, rr = (
        med("prefix", lambda o: o.headline.first_ttft.get("p95")),
        med("round-robin", lambda o: o.headline.first_ttft.get("p95")),
    )
    out.append(_target("first-request TTFT p95, prefix / round-robin", _ratio(first, rr), "<= 0.5"))
    cold, cold_rr = (
        med("prefix-no-warm", lambda o: o.headline.first_ttft.get("p95")),
        med("round-robin-no-warm", lambda o: o.headline.first_ttft.get("p95")),
    )
    out.append(
        _target(
            "first-request TTFT p95 without warm sets, prefix / round-robin",
            _ratio(cold, cold_rr),
            "<= 0.5",
        )
    )
    learned, unlearned = (
        med("prefix", lambda o: _after_upgrade_p95(o.headline)),
        med("prefix-no-learning", lambda o: _after_upgrade_p95(o.headline)),
    )
    out.append(
        _target(
            "first-request TTFT p95 in the hour after the upgrade, learning on / off (issue 36)",
            _ratio(learned, unlearned),
            "<= 0.2",
        )
    )
    rows = [
        ("route decision p99 (ms), prefix", lambda o: ms(o.headline.decision_p99_s), "<= 5"),
        ("router index peak (MiB), prefix", lambda o: mib(o.headline.index_bytes_peak), "<= 256"),
        ("failed requests, prefix (node loss, rolling restart)", lambda o: o.headline.failed,
         "== 0"),
        ("added nodes' first routed request: cached share, prefix", _added_share, "> 0 (warm)"),
        ("every WarmPromptSet Ready after the last warm-up (wall s), prefix",
         lambda o: o.headline.operator_ready_s, "<= 10"),
    ]  # fmt: skip
    out += [_target(what, med("prefix", pick), goal) for what, pick, goal in rows]
    return out


def _after_upgrade_p95(h: Headline) -> float | None:
    """The upgraded agent's new sessions' first requests in the hour after it (the
    trace has one upgrade)."""
    return h.after_upgrade[0].ttft.get("p95") if h.after_upgrade else None


def _added_share(o: Outcome) -> float | None:
    firsts = o.summary.get("added_nodes_first_requests") or []
    shares = [f["cached_tokens"] / f["prompt_tokens"] for f in firsts if f.get("prompt_tokens")]
    return min(shares) if shares else None


def _target(what: str, value: float | None, goal: str) -> str:
    shown = "-" if value is None else f"{value:.3g}"
    return f"- {what}: **{shown}** (target {goal})"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def spread(values: list[Any], digits: int) -> str:
    clean = [float(v) for v in values if v is not None]
    if not clean:
        return "-"
    median = statistics.median(clean)
    if len(clean) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} [{min(clean):.{digits}f}-{max(clean):.{digits}f}]"


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / (1 << 20)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _hours(text: str) -> float:
    h, _, m = text.partition(":")
    return int(h) + (int(m) / 60 if m else 0.0)


def _outcome_json(o: Outcome) -> dict[str, Any]:
    h = o.headline
    return {
        "config": o.config,
        "repeat": o.repeat,
        "exit_code": o.exit_code,
        "valid": o.valid,
        "invalid_reason": o.invalid_reason,
        "wall_s": round(o.wall_s, 1),
        "headline": None if h is None else dataclasses.asdict(h),
        "added_nodes_first_requests": o.summary.get("added_nodes_first_requests"),
    }


if __name__ == "__main__":
    sys.exit(main())
