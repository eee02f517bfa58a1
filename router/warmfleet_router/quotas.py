"""Quotas per tenant at the router: requests, prompt tokens and generated tokens per
minute, and requests in flight. Plain Python, no I/O (the file is read by `watched`).

Each per-minute limit is a token bucket that holds a minute's worth and refills
continuously (as the commercial APIs' rate limits do): a request is admitted while its
tenant's request bucket holds one request and its token buckets are not overdrawn.
Prompt tokens are taken on admission (as the router keyed them; corrected by the
backend's usage at the end), generated tokens at the end (only then known), so one
long answer may overdraw its bucket: the tenant's next requests then wait until it has
refilled. A refusal says which limit and when to retry (`Retry-After`, whole seconds).
Without a limit, nothing is counted against it; an open router (no client keys) holds
its clients to the default limits as one tenant.

The file (`--quotas FILE`, YAML or JSON):

    default: {requests_per_minute: 600, concurrent_requests: 16}
    tenants:
      team-a: {requests_per_minute: 60, prompt_tokens_per_minute: 200000}

A tenant listed takes its own limits, any it leaves out from `default`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warmfleet_common.client_keys import TENANT_PATTERN

LimitName = Literal[
    "requests_per_minute",
    "prompt_tokens_per_minute",
    "generated_tokens_per_minute",
    "concurrent_requests",
]
LIMITS: tuple[LimitName, ...] = (
    "requests_per_minute",
    "prompt_tokens_per_minute",
    "generated_tokens_per_minute",
    "concurrent_requests",
)
OPEN = "-"  # an open router's clients, as one tenant (no tenant name can be this)


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(None, ge=1)
    prompt_tokens_per_minute: int | None = Field(None, ge=1)
    generated_tokens_per_minute: int | None = Field(None, ge=1)
    concurrent_requests: int | None = Field(None, ge=1)

    def over(self, defaults: Limits) -> Limits:
        """These limits, with `defaults` for those left out."""
        return defaults.model_copy(update=self.model_dump(exclude_unset=True))


class QuotaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: Limits = Field(default_factory=Limits)
    tenants: dict[str, Limits] = Field(default_factory=dict, max_length=10_000)

    def limits(self, tenant: str) -> Limits:
        own = self.tenants.get(tenant)
        return self.default if own is None else own.over(self.default)


def parse_quotas(text: str) -> QuotaConfig:
    """A quotas file's content; ValueError saying what is wrong."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}") from exc
    try:
        config = QuotaConfig.model_validate(document or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise ValueError(f"{where}: {first['msg']}") from exc
    bad = [t for t in config.tenants if re.fullmatch(TENANT_PATTERN, t) is None]
    if bad:
        raise ValueError(f"tenants: not tenant names: {', '.join(sorted(bad))}")
    return config


@dataclass
class Bucket:
    """A minute's worth of something, refilled continuously."""

    per_minute: int
    level: float = math.nan
    stamp: float = 0.0

    def refill(self, now: float) -> float:
        if math.isnan(self.level):
            self.level, self.stamp = float(self.per_minute), now
        self.level = min(
            float(self.per_minute), self.level + (now - self.stamp) * self.per_minute / 60
        )
        self.stamp = now
        return self.level

    def wait_for(self, needed: float, now: float) -> float:
        """Seconds until it holds `needed` (0: it does)."""
        missing = needed - self.refill(now)
        return max(0.0, missing * 60 / self.per_minute)


@dataclass(frozen=True)
class Throttled:
    """A refusal: which limit, and when to try again."""

    tenant: str
    limit: LimitName
    retry_after: int  # whole seconds, at least 1

    @property
    def message(self) -> str:
        what = self.limit.replace("_", " ")
        who = "this router's clients" if self.tenant == OPEN else f"tenant {self.tenant}"
        return f"rate limit: {who} is over its {what}; retry after {self.retry_after}s"


@dataclass
class _Tenant:
    limits: Limits
    buckets: dict[LimitName, Bucket] = field(default_factory=dict)
    in_flight: int = 0

    def bucket(self, name: LimitName, per_minute: int | None) -> Bucket | None:
        if per_minute is None:
            self.buckets.pop(name, None)
            return None
        found = self.buckets.get(name)
        if found is None or found.per_minute != per_minute:  # new, or the file changed
            found = self.buckets[name] = Bucket(per_minute)
        return found


@dataclass(eq=False)
class Ticket:
    """An admitted request: released once, with what it used."""

    quotas: Quotas
    tenant: str
    prompt_tokens: int  # taken on admission
    released: bool = False

    def release(self, prompt_tokens: int | None = None, generated: int | None = None) -> None:
        if not self.released:
            self.released = True
            self.quotas.release(self, prompt_tokens, generated)


class Quotas:
    """Every tenant's buckets, under the limits `config()` says now (the file, read again
    when it changes: a bucket keeps its level while its limit stays the same)."""

    def __init__(self, config: Callable[[], QuotaConfig] = QuotaConfig) -> None:
        self._config = config
        self._tenants: dict[str, _Tenant] = {}

    def in_flight(self) -> dict[str, int]:
        return {name: t.in_flight for name, t in self._tenants.items()}

    def _tenant(self, tenant: str) -> _Tenant:
        limits = self._config().limits(tenant)
        found = self._tenants.get(tenant)
        if found is None:
            found = self._tenants[tenant] = _Tenant(limits)
        found.limits = limits
        return found

    def check(self, tenant: str, *, now: float | None = None) -> Throttled | None:
        """Whether a request of `tenant` would be refused now (nothing is taken): before
        its body is read, so a flood costs the router little."""
        return self._refusal(self._tenant(tenant), tenant, time.monotonic() if now is None else now)

    def admit(
        self, tenant: str, prompt_tokens: int, *, now: float | None = None
    ) -> Ticket | Throttled:
        """Admit a request of `tenant` with `prompt_tokens` (as keyed; 0: unknown), or
        say why not."""
        clock = time.monotonic() if now is None else now
        state = self._tenant(tenant)
        refused = self._refusal(state, tenant, clock)
        if refused is not None:
            return refused
        state.in_flight += 1
        requests = state.bucket("requests_per_minute", state.limits.requests_per_minute)
        if requests is not None:
            requests.level -= 1
        prompts = state.bucket("prompt_tokens_per_minute", state.limits.prompt_tokens_per_minute)
        if prompts is not None:
            prompts.level -= prompt_tokens
        return Ticket(self, tenant, prompt_tokens)

    def release(self, ticket: Ticket, prompt_tokens: int | None, generated: int | None) -> None:
        state = self._tenant(ticket.tenant)
        state.in_flight = max(0, state.in_flight - 1)
        limits = state.limits
        prompts = state.bucket("prompt_tokens_per_minute", limits.prompt_tokens_per_minute)
        if prompts is not None and prompt_tokens is not None:
            prompts.level -= prompt_tokens - ticket.prompt_tokens  # the backend's count
        outputs = state.bucket("generated_tokens_per_minute", limits.generated_tokens_per_minute)
        if outputs is not None and generated:
            outputs.level -= generated

    def _refusal(self, state: _Tenant, tenant: str, now: float) -> Throttled | None:
        limits = state.limits
        if limits.concurrent_requests is not None and state.in_flight >= limits.concurrent_requests:
            return Throttled(tenant, "concurrent_requests", 1)
        checks: tuple[tuple[LimitName, int | None, float], ...] = (
            ("requests_per_minute", limits.requests_per_minute, 1.0),
            ("prompt_tokens_per_minute", limits.prompt_tokens_per_minute, 0.0),  # not overdrawn
            ("generated_tokens_per_minute", limits.generated_tokens_per_minute, 0.0),
        )
        waits: list[tuple[float, LimitName]] = []
        for name, per_minute, needed in checks:
            bucket = state.bucket(name, per_minute)
            if bucket is not None:
                waits.append((bucket.wait_for(needed, now), name))
        wait, name = max(waits, default=(0.0, "requests_per_minute"))
        if wait <= 0:
            return None
        return Throttled(tenant, name, max(1, math.ceil(wait)))
