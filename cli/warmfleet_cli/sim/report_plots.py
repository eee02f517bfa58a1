"""`warmfleet sim report`'s figures: a thin drawing layer over report_series. Each
function writes one PNG; a panel without data says so in its title rather than failing.
Times on the x axes are hours of the trace's day (the profiled Mac's time)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from warmfleet_cli.sim import report_series as series
from warmfleet_cli.sim.report_run import Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GIB = 1024**3
MIB = 1024**2
QUANTILE_COLORS = {"p50": "tab:blue", "p95": "tab:orange", "p99": "tab:red"}
TIER_COLORS = {"ram": "tab:green", "disk": "tab:olive", "peer": "tab:purple"}


def _figure(rows: int, cols: int, height: float) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure  # the Agg canvas: no display needed

    figure = Figure(figsize=(12, height), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, [ax for row in axes for ax in row]


def _title(figure: Figure, run: Run, what: str) -> None:
    meta = run.meta
    about = [str(meta[k]) for k in ("policy", "profile") if meta.get(k)]
    if isinstance(meta.get("nodes"), int):
        about.append(f"{meta['nodes']} nodes")
    if isinstance(meta.get("warm"), bool):
        about.append("warm sets" if meta["warm"] else "no warm sets")
    text = f"{run.label}: {what}" + (f" ({', '.join(about)})" if about else "")
    if meta.get("valid") is False:
        reason = meta.get("invalid_reason") or "no reason given"
        figure.suptitle(f"INVALID RUN: {reason}\n{text}", color="tab:red")
    else:
        figure.suptitle(text)


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, dpi=110)
    return path


# -- the time axis and the events ---------------------------------------------------------


def _hours(run: Run, t: float) -> float:
    """A Mac time as the hour of the trace's day (else Mac hours since the start)."""
    if run.day_start is None:
        return t / 3600
    return run.day_start + t * run.day_per_mac / 3600


def _time_axis(ax: Axes, run: Run) -> None:
    from matplotlib.ticker import FuncFormatter

    if run.day_start is None:
        ax.set_xlabel("Mac hours since the run's start")
        return
    ax.set_xlabel("hour of the trace's day")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda h, _: _clock(h)))


def _clock(hours: float) -> str:
    minutes = round(hours * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _mark_events(ax: Axes, run: Run, *, labelled: bool) -> None:
    """Each event a vertical line, a burst of one kind (a rolling restart's nodes) a
    shaded span; grey and dashed when the run could not apply it; labels on one panel."""
    for mark in series.event_marks(run.events):
        start, end = _hours(run, mark.start_s), _hours(run, mark.end_s)
        color = "black" if mark.applied else "tab:gray"
        if end > start:
            ax.axvspan(start, end, color=color, alpha=0.12, linewidth=0)
        else:
            ax.axvline(start, color=color, linestyle="-" if mark.applied else "--", linewidth=0.8)
        if labelled:
            ax.text(
                (start + end) / 2,
                0.98,
                mark.text + " ",
                transform=ax.get_xaxis_transform(),
                rotation=90,
                va="top",
                ha="right" if end == start else "center",
                fontsize=7,
            )


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


# -- ttft.png -----------------------------------------------------------------------------


def plot_ttft(run: Run, window_s: float, path: Path) -> Path:
    """TTFT p50/p95/p99 per window: first requests above, all requests below."""
    figure, axes = _figure(2, 1, 8)
    minutes = f"{window_s / 60:g}-minute windows"
    for n, (ax, first_only, name) in enumerate(
        ((axes[0], True, "First requests'"), (axes[1], False, "All requests'"))
    ):
        windows = series.ttft_windows(run.rows, window_s, first_only=first_only)
        rows = [r for r in run.rows if r.get("turn") == 0] if first_only else run.rows
        x = [_hours(run, w.start_s + window_s / 2) for w in windows]
        drawn = False
        for q in ("p50", "p95", "p99"):
            y = [_nan(getattr(w, q)) for w in windows]
            if any(not math.isnan(v) for v in y):
                ax.plot(x, y, marker=".", label=q, color=QUANTILE_COLORS[q])
                drawn = True
        failures = [_hours(run, series.sent(r)) for r in rows if series.failed(r)]
        if failures:
            ax.plot(
                failures,
                [0.03] * len(failures),
                "x",
                color="tab:red",
                transform=ax.get_xaxis_transform(),
                label=f"failed ({len(failures)})",
            )
        title = f"{name} TTFT (Mac seconds), {minutes}"
        if not drawn:
            title += ": no served requests"
        else:
            _log_seconds(ax)
        ax.set_title(title)
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3, which="both")
        _time_axis(ax, run)
        _mark_events(ax, run, labelled=n == 0)
        if drawn or failures:
            ax.legend(loc="upper left", fontsize=8)
    _title(figure, run, "time to first token")
    return _save(figure, path)


def _log_seconds(ax: Axes) -> None:
    """A log axis (TTFT percentiles span 0.1 s to a minute) labelled 0.5, 2, 10, not 10^x."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)


# -- hits.png -----------------------------------------------------------------------------


def plot_hits(run: Run, window_s: float, path: Path) -> Path:
    """The token hit rate per window stacked by the tier that served it; the first
    requests' hit rate as a line."""
    figure, (ax,) = _figure(1, 1, 5)
    windows = series.hit_windows(run.rows, window_s)
    x = [_hours(run, w.start_s + window_s / 2) for w in windows]
    width = (_hours(run, window_s) - _hours(run, 0.0)) * 0.9
    tiers = series.ordered_tiers(t for w in windows for t in w.by_tier)
    bottom = [0.0] * len(windows)
    for tier in tiers:
        heights = [w.by_tier.get(tier, 0.0) for w in windows]
        color = TIER_COLORS.get(tier, "tab:gray")
        ax.bar(x, heights, width, bottom=bottom, label=tier, color=color, alpha=0.8)
        bottom = [b + h for b, h in zip(bottom, heights)]
    first = [_nan(w.first_hit_rate) for w in windows]
    if any(not math.isnan(v) for v in first):
        ax.plot(x, first, color="black", marker="o", label="first requests")
    title = f"Token hit rate by tier, {window_s / 60:g}-minute windows"
    if not any(w.prompt_tokens for w in windows):
        title += ": no served prompt tokens"
    ax.set_title(title)
    ax.set_ylabel("share of prompt tokens cached")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    _time_axis(ax, run)
    _mark_events(ax, run, labelled=True)
    if tiers or not all(math.isnan(v) for v in first):
        ax.legend(loc="lower left", fontsize=8)
    _title(figure, run, "cache hits")
    return _save(figure, path)


# -- nodes.png ----------------------------------------------------------------------------


def _node_ticks(ax: Axes, names: Sequence[str]) -> None:
    # A hundred names do not fit: every nth, so about 25 are shown.
    step = max(1, math.ceil(len(names) / 25))
    ax.set_xticks(range(0, len(names), step))
    ax.set_xticklabels(names[::step], rotation=90, fontsize=7)


def plot_nodes(run: Run, path: Path) -> Path:
    """Requests per node, each node's cache at the end against its peak and budget, the
    cache per node over time, and nodes and warm sets Ready over time."""
    figure, (load_ax, cache_ax, time_ax, ready_ax) = _figure(2, 2, 9)
    loads = series.node_loads(run)
    names = [n.node for n in loads]
    positions = list(range(len(loads)))
    if loads:
        served = [n.requests - n.failed for n in loads]
        load_ax.bar(positions, served, color="tab:blue", label="served")
        if any(n.failed for n in loads):
            load_ax.bar(
                positions, [n.failed for n in loads], bottom=served, color="tab:red", label="failed"
            )
        load_ax.legend(fontsize=8)
        _node_ticks(load_ax, names)
    load_ax.set_title("Requests per node" + ("" if loads else ": no node named"))
    load_ax.set_ylabel("requests")

    cached = [n for n in loads if n.cache_bytes is not None]
    if cached:
        at = [names.index(n.node) for n in cached]
        cache_ax.bar(
            at, [(n.cache_bytes or 0) / GIB for n in cached], color="tab:green", label="at the end"
        )
        cache_ax.plot(
            at, [(n.cache_peak_bytes or 0) / GIB for n in cached], "_", color="black", label="peak"
        )
        budgets = [(i, n.budget_bytes / GIB) for i, n in zip(at, cached) if n.budget_bytes]
        if budgets:
            cache_ax.plot(*zip(*budgets), "_", color="tab:red", markersize=10, label="budget")
        cache_ax.legend(fontsize=8)
        _node_ticks(cache_ax, names)
    cache_ax.set_title("Cache memory per node at the end" + ("" if cached else ": no samples"))
    cache_ax.set_ylabel("GiB")

    points = series.fleet_points(run)
    _draw_cache_over_time(time_ax, run, points)
    _draw_ready(ready_ax, run, points)
    for n, ax in enumerate((time_ax, ready_ax)):
        ax.grid(alpha=0.3)
        _time_axis(ax, run)
        _mark_events(ax, run, labelled=n == 0)
    _title(figure, run, "nodes")
    return _save(figure, path)


def _draw_cache_over_time(ax: Axes, run: Run, points: list[series.FleetPoint]) -> None:
    """A few nodes: a line each. Many: their spread (median, 10-90 % band, extremes)."""
    names = sorted({n for p in points for n in p.cache_bytes}, key=series.node_order)
    if 0 < len(names) <= 8:
        for name in names:
            at = [
                (_hours(run, p.t), p.cache_bytes[name] / GIB)
                for p in points
                if name in p.cache_bytes
            ]
            ax.plot(*zip(*at), label=name, linewidth=1)
        ax.legend(fontsize=7)
        ax.set_title("Cache memory per node over time")
    elif names:
        spread = series.cache_spread(points)
        xs = [_hours(run, c.t) for c in spread]
        ax.fill_between(
            xs,
            [c.p10 / GIB for c in spread],
            [c.p90 / GIB for c in spread],
            color="tab:green",
            alpha=0.3,
            label="10-90 % of nodes",
        )
        ax.plot(xs, [c.median / GIB for c in spread], color="tab:green", label="median node")
        ax.plot(
            xs,
            [c.low / GIB for c in spread],
            color="tab:green",
            linestyle=":",
            label="smallest, largest",
        )
        ax.plot(xs, [c.high / GIB for c in spread], color="tab:green", linestyle=":")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"Cache memory over time, {len(names)} nodes")
    else:
        ax.set_title("Cache memory over time: no samples")
    ax.set_ylabel("GiB")


def _draw_ready(ax: Axes, run: Run, points: list[series.FleetPoint]) -> None:
    """Nodes ready (left axis) and WarmPromptSets Ready (right axis: a few sets, not a
    hundred), with the operator's time to Ready across the fleet in the title."""
    xs = [_hours(run, p.t) for p in points]
    if points:
        ax.plot(xs, [p.nodes_ready for p in points], label="nodes ready", color="tab:blue")
        ax.plot(xs, [p.nodes for p in points], label="nodes", color="tab:blue", linestyle=":")
        ax.set_ylim(0, max(p.nodes for p in points) * 1.15 + 1)  # room above a full fleet
        ax.legend(fontsize=8, loc="lower left")
    ax.set_ylabel("nodes")
    if any(p.warm_sets is not None for p in points):
        sets_ax = ax.twinx()
        sets_ax.plot(
            xs,
            [_nan(p.warm_sets_ready) for p in points],
            label="WarmPromptSets Ready",
            color="tab:green",
        )
        sets_ax.plot(
            xs,
            [_nan(p.warm_sets) for p in points],
            label="WarmPromptSets",
            color="tab:green",
            linestyle=":",
        )
        sets_ax.set_ylim(0, max((p.warm_sets or 0) for p in points) * 1.15 + 1)
        sets_ax.set_ylabel("WarmPromptSets")
        sets_ax.legend(fontsize=8, loc="lower right")
    ready = run.summary.get("operator_ready_s")
    after = (
        f"every set Ready {ready:.1f} s after the last node's warm-up"
        if isinstance(ready, int | float)
        else "the operator's time to Ready not measured"
    )
    ax.set_title(f"Nodes and WarmPromptSets Ready\n{after}" + ("" if points else "; no samples"))


# -- router.png ---------------------------------------------------------------------------


def plot_router(run: Run, path: Path) -> Path:
    """The router's decision latency (from its histogram, interval by interval), its
    decisions per second and CPU (both in wall time: the router is real), RSS and index."""
    figure, (latency_ax, rate_ax, cpu_ax, memory_ax) = _figure(2, 2, 8)
    points = series.router_points(run)
    xs = [_hours(run, p.t) for p in points]
    whole = series.histogram_quantile(0.99, series.run_decision_buckets(run))

    def draw(ax: Axes, values: list[float | None], label: str, color: str) -> bool:
        ys = [_nan(v) for v in values]
        if all(math.isnan(v) for v in ys):
            return False
        ax.plot(xs, ys, marker=".", label=label, color=color)
        return True

    drawn = draw(
        latency_ax,
        [None if p.decision_p50_s is None else p.decision_p50_s * 1000 for p in points],
        "p50",
        color="tab:blue",
    )
    drawn |= draw(
        latency_ax,
        [None if p.decision_p99_s is None else p.decision_p99_s * 1000 for p in points],
        "p99",
        color="tab:red",
    )
    title = "Route decision latency (wall ms)"
    title += f", the run's p99 {whole * 1000:.2f} ms" if whole is not None else ""
    latency_ax.set_title(title + ("" if drawn else ": no histogram samples"))
    latency_ax.set_ylabel("ms")

    rates = [
        None if p.decisions is None or not p.wall_s else p.decisions / p.wall_s for p in points
    ]
    drawn = draw(rate_ax, rates, "decisions/s", color="tab:blue")
    rate_ax.set_title("Route decisions per wall second" + ("" if drawn else ": no samples"))
    rate_ax.set_ylabel("decisions/s")

    drawn = draw(cpu_ax, [p.cpu_percent for p in points], "CPU", color="tab:orange")
    cpu_ax.set_title("Router CPU (% of one core)" + ("" if drawn else ": no samples"))
    cpu_ax.set_ylabel("%")

    drawn = draw(
        memory_ax,
        [None if p.rss_bytes is None else p.rss_bytes / MIB for p in points],
        "RSS",
        color="tab:blue",
    )
    drawn |= draw(
        memory_ax,
        [None if p.index_bytes is None else p.index_bytes / MIB for p in points],
        "prefix index (estimated)",
        color="tab:green",
    )
    blocks = [p.index_blocks for p in points if p.index_blocks is not None]
    title = "Router memory" + (f", index peak {max(blocks):,} blocks" if blocks else "")
    memory_ax.set_title(title + ("" if drawn else ": no samples"))
    memory_ax.set_ylabel("MiB")

    for n, ax in enumerate((latency_ax, rate_ax, cpu_ax, memory_ax)):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        _time_axis(ax, run)
        _mark_events(ax, run, labelled=n == 0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
    _title(figure, run, "the router")
    return _save(figure, path)


# -- compare.png --------------------------------------------------------------------------


def plot_compare(headlines: Sequence[series.Headline], path: Path) -> Path:
    """Per run: first-request TTFT p50/p95/p99, and the token hit rate by tier with the
    first requests' as a marker."""
    figure, (ttft_ax, hit_ax) = _figure(1, 2, 5)
    labels = [h.label + ("" if h.valid else " (INVALID)") for h in headlines]
    positions = list(range(len(headlines)))
    width = 0.27
    for n, q in enumerate(("p50", "p95", "p99")):
        ttft_ax.bar(
            [p + (n - 1) * width for p in positions],
            [_nan(h.first_ttft.get(q)) for h in headlines],
            width,
            label=q,
            color=QUANTILE_COLORS[q],
        )
    ttft_ax.set_title("First-request TTFT (Mac seconds)")
    ttft_ax.set_ylabel("seconds")
    tiers = series.ordered_tiers(t for h in headlines for t in h.hit_by_tier)
    bottom = [0.0] * len(headlines)
    for tier in tiers:
        heights = [h.hit_by_tier.get(tier, 0.0) for h in headlines]
        hit_ax.bar(
            positions,
            heights,
            0.6,
            bottom=bottom,
            label=tier,
            color=TIER_COLORS.get(tier, "tab:gray"),
        )
        bottom = [b + v for b, v in zip(bottom, heights)]
    hit_ax.plot(
        positions,
        [_nan(h.first_hit_rate) for h in headlines],
        "D",
        color="black",
        label="first requests",
    )
    hit_ax.set_title("Token hit rate by tier")
    hit_ax.set_ylabel("share of prompt tokens cached")
    hit_ax.set_ylim(0, 1.05)
    for ax in (ttft_ax, hit_ax):
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    figure.suptitle(f"{len(headlines)} runs side by side")
    return _save(figure, path)
