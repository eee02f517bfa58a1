"""The audit's output: a JSON document, or tables on a rich Console."""

from __future__ import annotations

import json
from typing import Any

from warmfleet_daemon.divergence import DivergenceReport

_SHOWN_ERRORS = 20


def report_json(report: DivergenceReport, meta: dict[str, Any]) -> str:
    return json.dumps({**meta, **report.to_dict()}, indent=2, ensure_ascii=False)


def print_report(report: DivergenceReport, meta: dict[str, Any], console: Any) -> None:
    """The report as tables on a rich Console."""
    from rich.table import Table

    pct = _pct
    kinds = []
    if meta["chat_requests"]:
        kinds.append(f"{meta['chat_requests']} chat requests")
    if meta["rendered_prompts"]:
        kinds.append(f"{meta['rendered_prompts']} rendered prompts")
    console.print(
        f"[bold]warmfleet audit[/bold] {meta['log']}: {', '.join(kinds)}, "
        f"{report.prompt_tokens} tokens ({meta['tokenizer']})"
    )
    summary = Table(show_header=False, box=None, padding=(0, 2))
    summary.add_row(
        "unique prefixes",
        f"{report.unique_prefixes} of {report.prompts} ({pct(report.unique_prefix_share)}); "
        f"prefix = static part, at most {report.prefix_tokens} tokens",
    )
    summary.add_row(
        "most common prefix",
        f"{report.common_prefix_tokens} tokens, {report.common_prefix_prompts} prompts",
    )
    summary.add_row(
        "hit rate (unbounded cache)",
        f"{pct(report.hit_rate)} token by token, {pct(report.block_hit_rate)} in blocks of "
        f"{report.block_size}",
    )
    summary.add_row("if every prefix matched", pct(report.theoretical_hit_rate))
    summary.add_row(
        "compared with earlier",
        f"{report.analyzed} prompts: {report.matched} matched in full, "
        f"{report.continuations} continue a chat, {report.new_prompts} new prompts, "
        f"{sum(n for _, n in report.first_divergence) - report.new_prompts} diverge",
    )
    console.print(summary)

    if report.first_divergence:
        console.print(
            "[bold]First divergence[/bold]: the token where a prompt stops matching every "
            "earlier one"
        )
        hist = Table()
        hist.add_column("token", justify="right")
        hist.add_column("prompts", justify="right")
        hist.add_column("share", justify="right")
        for position, count in report.first_divergence[:10]:
            hist.add_row(str(position), str(count), pct(count / max(report.analyzed, 1)))
        console.print(hist)

    if report.points:
        diverging = sum(n for _, n in report.first_divergence)
        sampled = (
            f" (counts estimated from {report.diffed} of {diverging} diverging prompts)"
            if report.diffed < diverging
            else ""
        )
        console.print(f"[bold]Divergence points[/bold]: what varies there{sampled}")
        points = Table()
        points.add_column("token", justify="right")
        points.add_column("what varies")
        points.add_column("prompts", justify="right")
        points.add_column("text there (earlier prompt ⟦…⟧, then what the others have)")
        for point in report.points:
            variants = ", ".join(repr(v[:40]) for v in point.variants[:3])
            points.add_row(
                str(point.position),
                point.kind.value,
                str(point.requests),
                f"{point.excerpt()}\n→ {variants}" if variants else point.excerpt(),
            )
        console.print(points)

    console.print("[bold]Findings[/bold]")
    for n, finding in enumerate(report.findings, 1):
        console.print(f"{n}. {finding.message}\n   [italic]{finding.advice}[/italic]")
    errors = meta["skipped_lines"]
    if errors:
        console.print(f"[yellow]{len(errors)} line(s) skipped:[/yellow]")
        for item in errors[:_SHOWN_ERRORS]:
            console.print(f"  {meta['log']}:{item['line']}: {item['error']}")
        if len(errors) > _SHOWN_ERRORS:
            console.print(f"  ... and {len(errors) - _SHOWN_ERRORS} more (see --format json)")


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"
