"""`warmfleet bench-compare A B`: two bench-serve runs (typically `--tag cold` and
`--tag warm`) side by side: median TTFT and its speed-up per prompt set and
concurrency, as a table and as a PNG plot of TTFT and throughput by concurrency."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table


@dataclass(frozen=True)
class Comparison:
    model: str
    prompt_set: str
    concurrency: int
    ttft_a: float | None  # median TTFT, ms
    ttft_b: float | None
    tps_a: float | None  # output tokens per second
    tps_b: float | None
    cached_a: float | None  # cached share of prompt tokens
    cached_b: float | None

    @property
    def speedup(self) -> float | None:
        """How many times faster the first token arrives in B than in A."""
        if not self.ttft_a or not self.ttft_b:
            return None
        return self.ttft_a / self.ttft_b


def labels(
    a_rows: Sequence[dict[str, Any]], b_rows: Sequence[dict[str, Any]], a: str, b: str
) -> tuple[str, str]:
    """The runs' tags (`cold`, `warm`), or their file names when tags are missing or equal."""
    tag_a, tag_b = (str(rows[0].get("tag") or "") for rows in (a_rows, b_rows))
    if tag_a and tag_b and tag_a != tag_b:
        return tag_a, tag_b
    return Path(a).stem, Path(b).stem


def compare(a_rows: Sequence[dict[str, Any]], b_rows: Sequence[dict[str, Any]]) -> list[Comparison]:
    """Cells joined on (prompt set, concurrency), in A's order; cells only one run has
    are kept with blanks for the other."""
    a_cells = {_key(r): r for r in reversed(a_rows)}  # reversed: the first row wins
    b_cells = {_key(r): r for r in reversed(b_rows)}
    keys = list(dict.fromkeys([_key(r) for r in a_rows] + [_key(r) for r in b_rows]))
    out = []
    for key in keys:
        a, b = a_cells.get(key, {}), b_cells.get(key, {})
        models = list(dict.fromkeys(str(r["model"]) for r in (a, b) if r.get("model")))
        out.append(
            Comparison(
                model=" / ".join(models),
                prompt_set=key[0],
                concurrency=key[1],
                ttft_a=_float(a.get("ttft_p50_ms")),
                ttft_b=_float(b.get("ttft_p50_ms")),
                tps_a=_float(a.get("output_tokens_per_s")),
                tps_b=_float(b.get("output_tokens_per_s")),
                cached_a=_float(a.get("cached_token_share")),
                cached_b=_float(b.get("cached_token_share")),
            )
        )
    return out


def comparison_table(rows: Sequence[Comparison], label_a: str, label_b: str) -> Table:
    table = Table(
        title=f"TTFT {label_a} vs {label_b}: medians in ms; output tokens/s; cached share",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    for name in _headers(rows, label_a, label_b, units=False):
        table.add_column(
            name, justify="left" if name in ("model", "prompts") else "right", no_wrap=True
        )
    for row in rows:
        table.add_row(*_cells(row, with_prompts=_several_sets(rows)))
    return table


def markdown(rows: Sequence[Comparison], label_a: str, label_b: str) -> str:
    headers = _headers(rows, label_a, label_b, units=True)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if h in ("model", "prompts") else "---:" for h in headers) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cells(row, with_prompts=_several_sets(rows))) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Comparison], label_a: str, label_b: str, path: str | Path) -> Path:
    """TTFT and throughput by concurrency, A vs B, one line per run and prompt set."""
    from matplotlib.figure import Figure  # the Agg canvas: no display needed

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    ttft_ax, tps_ax = figure.subplots(1, 2)
    sets = list(dict.fromkeys(r.prompt_set for r in rows))
    styles = ["-", "--", ":", "-."]
    for n, prompt_set in enumerate(sets):
        cells = sorted((r for r in rows if r.prompt_set == prompt_set), key=lambda r: r.concurrency)
        x = [r.concurrency for r in cells]
        suffix = f" ({prompt_set})" if len(sets) > 1 else ""
        for label, color, ttft, tps in (
            (label_a, "tab:blue", [r.ttft_a for r in cells], [r.tps_a for r in cells]),
            (label_b, "tab:orange", [r.ttft_b for r in cells], [r.tps_b for r in cells]),
        ):
            style = dict(color=color, linestyle=styles[n % len(styles)], marker="o")
            ttft_ax.plot(*_present(x, ttft), label=label + suffix, **style)
            tps_ax.plot(*_present(x, tps), label=label + suffix, **style)
    concurrencies = sorted({r.concurrency for r in rows})
    for ax, title, unit in (
        (ttft_ax, "Time to first token (median)", "ms"),
        (tps_ax, "Output throughput", "tokens/s"),
    ):
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(unit)
        ax.set_xticks(concurrencies)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    models = ", ".join(dict.fromkeys(r.model for r in rows if r.model))
    figure.suptitle(f"{label_a} vs {label_b}" + (f": {models}" if models else ""))
    out = Path(path)
    figure.savefig(out, dpi=120)
    return out


def _headers(rows: Sequence[Comparison], label_a: str, label_b: str, *, units: bool) -> list[str]:
    headers = ["model"]
    if _several_sets(rows):
        headers.append("prompts")
    ms = " (ms)" if units else ""
    headers += [
        "concurrency",
        f"TTFT {label_a}{ms}",
        f"TTFT {label_b}{ms}",
        "speed-up",
        f"tok/s {label_a}",
        f"tok/s {label_b}",
        f"cached {label_a}",
        f"cached {label_b}",
    ]
    return headers


def _cells(row: Comparison, *, with_prompts: bool) -> list[str]:
    cells = [row.model]
    if with_prompts:
        cells.append(row.prompt_set)
    speedup = row.speedup
    cells += [
        str(row.concurrency),
        _num(row.ttft_a, 1),
        _num(row.ttft_b, 1),
        "-" if speedup is None else f"{speedup:.2f}x",
        _num(row.tps_a, 1),
        _num(row.tps_b, 1),
        _cached(row.cached_a, row.ttft_a),
        _cached(row.cached_b, row.ttft_b),
    ]
    return cells


def _several_sets(rows: Sequence[Comparison]) -> bool:
    return len({r.prompt_set for r in rows}) > 1


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return str(row.get("prompt_set")), int(row.get("concurrency") or 0)


def _present(x: list[int], y: list[float | None]) -> tuple[list[int], list[float]]:
    pairs = [(a, b) for a, b in zip(x, y) if b is not None]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _float(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cached(share: float | None, ttft: float | None) -> str:
    # Requests that succeeded (a TTFT) without a cached share: the server did not say.
    return "not reported" if share is None and ttft is not None else _pct(share)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"
