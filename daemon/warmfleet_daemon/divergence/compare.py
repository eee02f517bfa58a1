"""Two prompts that share a prefix, diffed into the fields that vary between them.
Linear in their tokens: the daemon runs it live."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmfleet_daemon.divergence.classify import classify, reordered_blocks
from warmfleet_daemon.divergence.report import Kind

Decode = Callable[[Sequence[int]], str]

_CONTEXT_TOKENS = 12  # decoded on each side of a differing region
_MERGE_GAP = 3  # differing regions this close (in tokens) are one varying field
_REALIGN_SHARE = 0.5  # of the tokens after a region that must match again
# Bounds that keep one comparison linear in its tokens (the daemon runs this live):
_FIELD_TOKENS = 96  # a differing region is decoded up to this many tokens
_MAX_FIELDS = 32  # differing fields looked at per comparison
_LOOKAHEAD = 64  # how far the diff looks for where two prompts agree again ...
_ANCHOR = 4  # ... as this many equal tokens in a row
_FIELD_CHARS = frozenset("-_:.+/@#")  # characters inside a field (dates, ids)


@dataclass(frozen=True)
class Observation:
    position: int
    kind: Kind
    first: bool
    reference: str
    variant: str
    before: str
    after: str


def compare(
    a: tuple[int, ...], b: tuple[int, ...], position: int, decode: Decode
) -> list[Observation]:
    """The differing regions of prompt `a` against the earlier prompt `b`, which share
    their first `position` tokens."""
    if not b:
        fa = _field(a, position, min(position + 1, len(a)), decode)
        return [Observation(fa.start, Kind.NEW_PROMPT, True, "", fa.text, fa.before, fa.after)]
    if reordered_blocks(
        _from_line_start(b, position, decode), _from_line_start(a, position, decode)
    ):
        start = _line_start(a, position, decode)
        before = decode(a[max(0, start - _CONTEXT_TOKENS) : start])
        reference, variant = _first_line(b[start:], decode), _first_line(a[start:], decode)
        return [Observation(start, Kind.REORDERED, True, reference, variant, before, "")]
    opcodes = _opcodes(a, b, position)
    equal = [(i1 + position, i2 - i1) for tag, i1, i2, _, _ in opcodes if tag == "equal"]
    out: list[Observation] = []
    for k, (fa, fb) in enumerate(_differing_fields(a, b, opcodes, position, decode)):
        kind = classify(fb.text, fa.text, fa.before, fb.after)
        if k == 0 and not _realigned(a, b, fa, fb, equal, kind):
            out.append(
                Observation(fa.start, Kind.NEW_PROMPT, True, fb.text, fa.text, fa.before, fb.after)
            )
            break  # the rest differs because the content does: nothing more to learn
        out.append(Observation(fa.start, kind, k == 0, fb.text, fa.text, fa.before, fb.after))
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
