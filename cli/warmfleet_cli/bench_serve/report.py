"""Output of `bench-serve`: CSV and JSON rows, the results table and the progress bar,
and reading the rows back for `bench-compare`."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from warmfleet_cli.bench_serve.serve import ROW_FIELDS, BenchRun

FORMATS = ("table", "csv", "json")
_INT_FIELDS = frozenset(
    {"concurrency", "requests", "repetitions", "max_tokens", "ok", "errors", "length_finishes"}
)
_TEXT_FIELDS = frozenset(
    {
        "tag",
        "run_id",
        "started_at",
        "server_url",
        "server_software",
        "model",
        "prompt_set",
        "cache_policy",
        "server_counters",
        "first_error",
    }
)


class RichProgress:
    """The bench-serve progress bar: one bar per cell, on the given (stderr) console.
    The live display starts with the first cell, so an early error prints cleanly."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._console = console
        self._task: Any = None
        self._started = False

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._progress.stop()

    def cell(self, label: str, total: int) -> None:
        if not self._started:
            self._progress.start()
            self._started = True
        self._task = self._progress.add_task(label, total=total)

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)

    def note(self, text: str) -> None:
        self._console.print(text, style="dim", markup=False, highlight=False)


def render_rows(bench: BenchRun, fmt: str) -> str:
    """The rows as CSV, or as JSON with the run's identity and every request."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=ROW_FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in bench.rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
        return out.getvalue()
    if fmt == "json":
        document = {
            "run": {
                "run_id": bench.run_id,
                "started_at": bench.started_at,
                "tag": bench.options.tag,
                "server_url": bench.server.url,
                "server_software": bench.server.software,
                "model": bench.server.model,
                "server_counters": bench.server.counters,
                "cache_policy": bench.options.cache_policy,
                "max_tokens": bench.options.max_tokens,
            },
            "rows": bench.rows,
            "server_counters": bench.counters,
            "requests": [
                {
                    "prompt_set": r.prompt_set,
                    "concurrency": r.concurrency,
                    "repetition": r.repetition,
                    "index": r.index,
                    "ttft_ms": _ms(r.ttft_s),
                    "tpot_ms": _ms(r.tpot_s),
                    "e2e_ms": _ms(r.e2e_s),
                    "prompt_tokens": r.prompt_tokens,
                    "cached_tokens": r.cached_tokens,
                    "completion_tokens": r.completion_tokens,
                    "finish_reason": r.finish_reason,
                    "error": r.error,
                }
                for r in bench.results
            ],
        }
        return json.dumps(document, indent=2) + "\n"
    raise ValueError(f"unknown format {fmt!r}")


def results_table(bench: BenchRun) -> Table:
    server = bench.server
    tag = f" ({bench.options.tag})" if bench.options.tag else ""
    table = Table(
        title=f"bench-serve{tag}: {server.model} at {server.url}"
        + (f" ({server.software})" if server.software else ""),
        title_justify="left",
        caption="times in ms (medians and 95th percentiles); cached: share of prompt tokens "
        "served from the cache (not reported: the server's usage has no "
        "prompt_tokens_details.cached_tokens); server hits: the server's own hit counters "
        "over the cell",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    for name in (
        "prompts",
        "conc.",
        "ok/req",
        "TTFT p50",
        "TTFT p95",
        "TPOT p50",
        "E2E p50",
        "cached",
        "out tok/s",
        "server hits",
    ):
        table.add_column(name, justify="left" if name == "prompts" else "right", no_wrap=True)
    for row in bench.rows:
        table.add_row(
            str(row["prompt_set"]),
            str(row["concurrency"]),
            f"{row['ok']}/{row['requests']}",
            _num(row["ttft_p50_ms"], 1),
            _num(row["ttft_p95_ms"], 1),
            _num(row["tpot_p50_ms"], 1),
            _num(row["e2e_p50_ms"], 1),
            _cached(row),
            _num(row["output_tokens_per_s"], 1),
            _pct(row["server_hit_rate"]),
        )
    return table


def console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or 160 columns when writing to a file or pipe
    (rich's 80 would truncate the tables)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def print_errors(bench: BenchRun, console: Console) -> None:
    """Every failed request, grouped by message: errors are never hidden."""
    failed = [r for r in bench.results if not r.ok]
    if not failed:
        return
    counts: dict[str, int] = {}
    for r in failed:
        counts[r.error or "?"] = counts.get(r.error or "?", 0) + 1
    console.print(f"[red]{len(failed)} of {len(bench.results)} requests failed:[/red]")
    for message, count in sorted(counts.items(), key=lambda kv: -kv[1]):
        console.print(f"  {count} x {message}")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows written by bench-serve (CSV or JSON), with numbers as numbers."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if text.lstrip().startswith("{"):
        try:
            rows = json.loads(text)["rows"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a bench-serve JSON file: {exc}") from exc
    else:
        rows = list(csv.DictReader(io.StringIO(text)))
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path} has no bench-serve rows")
    missing = {"prompt_set", "concurrency", "ttft_p50_ms"} - set(rows[0])
    if missing:
        raise ValueError(f"{path} is not bench-serve output: no {', '.join(sorted(missing))}")
    return [_typed(row) for row in rows]


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in _TEXT_FIELDS or not isinstance(value, str):
            out[key] = value
        elif value == "":
            out[key] = None
        else:
            try:
                out[key] = int(value) if key in _INT_FIELDS else float(value)
            except ValueError:
                out[key] = value
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{float(value):,.{digits}f}"


def _cached(row: dict[str, Any]) -> str:
    """The cached share; a server that answered but never said is "not reported"."""
    if row["cached_token_share"] is None and row["ok"]:
        return "not reported"
    return _pct(row["cached_token_share"])


def _pct(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:.1f}%"
