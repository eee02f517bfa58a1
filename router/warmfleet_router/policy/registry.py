"""The routing policies, by name: one registry that `warmfleet router --policy` (and
`warmfleet up`'s) takes its choices from. Each entry composes the same pieces (filters,
scorers, a picker: `compose.Policy`) for a bounded-load epsilon; a new policy is one
entry here (and its name in `PolicyName`). This table is `policy_table()`, checked
against the registry by a test:

| policy | filters | scorers (ties go to the next) | picker |
|---|---|---|---|
| `prefix` | tenant share, bounded load, session pin | time saved, load, faster tier, request hash | best |
| `round-robin` |  | name order from the turn | best |
| `least-load` |  | load, request hash | best |
| `session` | tenant share, bounded load | session-key hash, load, request hash | ring |

Tenant share keeps a tenant holding at least its share of the fleet (requests in flight
against backends per active tenant) on the backends the fewest other tenants are using
(`warmfleet_router.tenant_share`; only with client keys). Time saved weighs each
backend's predicted cached tokens by tier with the costs it
measured (RAM beats disk beats a miss; savings within a fifth of each other are equal, so
load decides, then the larger RAM share); without any costs it is cached tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal

from warmfleet_router.policy.compose import Policy
from warmfleet_router.policy.filters import BoundedLoad, SessionPin, TenantShare
from warmfleet_router.policy.model import Candidate, Decision, RoutingRequest
from warmfleet_router.policy.pickers import RingPicker
from warmfleet_router.policy.scorers import (
    AffinityHash,
    FasterTier,
    LeastLoad,
    RoundRobin,
    TieHash,
    TimeSaved,
)

# The registry's names as a type (RouterOptions.policy); a test checks they match.
PolicyName = Literal["prefix", "round-robin", "least-load", "session"]
DEFAULT_EPSILON = 0.25

# Name -> the policy for a bounded-load epsilon (policies without that filter ignore it).
REGISTRY: Final[Mapping[PolicyName, Callable[[float], Policy]]] = {
    "prefix": lambda epsilon: Policy(
        "prefix",
        (TimeSaved(), LeastLoad(), FasterTier(), TieHash()),
        (TenantShare(), BoundedLoad(epsilon), SessionPin()),
    ),
    "round-robin": lambda epsilon: Policy("round-robin", (RoundRobin(),)),
    "least-load": lambda epsilon: Policy("least-load", (LeastLoad(), TieHash())),
    "session": lambda epsilon: Policy(
        "session",
        (AffinityHash(), LeastLoad(), TieHash()),
        (TenantShare(), BoundedLoad(epsilon)),
        RingPicker(),
    ),
}
POLICIES: Final[tuple[PolicyName, ...]] = tuple(REGISTRY)


def build(name: PolicyName, epsilon: float = DEFAULT_EPSILON) -> Policy:
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}")
    return factory(epsilon)


def policy_table() -> str:
    """The registry as the module docstring's Markdown table."""
    rows = [
        "| policy | filters | scorers (ties go to the next) | picker |",
        "|---|---|---|---|",
    ]
    for name in POLICIES:
        pieces = build(name).describe()
        cells = (f"`{name}`", ", ".join(pieces.filters), ", ".join(pieces.scorers), pieces.picker)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def choose(
    policy: PolicyName,
    candidates: Sequence[Candidate],
    *,
    epsilon: float = DEFAULT_EPSILON,
    tie_key: bytes = b"",
    affinity: str | None = None,
    session_backend: str | None = None,
    turn: int = 0,
) -> Decision:
    """Pick a backend among `candidates` (healthy, ready ones) with the named policy.
    `session_backend` is where the affinity key's session is; `turn` counts requests
    (round-robin)."""
    request = RoutingRequest(
        tie_key=tie_key, affinity=affinity, session_backend=session_backend, turn=turn
    )
    return build(policy, epsilon).decide(candidates, request)
