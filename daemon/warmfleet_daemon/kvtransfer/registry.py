"""The cache tiers beyond RAM, one line each, in the order a prompt's match continues
through them (fastest first, as `warmfleet_common.tiers.TIERS` names them).

A new tier is a module with a class that implements `engine.tiers.CacheTier` and a
`build(context)` that returns it (or None when its settings leave it off), its name in
`warmfleet_common.tiers.Tier`, and its line here; `KVTransfer` builds the tiers and the
assembly attaches them to the engine.
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
