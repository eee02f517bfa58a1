"""`warmfleet sim report`: the series its figures draw, computed from hand-made run
directories (TTFT percentiles per window, hit rates by tier, requests per node, the
router's decision latency from its histogram's bucket deltas, its CPU), the comparison
table, and the command writing its PNGs and Markdown, for a complete run, a run without
samples, several runs side by side and directories that are not runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warmfleet_cli.main import main
from warmfleet_cli.sim import report
from warmfleet_cli.sim import report_series as series
from warmfleet_cli.sim.report_run import load_run

PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = ("ttft.png", "hits.png", "nodes.png", "router.png")


def row(sent_s: float, ttft_s: float | None = 1.0, **over: Any) -> dict[str, Any]:
    return {
        "session": "s",
        "dev": 0,
        "agent": "claude-code",
        "version": "2.1",
        "turn": 0,
        "kind": "user",
        "sent_s": sent_s,
        "status": 200,
        "ttft_s": ttft_s,
        "duration_s": 2.0,
        "prompt_tokens": 100,
        "cached_tokens": 0,
        "cached_by_tier": {},
        "error": None,
        "node": "node-1",
        "reason": "prefix",
    } | over


def router(cpu: float, buckets: dict[str, int], **over: Any) -> dict[str, Any]:
    return {
        "cpu_seconds": cpu,
        "rss_bytes": 200 * 2**20,
        "index_bytes": 10 * 2**20,
        "index_blocks": 1000,
        "decisions": buckets["+Inf"],
        "decision_buckets": buckets,
    } | over


def node(requests: int, cache: int, ready: bool = True) -> dict[str, Any]:
    return {"ready": ready, "cache_bytes": cache, "cache_budget_bytes": 2**30, "requests": requests}


def write_run(
    folder: Path,
    *,
    meta: dict[str, Any] | None = None,
    rows: list[dict[str, Any]] | None = None,
    events: list[dict[str, Any]] | None = None,
    samples: list[dict[str, Any]] | None = None,
    summary: dict[str, Any] | None = None,
) -> Path:
    folder.mkdir(parents=True)
    meta = {
        "trace": "day.jsonl",
        "trace_params": {"developers": 3, "compress": 24.0, "day_start": 9.0},
        "nodes": 2,
        "profile": "m4-max-qwen3-30b-a3b-4bit",
        "policy": "prefix",
        "warm": True,
        "speed": 24.0,
        "cpu": "test CPU",
        "started_at": "2026-12-07T09:00:00Z",
        "valid": True,
        "invalid_reason": None,
        "label": "prefix, warm sets",
    } | (meta or {})
    (folder / "run.json").write_text(json.dumps(meta))
    for name, lines in (("rows", rows), ("events", events), ("samples", samples)):
        if lines is not None:
            (folder / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def day_rows() -> list[dict[str, Any]]:
    """Two sessions a half hour for two hours, on two nodes; the 11:00 window's first
    request fails."""
    rows = []
    for n in range(8):
        t = n * 900.0
        rows.append(row(t, 2.0 + n, session=f"s{n}", node=f"node-{1 + n % 2}"))
        rows.append(
            row(
                t + 60,
                0.5,
                session=f"s{n}",
                turn=1,
                kind="tool",
                prompt_tokens=1000,
                cached_tokens=900,
                cached_by_tier={"ram": 800, "disk": 100},
                node=f"node-{1 + n % 2}",
            )
        )
    rows[8] = rows[8] | {"error": "HTTP 503: no backend", "ttft_s": None, "status": 503}
    return rows


def day_samples() -> list[dict[str, Any]]:
    """Every 30 Mac minutes; the router's counters reset (a restart) at the third."""
    cumulative = [
        {"0.001": 0, "0.002": 0, "0.005": 0, "+Inf": 0},
        {"0.001": 50, "0.002": 90, "0.005": 100, "+Inf": 100},
        {"0.001": 10, "0.002": 10, "0.005": 10, "+Inf": 10},  # restarted
        {"0.001": 10, "0.002": 20, "0.005": 30, "+Inf": 30},
    ]
    cpu = [1.0, 76.0, 0.5, 2.0]
    return [
        {
            "t": n * 1800.0,
            "router": router(cpu[n], buckets),
            "nodes": {"node-1": node(2 * n, n * 2**28), "node-2": node(2 * n, n * 2**27)},
            "operator": {"warm_sets_ready": min(n, 2), "warm_sets": 2},
        }
        for n, buckets in enumerate(cumulative)
    ]


EVENTS = [
    {"t": 1800.0, "event": "agent-upgrade", "detail": "claude-code 2.2", "applied": True},
    {"t": 3600.0, "event": "node-lost", "node": "node-2", "applied": False},
]


# -- the series ---------------------------------------------------------------------------


def test_ttft_percentiles_per_window_first_requests_and_all() -> None:
    rows = [
        row(0, 1.0),
        row(10, 3.0),
        row(20, 2.0, turn=1),
        row(4000, 9.0),
        row(4010, None, error="x"),
    ]
    first = series.ttft_windows(rows, 1800, first_only=True)
    assert [w.start_s for w in first] == [0, 1800, 3600]
    assert (first[0].requests, first[0].p50, first[0].p95, first[0].p99) == (2, 1.0, 3.0, 3.0)
    assert (first[1].requests, first[1].p50) == (0, None)  # a gap stays a gap
    assert (first[2].requests, first[2].failed, first[2].p50) == (2, 1, 9.0)
    every = series.ttft_windows(rows, 1800, first_only=False)
    assert (every[0].requests, every[0].p50, every[0].p99) == (3, 2.0, 3.0)
    assert series.ttft_windows([], 1800, first_only=False) == []


def test_percentile_is_nearest_rank_as_the_replay_summary() -> None:
    values = [float(n) for n in range(1, 101)]
    assert [series.percentile(values, q) for q in (50, 95, 99)] == [50.0, 95.0, 99.0]
    assert series.percentile([], 50) is None


def test_hit_rate_by_tier_with_what_no_tier_claims() -> None:
    rows = [
        row(0, prompt_tokens=100, cached_tokens=80, cached_by_tier={"ram": 60, "peer": 10}),
        row(5, prompt_tokens=100, cached_tokens=0, turn=1),
        row(10, prompt_tokens=1000, cached_tokens=1000, error="failed: not counted"),
    ]
    shares = series.tier_shares(rows)
    assert list(shares) == ["ram", "peer", series.UNATTRIBUTED]
    assert shares == pytest.approx({"ram": 0.3, "peer": 0.05, series.UNATTRIBUTED: 0.05})
    assert series.hit_rate(rows) == pytest.approx(0.4)
    (window,) = series.hit_windows(rows, 1800)
    assert window.prompt_tokens == 200
    assert window.first_hit_rate == pytest.approx(0.8)


def test_histogram_quantile_interpolates_within_buckets_as_prometheus() -> None:
    buckets = [(0.001, 50.0), (0.002, 90.0), (0.005, 100.0), (math.inf, 100.0)]
    assert series.histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert series.histogram_quantile(0.7, buckets) == pytest.approx(0.0015)
    assert series.histogram_quantile(0.99, buckets) == pytest.approx(0.0047)
    # In +Inf: the highest finite bound, as Prometheus answers.
    assert series.histogram_quantile(0.99, [(0.001, 10.0), (math.inf, 20.0)]) == 0.001
    assert series.histogram_quantile(0.5, [(0.001, 0.0), (math.inf, 0.0)]) is None
    assert series.histogram_quantile(0.5, [(0.001, 5.0)]) is None  # no +Inf: not a histogram
    assert series.bucket_counts({"+Inf": 3, "0.005": 2, "bad": "x"}) == [
        (0.005, 2.0),
        (math.inf, 3.0),
    ]


def test_bucket_deltas_take_a_reset_as_prometheus_increase() -> None:
    before = [(0.001, 50.0), (math.inf, 100.0)]
    assert series.bucket_deltas(before, [(0.001, 60.0), (math.inf, 130.0)]) == [
        (0.001, 10.0),
        (math.inf, 30.0),
    ]
    assert series.bucket_deltas(before, [(0.001, 5.0), (math.inf, 7.0)]) == [
        (0.001, 5.0),
        (math.inf, 7.0),
    ]


def test_router_latency_and_cpu_interval_by_interval(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", rows=day_rows(), samples=day_samples()))
    points = series.router_points(run)
    assert [p.t for p in points] == [0, 1800, 3600, 5400]
    assert points[0].decisions is None and points[0].cpu_percent is None
    assert points[1].decisions == 100
    assert points[1].decision_p50_s == pytest.approx(0.001)
    assert points[1].decision_p99_s == pytest.approx(0.0047)
    # 75 CPU seconds in 1800 Mac seconds at 24x (75 wall seconds): one core.
    assert points[1].wall_s == pytest.approx(75.0)
    assert points[1].cpu_percent == pytest.approx(100.0)
    assert points[2].decisions == 10  # the restart: its counts are the interval's
    assert points[2].cpu_percent == pytest.approx(100 * 0.5 / 75)
    assert points[3].decisions == 20
    assert points[3].decision_p50_s == pytest.approx(0.002)  # rank 10 ends the 2nd bucket
    whole = series.run_decision_buckets(run)
    assert whole == [(0.001, 60.0), (0.002, 110.0), (0.005, 130.0), (math.inf, 130.0)]
    assert points[1].index_bytes == 10 * 2**20


def test_node_loads_from_rows_or_from_samples(tmp_path: Path) -> None:
    rows = [
        row(0, node="node-10"),
        row(1, node="node-2"),
        row(2, node="node-2", error="x"),
        row(3, node=None),
    ]
    samples = [{"t": 0, "nodes": {"node-2": node(1, 100), "node-10": node(0, 50)}},
               {"t": 60, "nodes": {"node-2": node(2, 300), "node-10": node(1, 20)}}]  # fmt: skip
    run = load_run(write_run(tmp_path / "a", rows=rows, samples=samples))
    loads = series.node_loads(run)
    assert [(n.node, n.requests, n.failed) for n in loads] == [("node-2", 2, 1), ("node-10", 1, 0)]
    assert [(n.cache_bytes, n.cache_peak_bytes, n.budget_bytes) for n in loads] == [
        (300, 300, 2**30),
        (20, 50, 2**30),
    ]
    unnamed = [row(0, node=None)]
    run = load_run(write_run(tmp_path / "b", rows=unnamed, samples=samples))
    assert [(n.node, n.requests) for n in series.node_loads(run)] == [("node-2", 2), ("node-10", 1)]


def test_headline_figures(tmp_path: Path) -> None:
    run = load_run(
        write_run(
            tmp_path / "run",
            rows=day_rows(),
            events=EVENTS,
            samples=day_samples(),
            summary={"operator_ready_s": 4.5},
        )
    )
    h = series.headline(run)
    assert (h.requests, h.failed, h.label, h.policy, h.warm, h.valid) == (
        16, 1, "prefix, warm sets", "prefix", True, True
    )  # fmt: skip
    assert h.first_ttft == {"p50": 5.0, "p95": 9.0, "p99": 9.0}  # 2..9 but the failed 6
    assert h.later_ttft == {"p50": 0.5, "p95": 0.5, "p99": 0.5}
    assert h.hit_rate == pytest.approx(7200 / 8700)
    assert h.hit_by_tier == pytest.approx({"ram": 6400 / 8700, "disk": 800 / 8700})
    assert h.first_hit_rate == 0
    assert h.decision_p99_s == pytest.approx(
        series.histogram_quantile(0.99, series.run_decision_buckets(run))
    )
    assert (h.index_bytes_peak, h.operator_ready_s) == (10 * 2**20, 4.5)
    assert h.router_cpu_percent == pytest.approx(100 * (75 + 0.5 + 1.5) / 225)


def test_after_an_upgrade_the_new_versions_first_requests_in_the_next_hour(
    tmp_path: Path,
) -> None:
    upgrade = {"t": 1800.0, "event": "agent-upgrade", "agent": "claude-code", "from": "2.1",
               "to": "2.2", "applied": True}  # fmt: skip
    rows = [
        row(1700.0, 9.0, version="2.2"),  # before it: not counted
        row(1900.0, 8.0, version="2.2", prompt_tokens=1000),
        row(2000.0, 1.0, version="2.2", prompt_tokens=1000, cached_tokens=900),
        row(2100.0, 1.0, version="2.2", turn=1),  # a later turn
        row(2200.0, 7.0, version="2.1"),  # a session of the old version still going
        row(2300.0, 7.0, version="2.2", agent="codex"),
        row(5500.0, 9.0, version="2.2"),  # over an hour after it
    ]
    run = load_run(write_run(tmp_path / "run", rows=rows, events=[upgrade],
                             meta={"learn_min_sessions": 3}))  # fmt: skip
    h = series.headline(run)
    (u,) = h.after_upgrade
    assert (u.agent, u.version, u.at_s, u.first_requests) == ("claude-code", "2.2", 1800.0, 2)
    assert u.ttft == {"p50": 1.0, "p95": 8.0, "p99": 8.0}
    assert u.hit_rate == pytest.approx(0.45)
    assert h.learn_min_sessions == 3
    text = report.run_markdown(run, h, 1800.0)
    assert "After the claude-code upgrade to 2.2 at 09:30: its 2 new sessions" in text
    assert "learning from 3 sessions" in text
    column = report.COMPARE_HEADERS.index("after an upgrade: first TTFT p95 (s)")
    assert report.compare_table([h])[0][column] == "8.00"
    assert report.compare_table([h])[0][report.COMPARE_HEADERS.index("learning")] == (
        "from 3 sessions"
    )


def test_a_run_slower_than_its_trace_reads_its_clock_in_the_days_time(tmp_path: Path) -> None:
    """At --sim-speed 12 a trace compressed 24x gave the Macs its day twice as dense: a
    Mac half hour after the 09:00 start is 10:00 of the day."""
    upgrade = {"t": 1800.0, "event": "agent-upgrade", "agent": "claude-code", "from": "2.1",
               "to": "2.2", "applied": True}  # fmt: skip
    rows = [row(1900.0, 8.0, version="2.2")]
    slow = load_run(write_run(tmp_path / "slow", rows=rows, events=[upgrade],
                              meta={"speed": 12.0}))  # fmt: skip
    assert slow.day_per_mac == 2.0 and report.clock(slow, 1800.0) == "10:00"
    text = report.run_markdown(slow, series.headline(slow), 1800.0)
    assert "After the claude-code upgrade to 2.2 at 10:00" in text
    same = load_run(write_run(tmp_path / "same", meta={"speed": 24.0}))
    assert same.day_per_mac == 1.0 and report.clock(same, 1800.0) == "09:30"
    unknown = load_run(write_run(tmp_path / "unknown", meta={"speed": None}))
    assert unknown.day_per_mac == 1.0


def _headline(
    label: str, policy: str, warm: bool, p95: float, *, valid: bool = True
) -> series.Headline:
    return series.Headline(
        label, valid, None if valid else "a backend died", policy, warm, 10, 100, 0,
        {"p50": 0.5, "p95": p95, "p99": 2 * p95}, {"p50": 0.1, "p95": 0.2, "p99": 0.3},
        0.9, 0.8, {"ram": 0.9}, 0.002, 5 * 2**20, 100 * 2**20, 12.0, 3.0,
    )  # fmt: skip


def test_compare_table_against_round_robin_with_the_same_warm_sets() -> None:
    headlines = [
        _headline("round-robin, warm sets", "round-robin", True, 4.0),
        _headline("prefix, warm sets", "prefix", True, 1.0),
        _headline("prefix, no warm sets", "prefix", False, 3.0),
        _headline("session, warm sets", "session", True, 2.0, valid=False),
    ]
    table = report.compare_table(headlines)
    assert len(table[0]) == len(report.COMPARE_HEADERS)
    ratio = report.COMPARE_HEADERS.index("first p95 / round-robin's")
    assert [r[ratio] for r in table] == ["1.00x", "0.25x", "-", "0.50x"]
    assert table[1][:8] == ["prefix, warm sets", "prefix", "on", "100", "0", "0.50", "1.00", "2.00"]
    assert table[3][0] == "session, warm sets (INVALID)"
    assert table[1][report.COMPARE_HEADERS.index("decision p99 (ms)")] == "2.00"
    assert table[1][report.COMPARE_HEADERS.index("index peak")] == "5.0 MiB"
    text = report.compare_markdown(
        headlines, ["a/report.md", "b/report.md", "c/report.md", "d/report.md"]
    )
    assert "| [prefix, warm sets](b/report.md) | prefix | on |" in text
    assert "> **INVALID RUN: a backend died.**" in text


# -- the command --------------------------------------------------------------------------


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG)


def test_report_writes_the_figures_and_the_headline_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(
        tmp_path / "run",
        rows=day_rows(),
        events=EVENTS,
        samples=day_samples(),
        summary={"operator_ready_s": 4.5},
    )
    out = tmp_path / "report"
    assert main(["sim", "report", str(run_dir), "--out", str(out)]) == 0
    for name in FIGURES:
        assert _is_png(out / name), name
    text = (out / "report.md").read_text()
    assert "INVALID" not in text
    assert "| requests | 16 |" in text
    assert "| failed | 1 |" in text
    assert "| first-request TTFT p50 / p95 / p99 (Mac s) | 5.00 / 9.00 / 9.00 |" in text
    assert "| token hit rate by tier | ram 73.6%, disk 9.2% |" in text
    assert "warm-up (wall s) | 4.50 |" in text  # the operator runs at its own pace
    assert "- 09:30 agent-upgrade claude-code 2.2\n- 10:00 node-lost node-2 (not applied)\n" in text
    assert all(f"`{name}`" in text for name in FIGURES)
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / n) for n in (*FIGURES, "report.md")]


def test_a_run_without_samples_events_or_summary_still_reports(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "old", meta={"label": None, "trace_params": {}}, rows=day_rows())
    out = tmp_path / "report"
    assert main(["sim", "report", str(run_dir), "--out", str(out), "--window", "10"]) == 0
    for name in FIGURES:
        assert _is_png(out / name), name
    text = (out / "report.md").read_text()
    assert text.startswith("# old\n")  # the folder's name when the run has no label
    assert "| route decision p99 (wall ms) | - |" in text


def test_an_empty_run_and_an_invalid_run_side_by_side(tmp_path: Path) -> None:
    empty = write_run(tmp_path / "empty", meta={"label": "round-robin", "policy": "round-robin"})
    invalid = write_run(
        tmp_path / "invalid",
        meta={"valid": False, "invalid_reason": "the fleet was not at --sim-speed 24"},
        rows=day_rows(),
        samples=day_samples()[:1],
    )
    with (invalid / "rows.jsonl").open("a") as rows:
        rows.write('{"session": "cut sho')  # a run stopped mid-line
    again = write_run(tmp_path / "again", rows=day_rows(), events=EVENTS, samples=day_samples())
    out = tmp_path / "report"
    assert main(["sim", "report", str(empty), str(invalid), str(again), "--out", str(out)]) == 0
    folders = ["round-robin", "prefix-warm-sets", "prefix-warm-sets-2"]
    for folder in folders:
        for name in FIGURES:
            assert _is_png(out / folder / name), f"{folder}/{name}"
    assert _is_png(out / "compare.png")
    loud = "> **INVALID RUN: the fleet was not at --sim-speed 24.**"
    assert (out / "prefix-warm-sets" / "report.md").read_text().split("\n")[2].startswith(loud)
    assert (
        "1 unreadable lines were skipped." in (out / "prefix-warm-sets" / "report.md").read_text()
    )
    compare = (out / "compare.md").read_text()
    assert "[round-robin](round-robin/report.md)" in compare
    assert "[prefix, warm sets (INVALID)](prefix-warm-sets/report.md)" in compare
    assert "[prefix, warm sets](prefix-warm-sets-2/report.md)" in compare


def test_not_a_run_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_run(tmp_path / "good", rows=day_rows())
    out = tmp_path / "report"
    assert main(["sim", "report", str(good), str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "nowhere: no such run directory" in capsys.readouterr().err
    assert not out.exists()  # nothing written when one directory is not a run
    (tmp_path / "stray").mkdir()
    assert main(["sim", "report", str(tmp_path / "stray"), "--out", str(out)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    (good / "run.json").write_text("{not json")
    assert main(["sim", "report", str(good), "--out", str(out)]) == 2
    assert "run.json: unreadable" in capsys.readouterr().err
    assert main(["sim", "report", str(good), "--out", str(out), "--window", "0"]) == 2


def test_matplotlib_loads_only_to_draw() -> None:
    """`sim`'s other verbs, and this one's --help, stay as quick as they were."""
    code = (
        "import sys\n"
        "from warmfleet_cli.main import main\n"
        "for argv in (['sim', 'trace', '--help'], ['sim', 'report', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('matplotlib' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "False"
