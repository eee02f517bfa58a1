"""Where a prefix-cache block is held, named the same way by every component.

A block lives in a daemon's RAM, on its disk tier, or on a peer daemon it can be copied
from (a spill). `TIERS` lists them fastest first: the engine continues a prompt's match
in that order, the router's index takes a block's fastest tier. Everything counted or
priced per tier is a table keyed by these names, read and written the same way by the
engine, the wire, every API's usage, the router's index and its scorers:

- `TierTokens`: prompt tokens per tier (a request's cached tokens, a prediction);
- `TierCosts`: what one token costs a daemon per tier, measured at start.

A new tier is its name here (the daemon's tier registry names the module that holds it);
nothing else lists the tiers. Plain Python and pydantic: the router imports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, get_args

from pydantic import BaseModel, Field, model_validator

Tier = Literal["ram", "disk", "peer"]
TIERS: Final[tuple[Tier, ...]] = get_args(Tier)  # fastest first
FASTEST: Final[Tier] = TIERS[0]


class TierTokens(Mapping[Tier, int]):
    """Tokens per tier: every tier is a key (those not given hold 0), in `TIERS` order.
    Immutable and compared by content, so it sits in frozen dataclasses and tests
    compare it with `==`."""

    __slots__ = ("_counts",)

    def __init__(self, counts: Mapping[Tier, int] | None = None, /, **by_name: int) -> None:
        given: dict[str, int] = {t: n for t, n in (counts or {}).items()}
        given.update(by_name)
        unknown = set(given) - set(TIERS)
        if unknown:
            raise ValueError(f"unknown cache tier(s): {', '.join(sorted(unknown))}")
        self._counts: tuple[int, ...] = tuple(int(given.get(t, 0)) for t in TIERS)

    def __getitem__(self, tier: Tier) -> int:
        try:
            return self._counts[TIERS.index(tier)]
        except ValueError:
            raise KeyError(tier) from None

    def __iter__(self) -> Iterator[Tier]:
        return iter(TIERS)

    def __len__(self) -> int:
        return len(TIERS)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TierTokens):
            return self._counts == other._counts
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._counts)

    def __repr__(self) -> str:
        return f"TierTokens({', '.join(f'{t}={n}' for t, n in self.items())})"

    @property
    def total(self) -> int:
        return sum(self._counts)

    def plus(self, tier: Tier, tokens: int) -> TierTokens:
        return TierTokens({**self, tier: self[tier] + tokens})

    def as_dict(self) -> dict[Tier, int]:
        """Every tier's count: the shape of `usage.cached_tokens_by_tier` on the wire."""
        return dict(self)

    @classmethod
    def parse(cls, document: object, total: int | None = None) -> TierTokens | None:
        """A `cached_tokens_by_tier` object another server sent: None unless it is an
        object of known tiers to non-negative integers (tiers left out hold 0) that add
        up to `total` when given. A reader keeps what it cannot trust out of its counts."""
        if not isinstance(document, Mapping) or not document:
            return None
        counts: dict[Tier, int] = {}
        for tier in TIERS:
            value = document.get(tier, 0)
            if type(value) is not int or value < 0:
                return None
            counts[tier] = value
        if set(document) - set(TIERS):
            return None
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
        description="taking its cached KV from each tier into a sequence"
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
