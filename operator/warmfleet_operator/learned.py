"""A learning WarmPromptSet's prompts (`spec.learn`): which of the warm prompts the
router learned (its `GET /v1/router/learned` listing) the set takes, and what its status
says of them. Pure: the listing comes in, prompts and status entries go out.

A set takes the prompts at least `minSessions` distinct sessions sent, that a request
used within `ttl`, of its own tenant (a set naming one tenant: that tenant's; naming
none: the fleet-wide ones, an open router's; never another tenant's), most sessions
first, at most `maxPrompts`; each must be a valid warm prompt (else it is skipped)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from warmfleet_common.contract import PromptState, WarmPrompt
from warmfleet_common.durations import parse_duration
from warmfleet_operator.objects import Observation

DEFAULT_MIN_SESSIONS = 3
DEFAULT_TTL = "7d"
DEFAULT_MAX_PROMPTS = 16
OPEN = "-"  # the router's name for an open router's (fleet-wide) learned prompts


@dataclass(frozen=True)
class Learned:
    prompts: list[dict[str, Any]] = field(default_factory=list)  # WarmPrompt entries
    status: list[dict[str, Any]] = field(default_factory=list)  # status.learned


def tenant_of(spec: Mapping[str, Any]) -> str:
    """Whose learned prompts the set takes: its one tenant, or the fleet-wide ones."""
    tenants = spec.get("tenants") or []
    return str(tenants[0]) if len(tenants) == 1 else OPEN


def select(spec: Mapping[str, Any], listing: Sequence[Any], now: float) -> Learned:
    """The learned prompts `spec` (a WarmPromptSet spec with `learn`) takes from the
    router's `listing` (its `data`), at `now` (Unix seconds)."""
    learn = spec.get("learn") or {}
    tenants = spec.get("tenants") or []
    if len(tenants) > 1:  # the CRD refuses it; a set for two tenants would share one's
        return Learned()
    tenant = tenants[0] if tenants else None
    least = int(learn.get("minSessions", DEFAULT_MIN_SESSIONS))
    ttl = parse_duration(str(learn.get("ttl", DEFAULT_TTL)))
    most = int(learn.get("maxPrompts", DEFAULT_MAX_PROMPTS))
    own = {p.get("name") for p in spec.get("prompts") or [] if isinstance(p, Mapping)}
    taken: list[tuple[int, float, dict[str, Any], dict[str, Any]]] = []
    for item in listing:
        if not isinstance(item, Mapping) or item.get("tenant") != tenant:
            continue
        sessions, last = item.get("sessions"), item.get("last_seen")
        if not isinstance(sessions, int) or not isinstance(last, (int, float)):
            continue
        if sessions < least or now - last > ttl:
            continue
        try:
            prompt = WarmPrompt.model_validate(item.get("prompt"))
        except ValidationError:
            continue
        if prompt.name in own:
            continue
        own.add(prompt.name)
        entry = {
            "name": prompt.name,
            "client": str(item.get("client") or "")[:64],
            "api": prompt.api,
            "sessions": sessions,
            "lastSeen": _rfc3339(float(last)),
        }
        taken.append(
            (sessions, float(last), prompt.model_dump(mode="json", exclude_none=True), entry)
        )
    taken.sort(key=lambda t: (-t[0], -t[1], t[3]["name"]))
    chosen = taken[:most]
    return Learned([t[2] for t in chosen], [t[3] for t in chosen])


def with_tokens(
    entries: Sequence[Mapping[str, Any]], observations: Iterable[Observation]
) -> list[dict[str, Any]]:
    """Status entries with each prompt's tokens where a node has it warm (the cached
    tokens a request starting with it gets)."""
    tokens: dict[str, int] = {}
    for seen in observations:
        status = seen.status if seen.reachable else None
        for prompt in status.prompts if status is not None else []:
            if prompt.state is PromptState.WARM:
                tokens[prompt.name] = max(tokens.get(prompt.name, 0), prompt.tokens)
    return [
        {**entry, "tokens": tokens[entry["name"]]} if entry["name"] in tokens else dict(entry)
        for entry in entries
    ]


def _rfc3339(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
