"""The router's options: what `warmfleet router`'s flags set, read by the fleet's parts
(membership, planning, the drain handoff, the proxy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmfleet_common.tls import TlsOptions
from warmfleet_router.index import DEFAULT_BUDGET_BYTES as DEFAULT_INDEX_BUDGET
from warmfleet_router.learning import LearnOptions
from warmfleet_router.policy import DEFAULT_EPSILON, PolicyName
from warmfleet_router.sessions import DEFAULT_BUDGET_BYTES as DEFAULT_SESSIONS_BUDGET
from warmfleet_router.sessions import DEFAULT_SOURCES
from warmfleet_router.sync import SyncOptions
from warmfleet_router.tenant_share import DEFAULT_WINDOW_S as DEFAULT_TENANT_WINDOW


@dataclass(frozen=True)
class ProxyOptions:
    request_timeout: float = 900.0  # seconds from arrival to the response's last byte
    max_response_bytes: int = 64 << 20  # a non-streamed response body
    buffer_bytes: int = 256 << 10  # held to read a body's usage; larger ones pass on
    max_error_bytes: int = 64 << 10  # the part of a 5xx body kept for the log


@dataclass(frozen=True)
class RouterOptions:
    policy: PolicyName = "prefix"
    epsilon: float = DEFAULT_EPSILON
    sync: SyncOptions = field(default_factory=SyncOptions)
    session_keys: tuple[str, ...] = DEFAULT_SOURCES  # where a request's session key is
    proxy: ProxyOptions = field(default_factory=ProxyOptions)
    index_budget_bytes: int = DEFAULT_INDEX_BUDGET
    sessions_budget_bytes: int = DEFAULT_SESSIONS_BUDGET
    key_workers: int = 0  # processes that prepare requests; 0: threads of this one
    # The daemons' admin token, also asked of callers of the status's detail.
    admin_token: str | None = field(default=None, repr=False)
    # Client keys (`TENANT KEY` lines): each inference route then needs one.
    api_keys_file: str | None = None
    quotas_file: str | None = None  # per-tenant limits (`quotas`), read again when changed
    # A tenant over its share of the fleet kept off the backends other tenants used
    # within this many seconds (`tenant_share`); 0: off.
    tenant_share_window_s: float = DEFAULT_TENANT_WINDOW
    # HTTPS served, the daemons' certificates verified, mTLS on the status's detail.
    tls: TlsOptions = field(default_factory=TlsOptions)
    # A draining backend's hottest sessions copied to where they go next: how many, and
    # the time the whole handoff may take (then the rest prefill when they come back).
    handoff_sessions: int = 16
    handoff_seconds: float = 20.0
    # Freeze the GC heap once started and after each new tokenizer (warmfleet_common.heap):
    # the command's choice for its process, not a test's.
    freeze_gc_heap: bool = False
    # Warm prompts learned from the heads many sessions share (`learning`).
    learn: LearnOptions = field(default_factory=LearnOptions)
