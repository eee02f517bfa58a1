"""The analysis: prompts in arrival order matched against every earlier one (a radix
tree), the divergences diffed and grouped into points with findings."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Sequence

from warmfleet_daemon.divergence.advice import ADVICE, with_findings
from warmfleet_daemon.divergence.compare import Decode, Observation, compare
from warmfleet_daemon.divergence.radix import RadixTree
from warmfleet_daemon.divergence.report import (
    DivergencePoint,
    DivergenceReport,
    Kind,
    PromptTokens,
)

__all__ = ["Decode", "analyze"]

_NEAR = 2  # points this close (same kind) are the same field, shifted a little
_SAMPLES = 5


def analyze(
    prompts: Sequence[PromptTokens],
    decode: Decode,
    *,
    prefix_tokens: int = 512,
    block_size: int = 16,
    references: Sequence[Sequence[int]] = (),
    targets: Collection[int] | None = None,
    max_points: int = 10,
    max_diffs: int = 1000,
    time_budget_s: float | None = None,
) -> DivergenceReport:
    """Analyze `prompts` (in arrival order). `references` are prefixes known to be
    cached before the first prompt (warm prompts); `targets` limits the divergence
    analysis to those prompt indices (the daemon passes its misses). At most
    `max_diffs` diverging prompts are diffed, spread evenly over the log, and none
    after `time_budget_s` (counts are scaled to what was diffed). Every step is
    linear in the prompts' tokens."""
    if prefix_tokens < 1 or block_size < 1:
        raise ValueError("prefix_tokens and block_size must be >= 1")
    tree = RadixTree()
    windows: list[int] = []  # each tree entry's prefix length (references: all of it)
    for ref in references:
        tree.match_and_insert(tuple(ref))
        windows.append(len(ref))
    wanted = set(range(len(prompts))) if targets is None else set(targets)

    total = hits = block_hits = ideal = 0
    prefixes: Counter[tuple[int, ...]] = Counter()
    diverging: list[tuple[int, int, int]] = []  # (prompt, position, tree index it matched)
    first_positions: Counter[int] = Counter()
    matched = continuations = analyzed = 0
    for i, prompt in enumerate(prompts):
        tokens = prompt.tokens
        window = _prefix_length(prompt, prefix_tokens)
        had_earlier = tree.size > 0
        lcp, owner = tree.match_and_insert(tokens)
        windows.append(window)
        total += len(tokens)
        prefixes[tokens[:window]] += 1
        if had_earlier:
            hits += lcp
            block_hits += lcp // block_size * block_size
            static = prompt.static_end if prompt.static_end is not None else window
            ideal += max(lcp, min(static, len(tokens)))
        if i not in wanted or not had_earlier:
            continue
        analyzed += 1
        if lcp >= window:
            matched += 1
        elif tree.has_sequence(tokens, lcp):
            continuations += 1  # an earlier prompt ended here: the next turn of its chat
        else:
            first_positions[lcp] += 1
            diverging.append((i, lcp, -1 if owner is None else owner))

    chosen = _spread(diverging, max_diffs)
    observations: list[Observation] = []
    new_prompts = 0
    deadline = None if time_budget_s is None else time.perf_counter() + time_budget_s
    for n, (i, position, owner) in enumerate(chosen):
        if deadline is not None and n and time.perf_counter() > deadline:
            chosen = chosen[:n]
            break
        a = prompts[i].tokens[: _prefix_length(prompts[i], prefix_tokens)]
        b = tree.sequence(owner)[: max(windows[owner], position + 1)] if owner >= 0 else ()
        found = compare(a, b, position, decode)
        if found and found[0].kind is Kind.NEW_PROMPT:
            new_prompts += 1
        observations.extend(found)
    scale = len(diverging) / len(chosen) if chosen else 1.0  # sampled: scale counts up
    new_prompts = round(new_prompts * scale)

    common_prefix, common_count = prefixes.most_common(1)[0] if prefixes else ((), 0)
    report = DivergenceReport(
        prompts=len(prompts),
        prompt_tokens=total,
        analyzed=analyzed,
        prefix_tokens=prefix_tokens,
        block_size=block_size,
        unique_prefixes=len(prefixes),
        unique_prefix_share=len(prefixes) / len(prompts) if prompts else 0.0,
        common_prefix_tokens=len(common_prefix),
        common_prefix_prompts=common_count,
        hit_rate=hits / total if total else 0.0,
        block_hit_rate=block_hits / total if total else 0.0,
        theoretical_hit_rate=ideal / total if total else 0.0,
        first_divergence=tuple(first_positions.most_common()),
        matched=matched,
        continuations=continuations,
        new_prompts=new_prompts,
        diffed=len(chosen),
        points=tuple(_points(observations, max_points, scale)),
    )
    return with_findings(report)


def _points(
    observations: list[Observation], limit: int, scale: float = 1.0
) -> list[DivergencePoint]:
    groups: dict[tuple[int, Kind], list[Observation]] = {}
    for obs in observations:
        # Reordering is one problem however many blocks move: one point, where it starts.
        position = -1 if obs.kind is Kind.REORDERED else obs.position
        groups.setdefault((position, obs.kind), []).append(obs)
    kept: list[tuple[tuple[int, Kind], list[Observation]]] = []
    for key, group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0][0])):
        near = next(
            (g for (pos, kind), g in kept if kind is key[1] and abs(pos - key[0]) <= _NEAR), None
        )
        if near is not None:
            near.extend(group)
        else:
            kept.append((key, group))
    points = []
    for (position, kind), group in kept:
        if kind is Kind.REORDERED:
            position = min(o.position for o in group)
        references = Counter(o.reference for o in group)
        reference = references.most_common(1)[0][0]
        example = next(o for o in group if o.reference == reference)
        variants = list(dict.fromkeys(o.variant for o in group if o.variant != reference))
        points.append(
            DivergencePoint(
                position=position,
                kind=kind,
                requests=round(len(group) * scale),
                first=round(sum(o.first for o in group) * scale),
                reference=reference,
                variants=tuple(variants[:_SAMPLES]),
                before=example.before,
                after=example.after,
                advice=ADVICE[kind].format(pos=position),
            )
        )
    points.sort(key=lambda p: (not p.is_culprit, -p.requests, p.position))
    return points[:limit]


def _prefix_length(prompt: PromptTokens, window: int) -> int:
    end = prompt.static_end if prompt.static_end is not None else len(prompt.tokens) - 1
    return max(0, min(window, end, len(prompt.tokens)))


def _spread(items: list[tuple[int, int, int]], limit: int) -> list[tuple[int, int, int]]:
    if len(items) <= limit:
        return items
    step = len(items) / limit
    return [items[int(k * step)] for k in range(limit)]
