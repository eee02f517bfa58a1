"""Durations as people write them: `90` or `90s` (seconds), `15m`, `12h`, `7d`; what
`warmfleet router --learn-ttl` and a WarmPromptSet's `spec.learn.ttl` take. Plain
Python."""

from __future__ import annotations

import re

DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)?[smhd]?$"
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds; ValueError saying what is expected."""
    found = re.fullmatch(DURATION_PATTERN, text.strip())
    if found is None:
        raise ValueError(f"{text[:32]!r} is not a duration: a number and s, m, h or d (7d)")
    value = text.strip()
    unit = value[-1] if value[-1] in "smhd" else ""
    return float(value[: len(value) - len(unit)]) * _UNITS[unit]
