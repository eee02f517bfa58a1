"""The wire models of the daemon's routes that other components read, beside
`contract` (the operator's push: `PUT /v1/warm-sets/...` and `GET /v1/warm-sets`, whose
`WarmSetList` the router reads too) and `cache_layout` (`GET /v1/cache/layout`:
`CacheLayout`). The daemon produces these; the router and the operator parse what they
receive with them, so a payload of the wrong shape is one `ValidationError` naming the
field, never a `KeyError` deep in a background task.

- `GET /v1/cache/events` (admin, newline-delimited JSON): one `CacheEventLine` per line.
  `hello` opens the stream (the daemon's event `epoch`, a fresh one per daemon process,
  and its current `seq`); `stored`, `evicted` and `cleared` are cache changes numbered
  1, 2, 3... within an epoch; `heartbeat` repeats the last number sent; `reset` ends the
  stream when the events asked for are gone: resync from a snapshot. A `stored` block
  may say where its KV came from (`source`: prefill, peer, disk, snapshot).
- `GET /v1/cache/snapshot` (admin): `CacheSnapshot`, every stored block and the event
  number it is current at.
- `POST /v1/cache/pull` (admin): `CachePull` in, `CachePullResult` out (a drain
  handoff: copy a chain of blocks from a peer daemon).
- `GET /v1/models` (any OpenAI server's, the daemon's too): `ModelList`, the part a
  router reads (ids, and vLLM's and the daemon's `max_model_len`).
- `GET /v1/status`: `DaemonStatus`, typed in the parts other components read (the model
  and its aliases and context length, the cache figures, the warm sets); the engine
  figures and the diagnostics summary are documents for people and stay open.

Models ignore fields they do not know (a newer daemon may add some) and never coerce:
a sequence number is an integer, not `1.5`, `true` or `Infinity`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from warmfleet_common.contract import WarmSetStatus
from warmfleet_common.grants import GRANT_PATTERN
from warmfleet_common.tiers import MAX_TIERS, Tier, TierCosts

# A block key (16 bytes, warmfleet_common.chunking) in lowercase hex.
BlockHex = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
Seq = Annotated[int, Field(ge=0, lt=2**63, strict=True)]
Epoch = Annotated[str, Field(min_length=1, max_length=64)]
Tokens = Annotated[int, Field(ge=0, strict=True)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# -- GET /v1/cache/events -----------------------------------------------------------


class EventsHello(_Wire):
    """The first line: this daemon's epoch and the last event number it has assigned."""

    type: Literal["hello"] = "hello"
    epoch: Epoch
    seq: Seq


class EventsReset(_Wire):
    """The last line when the events asked for cannot be replayed (`epoch`: another
    daemon process; `gap`: no longer buffered; `overflow`: the subscriber fell behind)."""

    type: Literal["reset"] = "reset"
    reason: str = Field(max_length=64)


class EventsHeartbeat(_Wire):
    """Nothing happened to the cache; `seq` is the last event number sent on this stream.
    A daemon also says here what a router would otherwise poll for: whether it serves or
    drains (a heartbeat goes out at once when it starts draining), and a digest of its
    warm sets that changes whenever they do (None from older daemons)."""

    type: Literal["heartbeat"] = "heartbeat"
    seq: Seq
    state: Literal["serving", "draining"] | None = None
    warm_sets: str | None = Field(None, max_length=64)


class _BlockEvent(_Wire):
    seq: Seq
    key: BlockHex
    parent: BlockHex | None = None  # None: the first block of a prompt
    start: Tokens | None = None  # token offsets of the block within its prompt
    end: Tokens | None = None
    logits: bool = False  # the block holds its chunk's last-position logits
    # The tier the block entered (stored) or left (evicted): a block evicted from RAM may
    # still be on disk (its own "stored" in "disk" said so).
    tier: Tier = "ram"


# Where a stored block's KV came from, as the daemon knew it at store time: "prefill"
# (computed there), "peer" (copied from another daemon: a spill, a warm-up's peer, a
# drain handoff), "disk" (read back from its disk tier), "snapshot" (a warm snapshot).
# Informational: a reader keeps a value it does not know (None: an older daemon, or a
# block the disk tier stored, whose `tier` says it).
Source = Annotated[str, Field(max_length=64)]


class BlockStored(_BlockEvent):
    type: Literal["stored"] = "stored"
    source: Source | None = None


class BlockEvicted(_BlockEvent):
    type: Literal["evicted"] = "evicted"


class CacheCleared(_Wire):
    type: Literal["cleared"] = "cleared"
    seq: Seq


CacheChange = BlockStored | BlockEvicted | CacheCleared
CacheEventLine = Annotated[
    EventsHello | EventsReset | EventsHeartbeat | BlockStored | BlockEvicted | CacheCleared,
    Field(discriminator="type"),
]
_EVENT_LINE: TypeAdapter[CacheEventLine] = TypeAdapter(CacheEventLine)


def parse_event_line(line: str | bytes) -> CacheEventLine:
    """One line of `/v1/cache/events` (raises pydantic's ValidationError)."""
    return _EVENT_LINE.validate_json(line)


def event_line(event: CacheEventLine) -> bytes:
    """One line as the daemon sends it."""
    return event.model_dump_json().encode() + b"\n"


# -- GET /v1/cache/snapshot -----------------------------------------------------------


class SnapshotBlock(_Wire):
    key: BlockHex
    parent: BlockHex | None = None
    start: Tokens | None = None
    end: Tokens | None = None
    logits: bool = False
    pinned: bool = False
    tier: Tier = "ram"  # the fastest tier that holds it (RAM blocks are often on disk too)
    # Every tier that holds it, fastest first: when RAM evicts it, it is still a block of
    # the next. Empty from daemons older than this field (then `tier`, and `on_disk`).
    tiers: list[Tier] = Field(default_factory=list, max_length=MAX_TIERS)
    # The disk tier holds it too, as `tiers` says: kept for routers older than `tiers`.
    on_disk: bool = False
    source: Source | None = None  # where a RAM block's KV came from (as in `stored`)


class CacheSnapshot(_Wire):
    """Every stored block (parents before children); `seq` is the event number the list
    is current at, so `/v1/cache/events?epoch=E&after=seq` continues from it."""

    epoch: Epoch
    seq: Seq
    fingerprint: str | None = Field(None, max_length=128, description="of the cache layout")
    blocks: list[SnapshotBlock]


# -- GET /v1/models ------------------------------------------------------------------


class ModelCard(_Wire):
    id: str = Field(min_length=1, max_length=1024)
    max_model_len: Tokens | None = None  # vLLM's and the daemon's: the context length


class ModelList(_Wire):
    data: list[ModelCard]


# -- GET /v1/status -------------------------------------------------------------------


class StatusModel(_Wire):
    model_config = ConfigDict(extra="allow", frozen=True)

    id: str | None = None
    # Every name the chat routes accept for it (the router matches requests by them).
    aliases: list[str] = Field(default_factory=list)
    source: str | None = None
    context_length: Tokens | None = None
    device: str | None = None


class StatusCache(_Wire):
    model_config = ConfigDict(extra="allow", frozen=True)

    bytes: Tokens = 0
    budget_bytes: Tokens = 0
    hit_rate: float = Field(0.0, ge=0.0, le=1.0)


class WarmSetCounts(_Wire):
    sets: Tokens = 0
    prompts: Tokens = 0
    warm: Tokens = 0
    failed: Tokens = 0


class StatusSim(_Wire):
    """A simulated daemon's time (`--engine sim`), in the profiled Mac's seconds: what its
    engine charged, and how late its busy steps ran beyond that because the machine
    running the simulation could not keep up. Every time the daemon reports is inflated
    by up to `behind_share`."""

    speed: float = Field(gt=0, description="--sim-speed")
    spent_s: float = Field(ge=0, description="simulated seconds charged")
    behind_s: float = Field(ge=0, description="simulated seconds run late beyond the charge")
    behind_share: float = Field(ge=0, description="behind_s / spent_s (0 before any)")


class DaemonStatus(_Wire):
    """`GET /v1/status`. Without the admin token (when the daemon has one) `warm_sets`
    and `kv_transfer` are absent: warm sets are `warm_set_counts` only."""

    model_config = ConfigDict(extra="allow", frozen=True)

    version: str | None = None
    instance_id: str | None = Field(None, description="a fresh one per daemon process")
    state: Literal["serving", "draining"] | None = Field(
        None, description="draining: stopping after a SIGTERM (--drain-seconds), still serving"
    )
    started_at: str | None = None
    model: StatusModel | None = None
    engine: dict[str, Any] | None = None
    next_turn: dict[str, Any] | None = Field(
        None, description="conversations' next prefixes, prefilled at idle priority"
    )
    cache: StatusCache | None = None
    disk_tier: dict[str, Any] | None = Field(
        None, description='the disk tier: null without one; state "off" with its error'
    )
    tier_costs: TierCosts | None = Field(
        None, description="what a prompt token costs here per tier, measured at start"
    )
    tiers: list[Tier] | None = Field(
        None,
        max_length=MAX_TIERS,
        description="the cache tiers it serves from, fastest first: RAM, then those its "
        "tier registry built (any tier name, not only the built-in ones)",
    )
    warm_sets: list[WarmSetStatus] | None = None
    kv_transfer: dict[str, Any] | None = None
    warm_set_counts: WarmSetCounts | None = None
    diagnostics: dict[str, Any] | None = None
    sim: StatusSim | None = Field(None, description="a simulated daemon's time; null on others")


# -- POST /v1/cache/pull (admin) ------------------------------------------------------


class PullBlock(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: BlockHex
    start: Tokens
    end: Tokens


class CachePull(BaseModel):
    """A drain handoff: the router asks the daemon a session will move to for that
    session's chain of blocks from the daemon that is leaving (`peer`). Blocks in chain
    order, the first a chain root; what the daemon holds already is not copied."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peer: str = Field(max_length=2048, description="the peer's base URL (http or https)")
    peer_grant: str | None = Field(
        None,
        pattern=GRANT_PATTERN,
        description="a grant to read the peer's blocks (`warmfleet_common.grants`), "
        "presented instead of the daemon's own admin token",
    )
    blocks: list[PullBlock] = Field(min_length=1, max_length=4096)
    deadline_s: float = Field(30.0, gt=0, le=600, description="then the copy stops")


class CachePullResult(_Wire):
    present_blocks: Tokens  # held already (not copied)
    copied_blocks: Tokens
    copied_tokens: Tokens
    copied_bytes: Tokens
    seconds: float
    complete: bool  # every block of the chain is held now


# A chat or completion stream the router forwards ends, when its client did not ask for
# usage, with the usage as an SSE comment (clients skip comments): the router counts a
# tenant's tokens from it. The router asks for it with this header.
STREAM_USAGE_HEADER = "x-warmfleet-stream-usage"
STREAM_USAGE_COMMENT = b": warmfleet-usage "
