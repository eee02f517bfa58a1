"""A server's token-weighted prefix-cache counters, as bench-serve reads them from a
Prometheus exposition: warmfleet's names or vLLM's."""

from __future__ import annotations

from dataclasses import dataclass

_PROMETHEUS_COUNTERS = (
    ("warmfleet_prefix_cache_hit_tokens", "warmfleet_prefix_cache_queried_tokens"),
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
)


@dataclass(frozen=True)
class Counters:
    hit_tokens: float
    queried_tokens: float


def parse_prometheus_counters(text: str) -> Counters | None:
    """Prefix-cache hit and lookup token counters (summed over labels) from a
    Prometheus exposition, warmfleet's or vLLM's names."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")
                totals[name] = totals.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError):
        return None
    for hits, queries in _PROMETHEUS_COUNTERS:
        if hits in totals and queries in totals:
            return Counters(totals[hits], totals[queries])
    return None
