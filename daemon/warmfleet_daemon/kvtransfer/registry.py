"""The cache tiers beyond RAM, one line each, in the order a prompt's match continues
through them (fastest first). This registry is the authority for which tiers a daemon
has: the other components know the built-in ones (`warmfleet_common.tiers.TIERS`) by
name and take any other well-formed name (`warmfleet_common.tiers.Tier`) as one more
tier beyond RAM.

A new tier is a module with a class that implements `engine.tiers.CacheTier` (its
`name`, the key here, matching `warmfleet_common.tiers.TIER_PATTERN`) and a
`build(context)` that returns it (or None when its settings leave it off), and its line
here; `KVTransfer` builds the tiers and the assembly attaches them to the engine, whose
events, snapshot, status and usage then say its name.
"""

from __future__ import annotations

from collections.abc import Callable

from warmfleet_common.tiers import Tier
from warmfleet_daemon.engine.tiers import CacheTier
from warmfleet_daemon.kvtransfer import disk_tier, spill
from warmfleet_daemon.kvtransfer.context import TierContext

TierFactory = Callable[[TierContext], CacheTier | None]

TIER_REGISTRY: dict[Tier, TierFactory] = {
    "disk": disk_tier.build,
    "peer": spill.build,
}


def build_tiers(context: TierContext) -> list[CacheTier]:
    """The tiers beyond RAM that the settings turn on, fastest first."""
    built = (factory(context) for factory in TIER_REGISTRY.values())
    return [tier for tier in built if tier is not None]
