"""Where a prefix-cache block is held, named the same way by every component.

A block lives in a daemon's RAM, on its disk tier, or on a peer daemon it can be copied
from (a spill): the built-in tiers, `TIERS`, fastest first. The set is open: a daemon's
tier registry (`warmfleet_daemon.kvtransfer.registry`) is the authority for which tiers
it has and in what order a prompt's match runs through them, and may name tiers no
other component has heard of. On the wire a tier is a name (`Tier`: a bounded pattern,
`TIER_PATTERN`), never a closed list, so a new tier's name reaches the cache events,
the snapshot, the status and every API's usage unchanged. Everything counted or priced
per tier is a table keyed by these names, read and written the same way by the engine,
the wire, every API's usage, the router's index and its scorers:

- `TierTokens`: prompt tokens per tier (a request's cached tokens, a prediction);
- `TierCosts`: what one token costs a daemon per tier, measured at start.

A consumer that gives the built-in tiers a meaning of their own treats a tier it does
not know as one more tier beyond RAM: slower than RAM, and priced as saving nothing
unless its daemon priced it. One that keeps a series per tier (a metric's label) names
the built-in tiers and counts every other one as `OTHER_TIER`, so a peer cannot grow
its series. Plain Python and pydantic: the router imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Final

from pydantic import BaseModel, Field, StringConstraints, model_validator

TIER_PATTERN: Final = r"^[a-z][a-z0-9-]{0,31}$"
_TIER_NAME: Final = re.compile(TIER_PATTERN)
# A tier's name: validated as a name, never against a list (see the module's docstring).
Tier = Annotated[str, StringConstraints(pattern=TIER_PATTERN)]
TIERS: Final[tuple[Tier, ...]] = ("ram", "disk", "peer")  # the built-in ones, fastest first
FASTEST: Final[Tier] = TIERS[0]
MAX_TIERS: Final = 16  # the most tiers any table of them on the wire may name
OTHER_TIER: Final = "other"  # a metric's label for every tier not in TIERS


def is_tier(name: object) -> bool:
    """Whether `name` is a well-formed tier name (whether or not anyone has that tier)."""
    return isinstance(name, str) and _TIER_NAME.fullmatch(name) is not None


def tier_label(tier: str) -> str:
    """A metric's label for `tier`: its name when built in, else `OTHER_TIER` (at most
    len(TIERS) + 1 values, whatever names another server sends)."""
    return tier if tier in TIERS else OTHER_TIER


class TierTokens(Mapping[Tier, int]):
    """Tokens per tier: every built-in tier is a key (those not given hold 0), in `TIERS`
    order, then each other tier given a non-zero count, in the order given. Any tier not
    counted reads as 0 (`tokens["nvme"]`), though only counted ones are keys. Immutable
    and compared by content, so it sits in frozen dataclasses and tests compare it with
    `==`."""

    __slots__ = ("_counts", "_hash")

    def __init__(self, counts: Mapping[Tier, int] | None = None, /, **by_name: int) -> None:
        given: dict[str, int] = {t: n for t, n in (counts or {}).items()}
        given.update(by_name)
        bad = [t for t in given if not is_tier(t)]
        if bad:
            raise ValueError(f"not a cache tier name: {', '.join(sorted(map(repr, bad)))}")
        self._counts: dict[str, int] = {t: int(given.get(t, 0)) for t in TIERS}
        self._counts.update((t, int(n)) for t, n in given.items() if t not in TIERS and n)
        self._hash = hash(frozenset(self._counts.items()))

    def __getitem__(self, tier: Tier) -> int:
        found = self._counts.get(tier)
        if found is not None:
            return found
        if is_tier(tier):
            return 0  # a tier that served none of them
        raise KeyError(tier)

    def __contains__(self, tier: object) -> bool:
        return tier in self._counts

    def __iter__(self) -> Iterator[Tier]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TierTokens):
            return self._counts == other._counts
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"TierTokens({', '.join(f'{t}={n}' for t, n in self.items())})"

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def plus(self, tier: Tier, tokens: int) -> TierTokens:
        return TierTokens({**self._counts, tier: self[tier] + tokens})

    def as_dict(self) -> dict[Tier, int]:
        """Every counted tier: the shape of `usage.cached_tokens_by_tier` on the wire."""
        return dict(self._counts)

    @classmethod
    def parse(cls, document: object, total: int | None = None) -> TierTokens | None:
        """A `cached_tokens_by_tier` object another server sent: None unless it is an
        object of at most `MAX_TIERS` tier names to non-negative integers (tiers left
        out hold 0) that add up to `total` when given. A reader keeps what it cannot
        trust out of its counts; a tier it does not know is one more tier beyond RAM."""
        if not isinstance(document, Mapping) or not document or len(document) > MAX_TIERS:
            return None
        counts: dict[str, int] = {}
        for tier, value in document.items():
            if not is_tier(tier) or type(value) is not int or value < 0:
                return None
            counts[tier] = value
        tokens = cls(counts)
        return tokens if total is None or tokens.total == total else None


NO_TOKENS: Final = TierTokens()


class TierCosts(BaseModel):
    """What a prompt token costs a daemon, measured at start on its own hardware: its
    prefill, and taking it from each tier that holds it into a sequence (RAM: a restore;
    disk: a read then a restore). A tier left out of `hit_us_per_token` is not priced
    (the daemon has none, or its cost depends on more than the daemon, as a peer's
    link does): a hit there is counted as saving nothing."""

    prefill_us_per_token: float = Field(
        ge=0, description="computing its KV in a prefill chunk of block_size tokens"
    )
    hit_us_per_token: dict[Tier, float] = Field(
        max_length=MAX_TIERS, description="taking its cached KV from each tier into a sequence"
    )
    kv_bytes_per_token: int = Field(
        ge=1, description="bytes of KV per token (what a disk read or a peer copy moves)"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_older_daemons(cls, data: Any) -> Any:
        """Daemons before the tier table sent one field per tier."""
        if isinstance(data, dict) and "hit_us_per_token" not in data:
            ram = data.get("ram_restore_us_per_token")
            disk = data.get("disk_read_us_per_token")
            if isinstance(ram, int | float) and not isinstance(ram, bool):
                table: dict[str, Any] = {"ram": ram}
                if isinstance(disk, int | float) and not isinstance(disk, bool):
                    table["disk"] = disk + ram
                rest = {
                    k: v
                    for k, v in data.items()
                    if k not in ("ram_restore_us_per_token", "disk_read_us_per_token")
                }
                return {**rest, "hit_us_per_token": table}
        return data

    @model_validator(mode="after")
    def _non_negative(self) -> TierCosts:
        for tier, cost in self.hit_us_per_token.items():
            if not cost >= 0:
                raise ValueError(f"hit_us_per_token.{tier} must be >= 0")
        if FASTEST not in self.hit_us_per_token:
            raise ValueError(f"hit_us_per_token must price {FASTEST!r}")
        return self

    def saving_share(self, tier: Tier) -> float:
        """The share of a token's prefill a hit in `tier` saves (0 where not priced)."""
        cost = self.hit_us_per_token.get(tier)
        if cost is None:
            return 0.0
        return 1.0 - cost / max(self.prefill_us_per_token, 1e-9)  # never divide by zero
