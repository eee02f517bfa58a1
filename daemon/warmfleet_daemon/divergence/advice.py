"""The findings of a report in words: what varies, and what to change in the template."""

from __future__ import annotations

import dataclasses

from warmfleet_daemon.divergence.report import DivergenceReport, Finding, Kind

ADVICE = {
    Kind.DATE_TIME: (
        "A date or time changes at token {pos}, so every request recomputes the prefix "
        "from there. Move it into the last user message, or round it (to the day) and "
        "put it after the static instructions."
    ),
    Kind.ID: (
        "A per-user or per-session ID sits at token {pos}: every user or session gets a "
        "prefix of its own. Send it in the user message or as request metadata (the "
        "`user` field, a header), not in the system prompt."
    ),
    Kind.NUMBER: (
        "A number or version string changes at token {pos}. Pin it if it is a deploy-time "
        "constant; if it changes per request (counters, balances, build ids), move it "
        "after the static part."
    ),
    Kind.REORDERED: (
        "The same blocks (few-shot examples, RAG documents, tools) arrive in different "
        "orders from token {pos}. Sort them deterministically (by id or title) before "
        "rendering, and put per-request documents after the static instructions."
    ),
    Kind.OTHER: (
        "Text in the static part changes at token {pos}. Keep what every request shares "
        "first (system prompt, tools, fixed examples) and per-request text in the last "
        "message."
    ),
    Kind.NEW_PROMPT: "",
}


def with_findings(report: DivergenceReport) -> DivergenceReport:
    findings: list[Finding] = []
    culprits = report.culprits
    pct = _pct
    if report.analyzed and report.unique_prefix_share > 0.5 and culprits:
        findings.append(
            Finding(
                "unique prefixes",
                f"{pct(report.unique_prefix_share)} of the prompts have a prefix no other "
                "prompt shares, so a prefix cache cannot help them.",
                f"Fix the {culprits[0].kind.value} at token {culprits[0].position} first: "
                f"{culprits[0].requests} prompts diverge there.",
            )
        )
    for point in culprits[:5]:
        share = point.requests / max(report.analyzed, 1)
        seen = ", ".join(repr(v) for v in (point.reference, *point.variants[:2]))
        findings.append(
            Finding(
                point.kind.value,
                f"token {point.position}: {point.kind.value} varies in {point.requests} "
                f"prompts ({pct(share)}): {seen}",
                point.advice,
            )
        )
    gap = report.theoretical_hit_rate - report.hit_rate
    if culprits and gap > 0.05:
        findings.append(
            Finding(
                "hit rate",
                f"An unbounded cache would hit {pct(report.hit_rate)} of the prompt tokens; "
                f"{pct(report.theoretical_hit_rate)} if every static prefix matched.",
                "Fixing the divergence points above closes that gap.",
            )
        )
    early = min((p.position for p in culprits), default=None)
    if early is not None and report.hit_rate - report.block_hit_rate > 0.05:
        block = report.block_size
        findings.append(
            Finding(
                "block size",
                f"In blocks of {block} tokens the hit rate is {pct(report.block_hit_rate)} "
                f"(token by token {pct(report.hit_rate)}): caches reuse whole blocks only, "
                f"so the divergence at token {early} loses block {early // block} "
                f"(tokens {early // block * block}-{early // block * block + block - 1}) "
                "and everything after it.",
                "Move what varies after the static part, so the shared prefix runs for many "
                "whole blocks.",
            )
        )
    if report.analyzed and not culprits:
        news = f", {report.new_prompts} start a new prompt" if report.new_prompts else ""
        findings.append(
            Finding(
                "ok",
                f"No template problem found: {report.matched} of {report.analyzed} prompts "
                f"matched an earlier prompt's whole static prefix{news}.",
                "Nothing to fix in the templates; a low hit rate then comes from the cache "
                "(size, eviction) or from routing, not from the prompts.",
            )
        )
    return dataclasses.replace(report, findings=tuple(findings))


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"
