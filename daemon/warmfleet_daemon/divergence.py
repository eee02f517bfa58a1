"""Where prompts stop sharing their prefix, and why: the analysis behind `warmfleet
audit` and the daemon's live cache diagnostics. Plain Python over token sequences (no
mlx); the caller passes a `decode` function for the text.

Prompts are taken in arrival order. The longest prefix a prompt shares with any earlier
one is what an unbounded prefix cache could serve it (a radix tree finds it and the
earlier prompt it matched). Where that match ends inside the prompt's *prefix* (its
static part: everything before its last message, at most `prefix_tokens` tokens) is its
first divergence. The two prompts are then diffed to find every region that differs,
and the text there is classified: a date or time, a UUID or other ID, a number or
version, the same blocks in another order, other text, or a new prompt (different
content from there on, such as another agent: not a template mistake).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

Decode = Callable[[Sequence[int]], str]


class Kind(str, Enum):
    DATE_TIME = "date/time"
    ID = "uuid/id"
    NUMBER = "number/version"
    REORDERED = "reordered blocks"
    OTHER = "other text"
    NEW_PROMPT = "new prompt"  # benign: content never seen before (another agent, say)


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

_CONTEXT_TOKENS = 12  # decoded on each side of a differing region
_MERGE_GAP = 3  # differing regions this close (in tokens) are one varying field
_REALIGN_SHARE = 0.5  # of the tokens after a region that must match again
_NEAR = 2  # points this close (same kind) are the same field, shifted a little
_SAMPLES = 5
# Bounds that keep one comparison linear in its tokens (the daemon runs this live):
_FIELD_TOKENS = 96  # a differing region is decoded up to this many tokens
_MAX_FIELDS = 32  # differing fields looked at per comparison
_LOOKAHEAD = 64  # how far the diff looks for where two prompts agree again ...
_ANCHOR = 4  # ... as this many equal tokens in a row


@dataclass(frozen=True)
class PromptTokens:
    """One prompt: its tokens and, for chat requests, where its last message starts."""

    tokens: tuple[int, ...]
    static_end: int | None = None  # tokens before the last message's content; None: unknown


@dataclass(frozen=True)
class DivergencePoint:
    position: int  # token index (in the diverging prompts) where they start to differ
    kind: Kind
    requests: int  # prompts that differ here
    first: int  # ... for which it is the first divergence
    reference: str  # what the matched earlier prompt has there (the most common)
    variants: tuple[str, ...]  # what the diverging prompts have there (distinct samples)
    before: str  # decoded text just before the point
    after: str  # ... and just after it, in the reference
    advice: str

    @property
    def is_culprit(self) -> bool:
        return self.kind is not Kind.NEW_PROMPT

    def excerpt(self, width: int = 40) -> str:
        """`…text before ⟦reference⟧ text after…` on one line."""
        before = _one_line(self.before)[-width:]
        after = _one_line(self.after)[:width]
        return f"…{before}⟦{_one_line(self.reference)}⟧{after}…"

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "kind": self.kind.value,
            "requests": self.requests,
            "first_divergence": self.first,
            "reference": self.reference,
            "variants": list(self.variants),
            "before": self.before,
            "after": self.after,
            "excerpt": self.excerpt(),
            "advice": self.advice,
        }


@dataclass(frozen=True)
class Finding:
    topic: str  # a Kind's value, or "unique prefixes", "hit rate", "block size", "ok"
    message: str
    advice: str

    def to_dict(self) -> dict[str, str]:
        return {"topic": self.topic, "message": self.message, "advice": self.advice}


@dataclass(frozen=True)
class DivergenceReport:
    prompts: int
    prompt_tokens: int
    analyzed: int  # prompts whose divergence was looked for (with an earlier prompt)
    prefix_tokens: int  # the prefix window
    block_size: int
    unique_prefixes: int
    unique_prefix_share: float
    common_prefix_tokens: int  # the most common prefix: its length ...
    common_prefix_prompts: int  # ... and how many prompts have it
    hit_rate: float  # an unbounded cache, token-granular, in arrival order
    block_hit_rate: float  # the same, counting whole blocks only
    theoretical_hit_rate: float  # if every prompt's static prefix had matched
    first_divergence: tuple[tuple[int, int], ...]  # (position, prompts), most common first
    matched: int  # analyzed prompts whose whole prefix matched an earlier prompt
    continuations: int  # ... that extend an earlier prompt (the next turn of a chat)
    new_prompts: int  # ... that diverge into new content (benign)
    diffed: int  # diverging prompts diffed (all, or a sample of max_diffs: counts scaled)
    points: tuple[DivergencePoint, ...]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def culprits(self) -> tuple[DivergencePoint, ...]:
        return tuple(p for p in self.points if p.is_culprit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "prompt_tokens": self.prompt_tokens,
            "analyzed": self.analyzed,
            "prefix_tokens": self.prefix_tokens,
            "block_size": self.block_size,
            "unique_prefixes": self.unique_prefixes,
            "unique_prefix_share": self.unique_prefix_share,
            "most_common_prefix": {
                "tokens": self.common_prefix_tokens,
                "prompts": self.common_prefix_prompts,
            },
            "hit_rate": self.hit_rate,
            "block_hit_rate": self.block_hit_rate,
            "theoretical_hit_rate": self.theoretical_hit_rate,
            "first_divergence": [
                {"position": pos, "prompts": n} for pos, n in self.first_divergence
            ],
            "matched": self.matched,
            "continuations": self.continuations,
            "new_prompts": self.new_prompts,
            "diffed": self.diffed,
            "points": [p.to_dict() for p in self.points],
            "findings": [f.to_dict() for f in self.findings],
        }


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
    tree = _RadixTree()
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
    observations: list[_Observation] = []
    new_prompts = 0
    deadline = None if time_budget_s is None else time.perf_counter() + time_budget_s
    for n, (i, position, owner) in enumerate(chosen):
        if deadline is not None and n and time.perf_counter() > deadline:
            chosen = chosen[:n]
            break
        a = prompts[i].tokens[: _prefix_length(prompts[i], prefix_tokens)]
        b = tree.sequence(owner)[: max(windows[owner], position + 1)] if owner >= 0 else ()
        found = _compare(a, b, position, decode)
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
    return _with_findings(report)


# -- classification ------------------------------------------------------------------

_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_WEEKDAYS = r"(?:mon|tue|wed|thu|fri|sat|sun)(?:day|sday|nesday|rsday|urday)?"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
_DATE_TIME = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}"  # ISO 8601 date
    r"|\d{1,2}[./]\d{1,2}[./]\d{2,4}"  # 07/01/2025, 07.01.2025
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"  # 10:31, 10:31:02
    r"|^1\d{9}(?:\d{3})?$"  # a Unix timestamp in seconds or milliseconds
    rf"|^{_MONTHS}$|^{_WEEKDAYS}$",
    re.I,
)
_MONTH_DATE = re.compile(
    rf"\b{_MONTHS}\.?\s+\d{{1,2}}\b|\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTHS}\b", re.I
)
_DATE_WORD = re.compile(
    r"\b(?:date|time|today|now|timestamp|updated|generated|day|year)\b(?: is)?\W{0,3}$", re.I
)
_VERSION = re.compile(r"^v?\d+(?:\.\d+){1,3}(?:[-+][0-9a-z.]+)?$", re.I)
_HEX_ID = re.compile(r"^(?=.*\d)(?=.*[a-f])[0-9a-f]{6,}$", re.I)
_MIXED_ID = re.compile(r"^(?=.*\d)(?=.*[a-z])[a-z0-9_\-]{5,}$", re.I)
_ID_CONTEXT = re.compile(
    r"\b(?:user|session|request|trace|tenant|customer|account|conversation|chat|thread|"
    r"client|org|id|uid|name)\b[\w ]{0,12}\W{0,3}$",
    re.I,
)
_NUMBER = re.compile(r"^[-+]?\d+(?:[.,]\d+)*%?$")
_FIELD_CHARS = frozenset("-_:.+/@#")


def classify(reference: str, variant: str, before: str = "", after: str = "") -> Kind:
    """What varies between `reference` and `variant` (the fields that differ), with the
    text around them as a hint."""
    fields = [f.strip(" \t\n.,;:()[]{}\"'") for f in (variant, reference)]
    fields = [f for f in fields if f]
    around = [f"{before[-12:]}{f}{after[:12]}" for f in (reference, variant)]
    if any(_UUID.search(f) for f in fields):
        return Kind.ID
    if any(_DATE_TIME.search(f) for f in fields) or any(_MONTH_DATE.search(t) for t in around):
        return Kind.DATE_TIME
    if _DATE_WORD.search(before[-40:]) and fields and all(_NUMBER.match(f) for f in fields):
        return Kind.DATE_TIME
    if any(_VERSION.match(f) for f in fields):
        return Kind.NUMBER
    if any(_HEX_ID.match(f) or _MIXED_ID.match(f) for f in fields):
        return Kind.ID
    if _ID_CONTEXT.search(before[-32:]):
        return Kind.ID
    if fields and all(_NUMBER.match(f) for f in fields):
        return Kind.NUMBER
    return Kind.OTHER


def reordered_blocks(reference: str, variant: str) -> bool:
    """True when the two texts share blocks (paragraphs, or lines) in another order."""
    by_paragraph = reference.count("\n\n") >= 2 and variant.count("\n\n") >= 2
    a, b = _blocks(reference, by_paragraph), _blocks(variant, by_paragraph)
    common = set(a) & set(b)
    if len(common) < 2 or len(common) < 0.5 * min(len(a), len(b)):
        return False
    return [x for x in a if x in common] != [x for x in b if x in common]


def _blocks(text: str, by_paragraph: bool) -> list[str]:
    out: dict[str, None] = {}  # ordered and with O(1) membership: linear in the text
    for part in text.split("\n\n" if by_paragraph else "\n"):
        block = part.strip()
        if len(block) >= 8:
            out.setdefault(block)
    return list(out)


# -- comparing two prompts -----------------------------------------------------------


@dataclass(frozen=True)
class _Observation:
    position: int
    kind: Kind
    first: bool
    reference: str
    variant: str
    before: str
    after: str


def _compare(
    a: tuple[int, ...], b: tuple[int, ...], position: int, decode: Decode
) -> list[_Observation]:
    """The differing regions of prompt `a` against the earlier prompt `b`, which share
    their first `position` tokens."""
    if not b:
        fa = _field(a, position, min(position + 1, len(a)), decode)
        return [_Observation(fa.start, Kind.NEW_PROMPT, True, "", fa.text, fa.before, fa.after)]
    if reordered_blocks(
        _from_line_start(b, position, decode), _from_line_start(a, position, decode)
    ):
        start = _line_start(a, position, decode)
        before = decode(a[max(0, start - _CONTEXT_TOKENS) : start])
        reference, variant = _first_line(b[start:], decode), _first_line(a[start:], decode)
        return [_Observation(start, Kind.REORDERED, True, reference, variant, before, "")]
    opcodes = _opcodes(a, b, position)
    equal = [(i1 + position, i2 - i1) for tag, i1, i2, _, _ in opcodes if tag == "equal"]
    out: list[_Observation] = []
    for k, (fa, fb) in enumerate(_differing_fields(a, b, opcodes, position, decode)):
        kind = classify(fb.text, fa.text, fa.before, fb.after)
        if k == 0 and not _realigned(a, b, fa, fb, equal, kind):
            out.append(
                _Observation(fa.start, Kind.NEW_PROMPT, True, fb.text, fa.text, fa.before, fb.after)
            )
            break  # the rest differs because the content does: nothing more to learn
        out.append(_Observation(fa.start, kind, k == 0, fb.text, fa.text, fa.before, fb.after))
    return out


def _opcodes(
    a: tuple[int, ...], b: tuple[int, ...], offset: int
) -> list[tuple[str, int, int, int, int]]:
    """difflib-style opcodes of a[offset:] against b[offset:] (indices relative to
    `offset`), found greedily: after each mismatch, the nearest place where both agree
    again for `_ANCHOR` tokens within `_LOOKAHEAD` tokens. Linear in the tokens, where
    difflib is quadratic on prompts that go on to different content (why not difflib)."""
    i = j = offset
    out: list[tuple[str, int, int, int, int]] = []
    while i < len(a) and j < len(b):
        k = 0
        while i + k < len(a) and j + k < len(b) and a[i + k] == b[j + k]:
            k += 1
        if k:
            out.append(("equal", i - offset, i + k - offset, j - offset, j + k - offset))
            i, j = i + k, j + k
            continue
        grams: dict[tuple[int, ...], int] = {}
        for dj in range(min(_LOOKAHEAD, len(b) - j - _ANCHOR + 1)):
            grams.setdefault(b[j + dj : j + dj + _ANCHOR], dj)
        best: tuple[int, int] | None = None
        for di in range(min(_LOOKAHEAD, len(a) - i - _ANCHOR + 1)):
            if best is not None and di >= sum(best):
                break
            found = grams.get(a[i + di : i + di + _ANCHOR])
            if found is not None and (best is None or di + found < sum(best)):
                best = (di, found)
        if best is None:
            break
        out.append(("replace", i - offset, i + best[0] - offset, j - offset, j + best[1] - offset))
        i, j = i + best[0], j + best[1]
    if i < len(a) or j < len(b):
        out.append(("replace", i - offset, len(a) - offset, j - offset, len(b) - offset))
    return out


def _realigned(
    a: tuple[int, ...],
    b: tuple[int, ...],
    fa: _Field,
    fb: _Field,
    equal: list[tuple[int, int]],
    kind: Kind,
) -> bool:
    """Whether the prompts agree again after their first differing field (a value that
    varies in an otherwise shared prefix), rather than going on to different content."""
    width = max(fa.end - fa.start, fb.end - fb.start)
    rest = max(len(a) - fa.end, len(b) - fb.end)
    same = sum(max(0, i + size - max(i, fa.end)) for i, size in equal)
    if kind is Kind.OTHER:  # plain text needs more evidence than a date or an ID
        return width <= 16 and same >= max(8, _REALIGN_SHARE * rest)
    return width <= 64 and (rest == 0 or same >= _REALIGN_SHARE * rest)


def _differing_fields(
    a: tuple[int, ...],
    b: tuple[int, ...],
    opcodes: Sequence[tuple[str, int, int, int, int]],
    offset: int,
    decode: Decode,
) -> list[tuple[_Field, _Field]]:
    """The regions where `a` and `b` differ, each widened to the fields (words, numbers,
    identifiers) it touches; regions that end up in the same field are merged."""
    out: list[tuple[_Field, _Field]] = []
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            continue
        a0, a1, b0, b1 = i1 + offset, i2 + offset, j1 + offset, j2 + offset
        if out:
            pa, pb = out[-1]
            if a0 - pa.end <= _MERGE_GAP and b0 - pb.end <= _MERGE_GAP:
                a0, b0 = pa.start, pb.start
                out.pop()
        if len(out) >= _MAX_FIELDS:
            break
        out.append((_field(a, a0, a1, decode), _field(b, b0, b1, decode)))
    return out


@dataclass(frozen=True)
class _Field:
    start: int  # token span of the field
    end: int
    before: str  # decoded text before it, the field, and after it
    text: str
    after: str


def _field(tokens: tuple[int, ...], start: int, end: int, decode: Decode) -> _Field:
    """The tokens [start, end) widened to the whole word, number or identifier they are
    part of, so `7` in `2025-01-07` is seen as the date it belongs to. Only the first
    `_FIELD_TOKENS` of a long region are decoded (longer ones are new content anyway)."""
    full_end, end = end, min(end, start + _FIELD_TOKENS)
    w0, w1 = max(0, start - _CONTEXT_TOKENS), min(len(tokens), end + _CONTEXT_TOKENS)
    # Character offset of each token in the decoded window (prefix decodes, so merged
    # multi-byte characters come out as they do in the whole text).
    offsets = [len(decode(tokens[w0:k])) for k in range(w0, w1 + 1)]
    text = decode(tokens[w0:w1])
    lo, hi = offsets[start - w0], offsets[end - w0]
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    while lo > 0 and _is_field_char(text[lo - 1]):
        lo -= 1
    while hi < len(text) and _is_field_char(text[hi]):
        hi += 1
    while hi > lo and text[hi - 1] in ".:":  # a sentence ends, not the field
        hi -= 1
    first = w0 + max(k for k, off in enumerate(offsets) if off <= lo)
    last = w0 + min((k for k, off in enumerate(offsets) if off >= hi), default=w1 - w0)
    first = min(first, start)  # never narrower than the differing tokens
    last = max(last, full_end)
    return _Field(first, last, text[:lo], text[lo:hi], text[hi:])


def _is_field_char(char: str) -> bool:
    return char.isalnum() or char in _FIELD_CHARS


def _from_line_start(tokens: tuple[int, ...], position: int, decode: Decode) -> str:
    head = decode(tokens[max(0, position - 48) : position])
    return head[head.rfind("\n") + 1 :] + decode(tokens[position:])


def _line_start(tokens: tuple[int, ...], position: int, decode: Decode) -> int:
    """The token holding the first character of the line that contains `position`
    (looking back at most 48 tokens)."""
    for k in range(position, max(0, position - 48), -1):
        piece = decode(tokens[k - 1 : k])
        if "\n" in piece:  # a token may hold the newline and the line's first characters
            return k if piece.endswith("\n") else k - 1
    return position


def _first_line(tokens: Sequence[int], decode: Decode) -> str:
    text = decode(tokens[:48]).strip("\n")
    return text.split("\n", 1)[0][:60]


def _one_line(text: str) -> str:
    return text.replace("\r", "").replace("\n", "⏎")


# -- aggregation ---------------------------------------------------------------------


def _points(
    observations: list[_Observation], limit: int, scale: float = 1.0
) -> list[DivergencePoint]:
    groups: dict[tuple[int, Kind], list[_Observation]] = {}
    for obs in observations:
        # Reordering is one problem however many blocks move: one point, where it starts.
        position = -1 if obs.kind is Kind.REORDERED else obs.position
        groups.setdefault((position, obs.kind), []).append(obs)
    kept: list[tuple[tuple[int, Kind], list[_Observation]]] = []
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


def _with_findings(report: DivergenceReport) -> DivergenceReport:
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


def _prefix_length(prompt: PromptTokens, window: int) -> int:
    end = prompt.static_end if prompt.static_end is not None else len(prompt.tokens) - 1
    return max(0, min(window, end, len(prompt.tokens)))


def _spread(items: list[tuple[int, int, int]], limit: int) -> list[tuple[int, int, int]]:
    if len(items) <= limit:
        return items
    step = len(items) / limit
    return [items[int(k * step)] for k in range(limit)]


class _RadixTree:
    """Token sequences in a compressed trie: for each new sequence, the longest prefix
    it shares with any sequence inserted before, and one such sequence. An edge is
    (owner, start, end, children): the owner's tokens [start, end)."""

    def __init__(self) -> None:
        self._sequences: list[tuple[int, ...]] = []
        self._root: dict[int, list[Any]] = {}
        self._ends: set[tuple[int, int]] = set()  # (length, hash) of every sequence

    @property
    def size(self) -> int:
        return len(self._sequences)

    def sequence(self, index: int) -> tuple[int, ...]:
        return self._sequences[index]

    def has_sequence(self, seq: tuple[int, ...], length: int) -> bool:
        """Whether a sequence equal to seq[:length] was inserted (a prompt ended there)."""
        return (length, hash(seq[:length])) in self._ends

    def match_and_insert(self, seq: tuple[int, ...]) -> tuple[int, int | None]:
        index = len(self._sequences)
        self._sequences.append(seq)
        self._ends.add((len(seq), hash(seq)))
        children, pos, owner = self._root, 0, None
        while pos < len(seq):
            edge = children.get(seq[pos])
            if edge is None:
                children[seq[pos]] = [index, pos, len(seq), {}]
                return pos, owner
            edge_owner, start, end, kids = edge
            label = self._sequences[edge_owner]
            k = _shared(label, start, end, seq, pos)
            owner = edge_owner
            if k == end - start:
                pos += k
                children = kids
                continue
            # Split the edge where the new sequence leaves it.
            edge[2], edge[3] = start + k, {label[start + k]: [edge_owner, start + k, end, kids]}
            pos += k
            if pos < len(seq):
                edge[3][seq[pos]] = [index, pos, len(seq), {}]
            return pos, owner
        return pos, owner


def _shared(label: tuple[int, ...], start: int, end: int, seq: tuple[int, ...], pos: int) -> int:
    """How many tokens of label[start:end] match seq from pos."""
    n = min(end - start, len(seq) - pos)
    if label[start : start + n] == seq[pos : pos + n]:
        return n
    return next(i for i in range(n) if label[start + i] != seq[pos + i])
