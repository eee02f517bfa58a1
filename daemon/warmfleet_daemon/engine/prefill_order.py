"""Which waiting prompt gets the next prefill chunk: shortest remaining first, aged.

Shortest-remaining-first gives short prompts their first token quickly (no head-of-line
blocking behind a long prompt), but under sustained load it starves long prompts:
there is always a shorter one. So a prompt's priority grows with its wait: every
`AGING_PICKS` chunks that go to others count as one block less for it to prefill.
Prompts of equal age keep shortest-first order; the oldest prompt, of L tokens, is
served after about L / block_size * AGING_PICKS picks at most, however many shorter
ones keep arriving, and its age is kept once it is served, so it then runs to its first
token (prompts arriving meanwhile wait for its remaining chunks: the price of the bound).

Age is counted in picks (chunks prefilled for others), not seconds: it measures the
work done ahead of a prompt, and keeps the order exact and testable.

Between tenants (a daemon with client keys), that order applies within each tenant: the
next chunk goes to the tenant served longest ago (`next_tenant`), so a tenant's burst of
long prompts, however aged, takes turns chunk by chunk with another tenant's prompt
instead of running ahead of it. One tenant (an open daemon) orders as above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# 16, not 4: under overload, 4 made short prompts' median TTFT 13x that without aging,
# 16 makes it 4x and still cuts the long ones' worst wait to 0.63x (bench/prefill_fairness.py,
# docs/PERFORMANCE.md). DaemonSettings repeats it (settings sit below the engine).
AGING_PICKS = 16


@dataclass(frozen=True)
class Candidate:
    remaining: int  # prompt tokens still to prefill
    waited: int  # picks that went to other prompts since it was admitted
    arrival: int  # submission order: the tie-breaker


def priority(c: Candidate, block_size: int, aging_picks: int = AGING_PICKS) -> tuple[float, int]:
    """Lower is served first. `aging_picks` 0: no aging (plain shortest-first)."""
    age = c.waited * block_size / aging_picks if aging_picks else 0.0
    return (c.remaining - age, c.arrival)


def pick(candidates: Sequence[Candidate], block_size: int, aging_picks: int = AGING_PICKS) -> int:
    """The index of the candidate to prefill next."""
    return min(
        range(len(candidates)), key=lambda i: priority(candidates[i], block_size, aging_picks)
    )


def next_tenant(present: Iterable[str | None], last_served: Mapping[str | None, int]) -> str | None:
    """Of the tenants with a prompt ready (`present`, in the arrival order of their
    earliest), the one whose last chunk was longest ago (`last_served`: the pick number;
    a tenant not in it was not served since it arrived, and goes first)."""
    return min(present, key=lambda t: last_served.get(t, -1))
