"""What the router knows about one backend (plain data; the sync tasks keep it current)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from warmfleet_common.tiers import TierCosts

Health = Literal["unknown", "ready", "unready", "draining", "down"]
# What admission and keying read of a backend: setting one bumps Backend.revision, so a
# view computed from them (`shortlist.FleetView`) is rebuilt only when one changes.
_WATCHED = frozenset(
    {"spec", "health", "models", "fingerprint", "leaving", "context_length", "shared_tokens"}
)
_UNSET = object()


@dataclass(frozen=True)
class BackendSpec:
    """A backend as a source declares it: `--backend URL`, a WarmNode in a folder or the
    cluster."""

    name: str
    url: str
    token: str | None = None  # for its admin routes (status, warm sets, cache events)
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class Backend:
    spec: BackendSpec
    health: Health = "unknown"
    health_detail: str = ""
    in_flight: int = 0
    # Cache events: "following" (precise), "resyncing", "history" (no events: estimates).
    index_mode: Literal["history", "resyncing", "following"] = "history"
    epoch: str | None = None
    seq: int = 0
    fingerprint: str | None = None  # of the daemon's cache layout
    model: str | None = None  # what its layout says it serves
    # The model names it answers to (its /v1/models ids and, for a warmfleet daemon, the
    # aliases its /v1/status lists); None: unknown (not read yet, or it lists none).
    models: frozenset[str] | None = None
    context_length: int | None = None  # tokens; None: it has not said
    # What a prompt token costs it per tier (its layout's, refreshed from its status: a
    # restarted daemon measures again); None: it has not said (an older daemon, any
    # other server), so the policy weighs its cached tokens as RAM hits.
    costs: TierCosts | None = None
    resyncs: int = 0
    warm_sets: list[dict[str, Any]] = field(default_factory=list)
    # Its longest pinned fleet-wide warm prompt, in tokens: how far into a salted request
    # the router keeps unsalted keys (`keys.Salt`).
    shared_tokens: int = 0
    # Its warm prompts' tokens by name (a learned prompt's, once a set warms it there).
    warm_tokens: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    failures: int = 0
    last_error: str = ""
    # What could not be read from it lately and why (what -> reason), for the status.
    problems: dict[str, str] = field(default_factory=dict)
    last_change: float = field(default_factory=time.time)
    # Its source dropped it (a WarmNode deleted): draining while its sessions are handed
    # off, then gone. Its probes cannot make it ready again.
    leaving: bool = False

    revision: ClassVar[int] = 0  # of every backend's watched fields (see _WATCHED)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WATCHED and getattr(self, name, _UNSET) != value:
            Backend.revision += 1
        object.__setattr__(self, name, value)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def usable(self) -> bool:
        """Gets new requests: ready by its last health check and since no failure."""
        return self.health == "ready"

    def serves(self, model: str) -> bool | None:
        """Whether it answers to `model` (None: it has not said)."""
        return None if self.models is None else model in self.models

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.spec.token}"} if self.spec.token else {}

    def set_health(self, health: Health, detail: str = "") -> None:
        if self.leaving and health == "ready":
            health, detail = "draining", "removed from the fleet: handing its sessions off"
        if health != self.health:
            self.last_change = time.time()
        self.health, self.health_detail = health, detail
