"""What varies where two prompts differ: a date or time, an ID, a number or version,
the same blocks in another order, or other text."""

from __future__ import annotations

import re

from warmfleet_daemon.divergence.report import Kind

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
