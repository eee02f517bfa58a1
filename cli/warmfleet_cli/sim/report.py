"""`warmfleet sim report RUN_DIR [RUN_DIR ...] --out DIR`: the figures and headline
table of simulated-fleet runs (`warmfleet sim run`'s directories). One run: its
report.md and PNGs in DIR. Several: each run's in DIR/<its label>, and compare.md and
compare.png side by side (router policies, with and without warm sets).

The numbers come from report_series (plain data), the drawing from report_plots."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from warmfleet_cli.sim import report_series as series
from warmfleet_cli.sim.report_run import Run, RunDirError, load_run

HELP = "a run's figures: TTFT over time, hits by tier, nodes, router; several side by side"
DESCRIPTION = """\
Write the report of one or more simulated-fleet runs (the directories `warmfleet sim run`
writes): per run, report.md (the headline figures) and ttft.png (first-request and all
TTFT p50/p95/p99 over time, events marked), hits.png (token hit rate by tier), nodes.png
(requests and cache memory per node, nodes and WarmPromptSets Ready), router.png (route
decision latency, CPU, RSS and index memory). With several runs, each run's files go to
DIR/<its label> and compare.md and compare.png put them side by side. TTFTs are the
profiled Macs' seconds; the router's latency and CPU are this machine's wall time."""

FIGURES = {
    "ttft.png": "TTFT p50/p95/p99 per window, first requests and all, events marked, "
    "failed requests as red crosses",
    "hits.png": "token hit rate per window stacked by tier, the first requests' as a line",
    "nodes.png": "requests per node, cache memory per node (end, peak, budget; over time), "
    "nodes and WarmPromptSets Ready",
    "router.png": "route decision latency p50/p99, decisions/s, router CPU, RSS and index memory",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a `warmfleet sim run` directory")
    p.add_argument("--out", required=True, metavar="DIR", help="where the report goes (created)")
    p.add_argument(
        "--window",
        type=float,
        default=30.0,
        metavar="MINUTES",
        help="the profiled Macs' minutes per point of the time series (30)",
    )


def run(args: argparse.Namespace) -> int:
    if args.window <= 0:
        print("warmfleet sim report: --window must be > 0", file=sys.stderr)
        return 2
    try:
        runs = [load_run(path) for path in args.run_dirs]
    except RunDirError as exc:
        print(f"warmfleet sim report: {exc}", file=sys.stderr)
        return 2
    for loaded in runs:
        if loaded.bad_lines:
            print(
                f"warmfleet sim report: {loaded.path}: {loaded.bad_lines} unreadable lines "
                "skipped (a run stopped mid-write leaves one)",
                file=sys.stderr,
            )
    try:
        written = write_reports(runs, Path(args.out), args.window * 60)
    except OSError as exc:
        print(f"warmfleet sim report: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def write_reports(runs: Sequence[Run], out: Path, window_s: float) -> list[Path]:
    """Every run's report (in `out` for one run, in a folder each for several) and, for
    several, the comparison. The files written, in order."""
    from warmfleet_cli.sim import report_plots as plots  # matplotlib only when drawing

    out.mkdir(parents=True, exist_ok=True)
    folders = [out] if len(runs) == 1 else [out / name for name in folder_names(runs)]
    written: list[Path] = []
    headlines = []
    for one, folder in zip(runs, folders):
        folder.mkdir(parents=True, exist_ok=True)
        written += [
            plots.plot_ttft(one, window_s, folder / "ttft.png"),
            plots.plot_hits(one, window_s, folder / "hits.png"),
            plots.plot_nodes(one, folder / "nodes.png"),
            plots.plot_router(one, folder / "router.png"),
        ]
        figures = series.headline(one)
        headlines.append(figures)
        report = folder / "report.md"
        report.write_text(run_markdown(one, figures, window_s), encoding="utf-8")
        written.append(report)
    if len(runs) > 1:
        written.append(plots.plot_compare(headlines, out / "compare.png"))
        links = [f"{folder.name}/report.md" for folder in folders]
        compare = out / "compare.md"
        compare.write_text(compare_markdown(headlines, links), encoding="utf-8")
        written.append(compare)
    return written


def folder_names(runs: Sequence[Run]) -> list[str]:
    """A folder name per run from its label ("prefix, warm sets": prefix-warm-sets), made
    unique with -2, -3 when labels repeat (three runs of one configuration)."""
    names: list[str] = []
    for one in runs:
        base = re.sub(r"[^a-z0-9]+", "-", one.label.lower()).strip("-") or "run"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


# -- Markdown -----------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.2f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def mebibytes(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024**2:,.1f} MiB"


def triple(figures: dict[str, float | None]) -> str:
    return " / ".join(seconds(figures.get(q)) for q in ("p50", "p95", "p99"))


def clock(one: Run, t: float) -> str:
    """A Mac time as the hour of the trace's day (HH:MM), or +H:MM from the run's start."""
    if one.day_start is None:
        minutes = round(t / 60)
        return f"+{minutes // 60}:{minutes % 60:02d}"
    minutes = round(one.day_start * 60 + t * one.day_per_mac / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def invalid_line(figures: series.Headline) -> str | None:
    if figures.valid:
        return None
    reason = figures.invalid_reason or "no reason given"
    return (
        f"> **INVALID RUN: {reason}.** These figures do not measure the fleet; do not quote them."
    )


def run_markdown(one: Run, figures: series.Headline, window_s: float) -> str:
    lines = [f"# {figures.label}", ""]
    if (loud := invalid_line(figures)) is not None:
        lines += [loud, ""]
    lines += [_what_ran(one), ""]
    tiers = ", ".join(f"{tier} {percent(share)}" for tier, share in figures.hit_by_tier.items())
    lines += [
        "| figure | value |",
        "|---|---:|",
        f"| requests | {figures.requests:,} |",
        f"| failed | {figures.failed:,} |",
        f"| first-request TTFT p50 / p95 / p99 (Mac s) | {triple(figures.first_ttft)} |",
        f"| later TTFT p50 / p95 / p99 (Mac s) | {triple(figures.later_ttft)} |",
        f"| token hit rate | {percent(figures.hit_rate)} |",
        f"| token hit rate by tier | {tiers or '-'} |",
        f"| first-request token hit rate | {percent(figures.first_hit_rate)} |",
        f"| route decision p99 (wall ms) | {milliseconds(figures.decision_p99_s)} |",
        f"| router CPU, mean (% of one core) | {_number(figures.router_cpu_percent, 1)} |",
        f"| router index peak (estimated) | {mebibytes(figures.index_bytes_peak)} |",
        f"| router RSS peak | {mebibytes(figures.rss_bytes_peak)} |",
        "| every WarmPromptSet Ready after the last node's warm-up (wall s) | "
        f"{seconds(figures.operator_ready_s)} |",
        "",
    ]
    for u in figures.after_upgrade:
        lines += [
            f"After the {u.agent} upgrade to {u.version} at {clock(one, u.at_s)}: its "
            f"{u.first_requests} new sessions in the next hour, first requests' TTFT p50 / "
            f"p95 / p99 {triple(u.ttft)} s, token hit rate {percent(u.hit_rate)} (the new "
            f"head is warm only where a warm set, captured or learned, has it).",
            "",
        ]
    if one.events:
        lines += ["Events:", ""]
        for mark in series.event_marks(one.events):
            start, end = clock(one, mark.start_s), clock(one, mark.end_s)
            lines.append(f"- {start if start == end else f'{start}-{end}'} {mark.text}")
        lines.append("")
    if one.bad_lines:
        lines += [f"{one.bad_lines} unreadable lines were skipped.", ""]
    lines += [f"Figures ({window_s / 60:g}-minute windows of the profiled Macs' time):", ""]
    lines += [f"- `{name}`: {about}" for name, about in FIGURES.items()]
    lines += ["", *(f"![{name}]({name})" for name in FIGURES)]
    return "\n".join(lines) + "\n"


def _what_ran(one: Run) -> str:
    meta = one.meta
    params = meta.get("trace_params") or {}
    parts = [f"`{one.path}`"]
    if meta.get("trace"):
        developers = f", {params['developers']} developers" if params.get("developers") else ""
        parts.append(f"trace `{meta['trace']}`{developers}")
    for key, name in (("nodes", "nodes"), ("profile", "profile"), ("policy", "policy")):
        if meta.get(key) is not None:
            parts.append(f"{name} {meta[key]}")
    if isinstance(meta.get("warm"), bool):
        parts.append("warm sets on" if meta["warm"] else "warm sets off")
    if isinstance(learn := meta.get("learn_min_sessions"), int):
        parts.append(f"learning {_learning(learn)}")
    if isinstance(meta.get("speed"), int | float):
        parts.append(f"--sim-speed {meta['speed']:g}")
    for key, name in (("cpu", "CPU"), ("started_at", "started")):
        if meta.get(key) is not None:
            parts.append(f"{name} {meta[key]}")
    return ", ".join(parts)


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


# -- the comparison -----------------------------------------------------------------------

COMPARE_HEADERS = [
    "run",
    "policy",
    "warm sets",
    "requests",
    "failed",
    "first TTFT p50 (s)",
    "first TTFT p95 (s)",
    "first TTFT p99 (s)",
    "first p95 / round-robin's",
    "later TTFT p95 (s)",
    "hit rate",
    "first-request hit rate",
    "decision p99 (ms)",
    "index peak",
    "sets Ready (wall s)",
    "learning",
    "after an upgrade: first TTFT p95 (s)",
]


def round_robin_ratio(figures: series.Headline, runs: Sequence[series.Headline]) -> float | None:
    """First-request p95 over the round-robin run's with the same warm sets (the issue's
    target is 0.5x or less); none without such a run."""
    mine = figures.first_ttft.get("p95")
    bases = [
        h.first_ttft.get("p95")
        for h in runs
        if h.policy == "round-robin" and h.warm == figures.warm and h.valid
    ]
    base = next((b for b in bases if b), None)
    return None if mine is None or base is None else mine / base


def compare_table(headlines: Sequence[series.Headline]) -> list[list[str]]:
    """One row of cells per run, under COMPARE_HEADERS."""
    table = []
    for h in headlines:
        ratio = round_robin_ratio(h, headlines)
        table.append(
            [
                h.label + ("" if h.valid else " (INVALID)"),
                h.policy or "-",
                "-" if h.warm is None else ("on" if h.warm else "off"),
                f"{h.requests:,}",
                f"{h.failed:,}",
                seconds(h.first_ttft.get("p50")),
                seconds(h.first_ttft.get("p95")),
                seconds(h.first_ttft.get("p99")),
                "-" if ratio is None else f"{ratio:.2f}x",
                seconds(h.later_ttft.get("p95")),
                percent(h.hit_rate),
                percent(h.first_hit_rate),
                milliseconds(h.decision_p99_s),
                mebibytes(h.index_bytes_peak),
                seconds(h.operator_ready_s),
                _learning(h.learn_min_sessions),
                seconds(h.after_upgrade[0].ttft.get("p95")) if h.after_upgrade else "-",
            ]
        )
    return table


def _learning(min_sessions: int | None) -> str:
    if min_sessions is None:
        return "-"
    return f"from {min_sessions} sessions" if min_sessions else "off"


def compare_markdown(headlines: Sequence[series.Headline], links: Sequence[str]) -> str:
    lines = [f"# {len(headlines)} runs compared", ""]
    for h in headlines:
        if (loud := invalid_line(h)) is not None:
            lines += [f"{loud} ({h.label})", ""]
    lines += [
        "TTFTs are the profiled Macs' seconds; route decisions this machine's wall time.",
        "",
        "| " + " | ".join(COMPARE_HEADERS) + " |",
        "|" + "|".join("---" if n < 3 else "---:" for n in range(len(COMPARE_HEADERS))) + "|",
    ]
    for cells, link in zip(compare_table(headlines), links):
        cells = [f"[{cells[0]}]({link})", *cells[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "`compare.png`: first-request TTFT p50/p95/p99 and the token hit rate by tier, per run.",
    ]
    return "\n".join(lines) + "\n"
