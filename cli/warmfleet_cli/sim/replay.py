"""`warmfleet sim replay`: a trace's sessions sent to a fleet (its router, or any server
speaking the agents' APIs), each session closed-loop as its CLI would: a step is sent
once the previous response has ended and the step's `gap` (a tool's run, the developer's
think time) has passed, and not before its trace time `t`. Each response's real text is
what the next step carries (as the CLI would send it back), so the next request's
prefix is what the fleet computed.

Times: a trace is compressed (`compress` in its header: a working day in minutes); the
fleet it is replayed against must run as much faster (`warmfleet up --engine sim
--sim-speed` the same factor). Every time recorded is scaled back to the profiled Mac's
(wall seconds x the factor), so the figures read as a real fleet's; overheads that do not
scale (HTTP, Python) are inflated by the factor too, which bounds how far a run may be
compressed: say so with the figures.

Node events (a node lost, nodes added, a rolling restart) need control of the fleet's
processes, which a replay against a URL does not have: they are listed as not applied.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from warmfleet_cli.sim.bodies import BodyOptions, SessionBodies
from warmfleet_cli.sim.trace import Record
from warmfleet_common import bounded

NODE_EVENTS = ("node-lost", "nodes-added", "rolling-restart")


@dataclass
class Outcome:
    """One replayed request."""

    session: str
    dev: int
    agent: str
    version: str
    turn: int
    kind: str
    sent_s: float  # since the replay's start, in the trace's (uncompressed) seconds
    status: int = 0
    ttft_s: float | None = None  # scaled back to the profiled machine's seconds
    duration_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    node: str | None = None  # the router's backend (x-warmfleet-backend)
    reason: str | None = None  # why the router chose it (x-warmfleet-route-reason)

    @property
    def first(self) -> bool:
        return self.turn == 0


@dataclass(frozen=True)
class ReplayOptions:
    url: str
    time_scale: float  # the trace's compression: wall seconds x this = the Mac's seconds
    model: str = "default"
    timeout_s: float = 600.0
    sessions: int | None = None  # replay only the first N sessions (by start)
    api_key: str = "unused"


class ReplayError(ValueError):
    """The trace cannot be replayed against this fleet; the message says why."""


async def check_fleet(header: dict[str, Any], options: ReplayOptions) -> None:
    """A trace whose sessions grow past the fleet's context would fail by design (its
    compactions come later than the fleet allows): refused before anything is sent."""
    wanted = int(header.get("params", {}).get("context_tokens", 0) or 0)
    async with httpx.AsyncClient(base_url=options.url, timeout=30.0) as client:
        try:
            listed = (await client.get("/v1/models")).json().get("data", [])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise ReplayError(f"{options.url}/v1/models: {exc}") from exc
    served = [int(m["max_model_len"]) for m in listed if m.get("max_model_len")]
    if served and wanted > min(served):
        raise ReplayError(
            f"the trace's sessions grow to {wanted:,} tokens (their agents compact there) "
            f"but the fleet serves {min(served):,}: generate it with `warmfleet sim trace "
            f"--context-tokens {min(served)}`"
        )


async def replay(
    header: dict[str, Any],
    records: Iterable[Record],
    options: ReplayOptions,
    done: Callable[[Outcome], None] = lambda _: None,
    alongside: Callable[[float], Awaitable[None]] | None = None,
    also: Callable[[float], Awaitable[None]] | None = None,
) -> tuple[list[Outcome], list[Record]]:
    """Every session of the trace replayed; the outcomes in send order, and the node
    events (for `also` to apply, or not applied). `done` sees each outcome as its
    response ends (a long run's rows are kept as they come). `also(start)` runs with
    the sessions (`start`: the replay's start on the monotonic clock) and the replay
    ends when both have; `alongside(start)` runs until then and is cancelled."""
    by_session: dict[str, list[Record]] = {}
    skipped: list[Record] = []
    for record in records:
        if "session" in record:
            by_session.setdefault(record["session"], []).append(record)
        elif record.get("event") in NODE_EVENTS:
            skipped.append(record)
    chosen = sorted(by_session.values(), key=lambda steps: steps[0]["t"])
    if options.sessions is not None:
        chosen = chosen[: options.sessions]
    bodies = BodyOptions.of(header, options.model)
    outcomes: list[Outcome] = []
    keep = bounded.CLIENT_KEEP_ALIVE_S  # shorter than the router's: no reused dead connection
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=256, keepalive_expiry=keep
    )
    timeout = httpx.Timeout(options.timeout_s, connect=30.0)
    async with httpx.AsyncClient(base_url=options.url, limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        beside = asyncio.ensure_future(alongside(start)) if alongside is not None else None
        try:
            await asyncio.gather(
                *(
                    _session(client, steps, bodies, options, start, outcomes, done)
                    for steps in chosen
                ),
                *([also(start)] if also is not None else []),
            )
        finally:
            if beside is not None:
                beside.cancel()
                await asyncio.gather(beside, return_exceptions=True)
    outcomes.sort(key=lambda o: o.sent_s)
    return outcomes, skipped


async def _session(
    client: httpx.AsyncClient,
    steps: list[Record],
    bodies: BodyOptions,
    options: ReplayOptions,
    start: float,
    outcomes: list[Outcome],
    done: Callable[[Outcome], None],
) -> None:
    builder = SessionBodies(bodies)
    reply: str | None = None
    ended = start
    for step in steps:
        due = max(start + step["t"], ended + step.get("gap", 0.0))
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        request = builder.request(step, reply)
        sent = time.monotonic()
        outcome = Outcome(
            step["session"],
            step["dev"],
            step["agent"],
            step["version"],
            step["turn"],
            step["kind"],
            sent_s=(sent - start) * options.time_scale,
        )
        outcomes.append(outcome)
        headers = {**request.headers, "authorization": f"Bearer {options.api_key}"}
        headers["x-api-key"] = options.api_key
        try:
            reply = await _send(client, request.path, headers, request.body, outcome, sent)
        except (httpx.HTTPError, ValueError) as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
            reply = None
        scale = options.time_scale
        outcome.ttft_s = None if outcome.ttft_s is None else outcome.ttft_s * scale
        outcome.duration_s = (time.monotonic() - sent) * scale
        ended = time.monotonic()
        done(outcome)
        if outcome.error is not None:
            return  # a CLI whose request failed stops; its session ends here


async def _send(
    client: httpx.AsyncClient,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any],
    outcome: Outcome,
    sent: float,
) -> str:
    """Streams one request; fills the outcome (TTFT in wall seconds, usage) and returns
    the response's text."""
    text: list[str] = []
    async with client.stream("POST", path, headers=headers, json=body) as response:
        outcome.status = response.status_code
        outcome.node = response.headers.get("x-warmfleet-backend")
        outcome.reason = response.headers.get("x-warmfleet-route-reason")
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:300]
            raise ValueError(f"HTTP {response.status_code}: {detail}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if not data or data == "[DONE]":
                continue
            event = json.loads(data)
            piece = _text_of(event)
            if piece:
                if outcome.ttft_s is None:
                    outcome.ttft_s = time.monotonic() - sent
                text.append(piece)
            _read_usage(event, outcome)
    if outcome.ttft_s is None:
        outcome.ttft_s = time.monotonic() - sent  # an answer of no text: its end
    return "".join(text)


def _text_of(event: dict[str, Any]) -> str:
    kind = event.get("type")
    if kind == "content_block_delta":  # Anthropic Messages
        delta = event.get("delta", {})
        return str(delta.get("text") or delta.get("partial_json") or "")
    if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        return str(event.get("delta") or "")
    choices = event.get("choices")  # OpenAI chat
    if choices:
        delta = choices[0].get("delta", {})
        return str(delta.get("content") or "")
    return ""


def _read_usage(event: dict[str, Any], outcome: Outcome) -> None:
    usage = (
        event.get("usage")
        or event.get("message", {}).get("usage")
        or (event.get("response") or {}).get("usage")
    )
    if not isinstance(usage, dict):
        return
    # Later events override earlier ones: Messages' `message_start` carries an estimate
    # (what RAM held before the prefill), its `message_delta` the exact figures.
    if "input_tokens" in usage:
        cached = usage.get("cache_read_input_tokens")
        if cached is None:  # Responses
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
            outcome.prompt_tokens = int(usage["input_tokens"])
        else:  # Messages: input_tokens excludes what was read from the cache and what
            # was computed up to the last cache_control breakpoint (cache_creation)
            created = int(usage.get("cache_creation_input_tokens") or 0)
            outcome.prompt_tokens = int(usage["input_tokens"]) + created + int(cached)
        outcome.cached_tokens = int(cached or 0)
    elif "prompt_tokens" in usage:
        outcome.prompt_tokens = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        outcome.cached_tokens = int(details.get("cached_tokens") or 0)
    tiers = usage.get("cached_tokens_by_tier")
    if isinstance(tiers, dict):
        outcome.cached_by_tier = {str(k): int(v) for k, v in tiers.items()}


# -- what a run says --------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summary(outcomes: list[Outcome], skipped: list[Record]) -> dict[str, Any]:
    served = [o for o in outcomes if o.error is None]
    first = [o.ttft_s for o in served if o.first and o.ttft_s is not None]
    later = [o.ttft_s for o in served if not o.first and o.ttft_s is not None]
    prompt = sum(o.prompt_tokens for o in served)
    by_tier: dict[str, int] = {}
    for o in served:
        for tier, n in o.cached_by_tier.items():
            by_tier[tier] = by_tier.get(tier, 0) + n
    return {
        "requests": len(outcomes),
        "failed": len(outcomes) - len(served),
        "sessions": len({o.session for o in outcomes}),
        "token_hit_rate": (sum(o.cached_tokens for o in served) / prompt) if prompt else None,
        "cached_by_tier": by_tier,
        "first_request_ttft_s": {f"p{q}": percentile(first, q) for q in (50, 95, 99)},
        "later_ttft_s": {f"p{q}": percentile(later, q) for q in (50, 95, 99)},
        "first_request_hit_rate": _hit_rate([o for o in served if o.first]),
        "node_events_not_applied": [{"t": e["t"], "event": e["event"]} for e in skipped],
    }


def _hit_rate(outcomes: list[Outcome]) -> float | None:
    prompt = sum(o.prompt_tokens for o in outcomes)
    return sum(o.cached_tokens for o in outcomes) / prompt if prompt else None


def outcome_row(outcome: Outcome) -> dict[str, Any]:
    return asdict(outcome)
