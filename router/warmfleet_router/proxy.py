"""Forwarding one request: the plan's backend, one retry on the next best if it fails
before the first byte, the response passed through as it arrives (streams chunk by
chunk, never buffered), `x-warmfleet-backend` on every response, and an OpenAI-style
error event when a stream is cut after its first byte.

Bounded: a whole request (streamed or not) ends by `ProxyOptions.request_timeout` after
it arrived (504 before the response began, an error event in a stream after); a
non-streamed body over `max_response_bytes` is a 502 and an error body is read up to
`max_error_bytes`; a stream is relayed chunk by chunk, holding at most its opening
event (up to 1 MiB) back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import httpx
from fastapi.responses import Response, StreamingResponse

from warmfleet_common import bounded, spill, tenancy
from warmfleet_common.client_keys import API_KEY_HEADER
from warmfleet_common.grants import GRANT_HEADER, issue_grant
from warmfleet_common.wire import STREAM_USAGE_COMMENT, STREAM_USAGE_HEADER
from warmfleet_router.backend import Backend
from warmfleet_router.errors import (
    error_response,
    invalid_request,
    routing_error,
    stream_error,
    throttled,
)
from warmfleet_router.fleet import Fleet
from warmfleet_router.planning import Plan
from warmfleet_router.policy import Reason, RoutingError
from warmfleet_router.prepare import RequestInvalid
from warmfleet_router.quotas import OPEN, Throttled, Ticket
from warmfleet_router.routes import ProxiedRoute, Usage

log = logging.getLogger(__name__)

BACKEND_HEADER = "x-warmfleet-backend"
REASON_HEADER = "x-warmfleet-route-reason"
# Not forwarded either way: hop-by-hop, or recomputed by the HTTP stack.
_HOP = {
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
}
_PASSED_BACK = ("content-type", "content-encoding", "cache-control", "x-request-id")
_CLIENT_KEY_HEADERS = {"authorization", API_KEY_HEADER}
_UNSIGNED: set[str] = set()  # backends told of once: no token to sign a tenant with


T = TypeVar("T")


class UpstreamFailed(Exception):
    """The backend failed before sending anything: safe to retry elsewhere."""


class _Answered(Exception):
    """The exchange is over with this response (no retry)."""

    def __init__(self, response: Response) -> None:
        self.response = response


async def forward(
    fleet: Fleet,
    route: ProxiedRoute,
    raw: bytes,
    headers: Mapping[str, str],
    tenant: str | None = None,
) -> Response:
    try:
        plan = await fleet.planner.plan(route, raw, headers, tenant)
    except RoutingError as exc:
        return routing_error(exc, route.api)
    except RequestInvalid as exc:
        return invalid_request(exc.invalid, route.api)
    who = tenant or OPEN
    keyed = max((b.tokens for b in plan.blocks.values()), default=0)
    ticket = fleet.quotas.admit(who, keyed)
    if isinstance(ticket, Throttled):
        fleet.metrics.throttled(who, ticket.limit)
        return throttled(ticket, route.api)
    fleet.learned.observe(plan.head, plan.affinity, tenant, headers.get("user-agent", ""))
    try:
        response = await _attempts(fleet, route, raw, headers, tenant, plan)
    except BaseException:
        _settle(fleet, plan, ticket)
        raise
    if isinstance(response, StreamingResponse):  # settled once its last byte is sent
        response.body_iterator = _settled_at_end(response.body_iterator, fleet, plan, ticket)
    else:
        _settle(fleet, plan, ticket)
    return response


def _settle(fleet: Fleet, plan: Plan, ticket: Ticket) -> None:
    """The request is over: its tenant's quota gets what it used, the metrics too."""
    usage = plan.usage
    ticket.release(
        usage.prompt_tokens if usage else None, usage.completion_tokens if usage else None
    )
    fleet.metrics.tenant_request(ticket.tenant, "ok" if usage else "other", usage)
    if (
        usage
        and plan.head
        and fleet.learned.settled(plan.head, usage.prompt_tokens, usage.cached_tokens)
    ):
        fleet.metrics.first_request(ticket.tenant, plan.head.client, plan.head.learned, usage)


async def _settled_at_end(
    body: AsyncIterable[Any], fleet: Fleet, plan: Plan, ticket: Ticket
) -> AsyncIterator[Any]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        closing = getattr(body, "aclose", None)
        if closing is not None:
            await closing()  # its own ending first: that records the usage
        _settle(fleet, plan, ticket)


async def _attempts(
    fleet: Fleet,
    route: ProxiedRoute,
    raw: bytes,
    headers: Mapping[str, str],
    tenant: str | None,
    plan: Plan,
) -> Response:
    # A client never names a spill peer or a tenant: only the router does, signed (see
    # _spill_headers, _tenant_headers).
    upstream_headers = {
        k: v
        for k, v in headers.items()
        if k.lower() not in _HOP
        and not k.lower().startswith((spill.HEADER_PREFIX, tenancy.HEADER_PREFIX))
    }
    upstream_headers[STREAM_USAGE_HEADER] = "1"  # a tenant's tokens are counted from it
    attempts: list[tuple[str, Reason]] = [(plan.decision.backend, plan.decision.reason)]
    # One retry, on the best fallback still usable (the next on the ring may be draining
    # with the one that failed: a rolling restart takes several at a time).
    members = fleet.members.backends
    retry = next((n for n in plan.decision.fallbacks if n in members and members[n].usable), None)
    attempts += [(retry, "failover")] if retry is not None else []
    errors: list[str] = []
    for name, reason in attempts:
        backend = members.get(name)
        if backend is None:
            continue
        failed = fleet.members.backends.get(attempts[0][0])
        if reason == "failover" and failed is not None:
            fleet.metrics.failover(failed)
        sent = {
            **_tenant_headers(upstream_headers, backend, tenant),
            **_spill_headers(fleet, plan, backend),
        }
        try:
            return await _attempt(fleet, plan, backend, reason, route, raw, sent)
        except _Answered as answered:
            return answered.response
        except UpstreamFailed as exc:
            errors.append(f"{name}: {exc}")
            log.warning("backend %s failed before the first byte: %s", name, exc)
    message = "every backend tried failed: " + "; ".join(errors)
    return error_response(502, message, "backend_failed", shape=route.api)


def _tenant_headers(
    headers: dict[str, str], backend: Backend, tenant: str | None
) -> dict[str, str]:
    """The tenant the router authenticated, signed with `backend`'s admin token (then
    the client's key stays here: the daemon needs no copy); without its token the
    client's headers go as they are, for a daemon with the keys file to check."""
    if tenant is None:
        return headers
    if not backend.spec.token:
        if backend.name not in _UNSIGNED:
            _UNSIGNED.add(backend.name)
            log.warning(
                "backend %s: no admin token to sign the tenant with: its cache keeps tenants "
                "apart only if it has the keys file too",
                backend.name,
            )
        return headers
    kept = {k: v for k, v in headers.items() if k.lower() not in _CLIENT_KEY_HEADERS}
    kept[tenancy.TENANT_HEADER] = tenant
    kept[tenancy.TENANT_SIGNATURE_HEADER] = tenancy.sign_tenant(backend.spec.token, tenant)
    return kept


def _spill_headers(fleet: Fleet, plan: Plan, backend: Backend) -> dict[str, str]:
    """Name the backend that holds more of the request's blocks as the peer `backend`
    copies them from, signed with `backend`'s admin token (the daemon's proof that the
    router, not a client, named it); with a grant to read the peer's blocks when the
    router holds the peer's token (nodes with their own tokens), covered by the
    signature."""
    peer = fleet.planner.spill_peer(plan, backend)
    token = backend.spec.token
    if peer is None or not token:
        return {}
    plan.peers[backend.name] = peer.name
    fleet.metrics.spill(backend, peer)
    grant = issue_grant(peer.spec.token, peer.url) if peer.spec.token else None
    headers = {
        spill.PEER_HEADER: peer.url,
        spill.PEER_SIGNATURE_HEADER: spill.peer_signature(token, peer.url, grant),
    }
    if grant is not None:
        headers[GRANT_HEADER] = grant
    return headers


async def _attempt(
    fleet: Fleet,
    plan: Plan,
    backend: Backend,
    reason: Reason,
    route: ProxiedRoute,
    raw: bytes,
    headers: Mapping[str, str],
) -> Response:
    fleet.planner.started(plan, backend, reason)
    done = False

    def finish(outcome: str, usage: Usage | None, first_byte: float | None) -> None:
        nonlocal done
        if not done:
            done = True
            fleet.planner.finished(
                plan, backend, reason, outcome=outcome, usage=usage, first_byte=first_byte
            )

    try:
        return await _exchange(fleet, plan, backend, reason, route, raw, headers, finish)
    except BaseException:
        # The client went away before the response began (or anything unforeseen): the
        # request must not stay counted in flight.
        finish("cancelled", None, None)
        raise


Finish = Callable[[str, Usage | None, float | None], None]


async def _exchange(
    fleet: Fleet,
    plan: Plan,
    backend: Backend,
    reason: Reason,
    route: ProxiedRoute,
    raw: bytes,
    headers: Mapping[str, str],
    finish: Finish,
) -> Response:
    options = fleet.options.proxy
    deadline = plan.started + options.request_timeout

    async def within(step: Awaitable[T]) -> T:
        """`step`, unless the request's deadline passes first (504, no retry)."""
        try:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                return await step
        except TimeoutError as exc:
            finish("timeout", None, None)
            message = f"the backend {backend.name} did not answer within the request timeout"
            answer = error_response(504, message, "backend_timeout", shape=route.api)
            raise _Answered(answer) from exc

    request = fleet.client.build_request(
        "POST",
        f"{backend.url}{route.path}",
        content=raw,
        headers=headers,
        timeout=httpx.Timeout(10.0, read=options.request_timeout),
    )
    try:
        upstream = await within(fleet.client.send(request, stream=True))
    except httpx.HTTPError as exc:
        fleet.members.passive_failure(backend, f"{type(exc).__name__}: {exc}")
        finish("failed", None, None)
        raise UpstreamFailed(f"{type(exc).__name__}: {exc}") from exc
    try:
        return await _relay(fleet, plan, backend, reason, route, upstream, finish, within)
    except BaseException:
        await upstream.aclose()
        raise


async def _relay(
    fleet: Fleet,
    plan: Plan,
    backend: Backend,
    reason: Reason,
    route: ProxiedRoute,
    upstream: httpx.Response,
    finish: Finish,
    within: Callable[[Awaitable[Any]], Awaitable[Any]],
) -> Response:
    options = fleet.options.proxy
    deadline = plan.started + options.request_timeout
    if upstream.status_code >= 500:
        try:
            text = await within(bounded.read_body(upstream, options.max_error_bytes))
        except (httpx.HTTPError, bounded.TooLarge):
            text = b"(an unreadable or oversized error body)"
        await upstream.aclose()
        fleet.members.passive_failure(backend, f"HTTP {upstream.status_code}")
        finish("failed", None, None)
        raise UpstreamFailed(f"HTTP {upstream.status_code}: {text[:300].decode(errors='replace')}")
    out_headers = {k: upstream.headers[k] for k in _PASSED_BACK if k in upstream.headers}
    out_headers[BACKEND_HEADER] = backend.name
    out_headers[REASON_HEADER] = reason
    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
    chunks = upstream.aiter_raw()
    try:  # the first byte decides whether a retry is still possible
        first = await within(_first_progress(chunks, route) if streaming else anext(chunks, b""))
    except httpx.HTTPError as exc:
        await upstream.aclose()
        fleet.members.passive_failure(backend, f"{type(exc).__name__}: {exc}")
        finish("failed", None, None)
        raise UpstreamFailed(f"{type(exc).__name__}: {exc}") from exc
    first_byte = time.monotonic() - plan.started
    fleet.planner.prefilled(plan, backend)

    if not streaming:
        try:
            content, whole = await within(_head(first, chunks, options.buffer_bytes))
        except httpx.HTTPError as exc:
            await upstream.aclose()
            fleet.members.passive_failure(backend, f"{type(exc).__name__}: {exc}")
            finish("failed", None, first_byte)
            raise UpstreamFailed(f"{type(exc).__name__}: {exc}") from exc
        if whole:  # the usual case: the whole body in hand, its usage read
            await upstream.aclose()
            usage = _usage_of(content, route) if upstream.status_code == 200 else None
            finish("ok" if upstream.status_code < 400 else "client_error", usage, first_byte)
            return Response(content, status_code=upstream.status_code, headers=out_headers)
        # Larger: passed on as it comes (so each request holds one buffer, not its body),
        # up to max_response_bytes; its usage is not read.
        return StreamingResponse(
            _pass_on(fleet, backend, upstream, content, chunks, deadline, finish, first_byte),
            status_code=upstream.status_code,
            headers=out_headers,
        )

    async def relay() -> AsyncIterator[bytes]:
        usage = _UsageScanner(route)
        outcome = "cancelled"  # the client went away, unless we get to the end
        try:
            usage.feed(first)
            yield first
            try:
                while True:
                    # asyncio's own timeout: anyio's cancel scope cost 10 us more a chunk
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        chunk = await anext(chunks, None)
                    if chunk is None:
                        break
                    usage.feed(chunk)
                    yield chunk
            except (httpx.HTTPError, TimeoutError) as exc:
                timed_out = isinstance(exc, TimeoutError)
                outcome = "timeout" if timed_out else "cut"
                if timed_out:
                    message = f"the backend {backend.name} exceeded the request timeout"
                else:
                    fleet.members.passive_failure(
                        backend, f"stream cut: {type(exc).__name__}: {exc}"
                    )
                    message = f"the backend {backend.name} failed mid-stream: {type(exc).__name__}"
                code = "backend_timeout" if timed_out else "backend_stream_cut"
                yield stream_error(message, code, route.api)
                return
            outcome = "ok"
        finally:
            await upstream.aclose()
            finish(outcome, usage.found, first_byte)

    return StreamingResponse(relay(), status_code=upstream.status_code, headers=out_headers)


async def _head(first: bytes, chunks: AsyncIterator[bytes], limit: int) -> tuple[bytes, bool]:
    """A non-streamed body's first `limit` bytes or so, and whether that is all of it."""
    parts, size = [first], len(first)
    while size <= limit:
        chunk = await anext(chunks, None)
        if chunk is None:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


async def _pass_on(
    fleet: Fleet,
    backend: Backend,
    upstream: httpx.Response,
    head: bytes,
    chunks: AsyncIterator[bytes],
    deadline: float,
    finish: Finish,
    first_byte: float,
) -> AsyncIterator[bytes]:
    """The rest of a large non-streamed body, chunk by chunk, within the request's
    deadline and `max_response_bytes` (past either, the connection is closed: the
    status line has gone out)."""
    limit = fleet.options.proxy.max_response_bytes
    outcome, size, chunk = "cancelled", 0, head
    try:
        while True:
            size += len(chunk)
            if size > limit:
                outcome = "too_large"
                fleet.metrics.read_error(backend, "response", "TooLarge")
                log.warning("backend %s: a response over %d bytes; cut", backend.name, limit)
                raise bounded.TooLarge(f"{backend.name}: a response over {limit} bytes")
            yield chunk
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                following = await anext(chunks, None)
            if following is None:
                outcome = "ok" if upstream.status_code < 400 else "client_error"
                return
            chunk = following
    except TimeoutError:
        outcome = "timeout"
        raise
    except httpx.HTTPError as exc:
        outcome = "cut"
        fleet.members.passive_failure(backend, f"body cut: {type(exc).__name__}: {exc}")
        raise
    finally:
        await upstream.aclose()
        finish(outcome, None, first_byte)


async def _first_progress(chunks: AsyncIterator[bytes], route: ProxiedRoute) -> bytes:
    """A stream's bytes up to its first event that carries output (text, a tool call, a
    finish, usage, an error, a keep-alive, the end). Daemons open with an empty
    assistant-role event (Anthropic's `message_start`, the Responses API's
    `response.created`) before they have computed anything; holding it back keeps a
    failure during prefill retryable, since the client has seen nothing yet."""
    held = b""
    async for chunk in chunks:
        held += chunk
        events = held.split(b"\n\n")
        if any(_carries_output(e, route) for e in events[:-1]) or len(held) > 1 << 20:
            return held
    return held


def _carries_output(event: bytes, route: ProxiedRoute) -> bool:
    """Whether an SSE event is more than the stream's opening. A keep-alive (an SSE
    comment, Anthropic's `ping`) counts: during a long prefill the client hears from the
    stream (the daemons send one every 5 s), and a failure after it is not retried."""
    lines = [line.strip() for line in event.strip().split(b"\n") if line.strip()]
    if not lines:
        return False
    data = next((line[5:].strip() for line in lines if line.startswith(b"data:")), None)
    if data is None:
        return True  # a comment (keep-alive) or an unexpected line: pass it on
    if data == b"[DONE]":
        return True
    try:
        payload = json.loads(data)
    except ValueError:
        return True
    return not isinstance(payload, dict) or route.carries_output(payload)


def _usage_of(content: bytes, route: ProxiedRoute) -> Usage | None:
    try:
        document = json.loads(content)
    except ValueError:
        return None
    return route.usage_of(document) if isinstance(document, dict) else None


class _UsageScanner:
    """Finds the usage of an SSE stream (the chunk `stream_options.include_usage` adds)
    without holding the stream: only the current partial line is kept."""

    def __init__(self, route: ProxiedRoute) -> None:
        self._route = route
        self._partial = b""
        self.found: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > 1 << 20:
            self._partial = b""  # a line this long is no usage chunk
        for line in lines:
            if line.startswith(STREAM_USAGE_COMMENT):  # a warmfleet daemon's, for the router
                line = b"data: " + line[len(STREAM_USAGE_COMMENT) :]
            if line.startswith(b"data: {") and b'"usage"' in line:
                try:
                    document = json.loads(line[6:])
                except ValueError:
                    continue
                if isinstance(document, dict):
                    self.found = self._route.usage_of(document) or self.found
