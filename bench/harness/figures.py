"""How the benchmarks print a set of measurements."""

from __future__ import annotations

import statistics


def spread(xs: list[float]) -> str:
    """The median, the range and the count."""
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}, n={len(xs)})"
