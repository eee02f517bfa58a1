"""Quotas per tenant as plain Python: each limit refuses when it is reached and says when
to retry, per-minute budgets refill continuously, generated tokens count at the end,
tenants never spend each other's quota, and the file's limits can change under way."""

from __future__ import annotations

import pytest

from warmfleet_router.quotas import (
    OPEN,
    QuotaConfig,
    Quotas,
    Throttled,
    Ticket,
    parse_quotas,
)


def quotas(text: str) -> Quotas:
    config = parse_quotas(text)
    return Quotas(lambda: config)


def admitted(q: Quotas, tenant: str, tokens: int = 0, now: float = 0.0) -> Ticket:
    ticket = q.admit(tenant, tokens, now=now)
    assert isinstance(ticket, Ticket), ticket
    return ticket


def test_requests_per_minute_refill_continuously() -> None:
    q = quotas("default: {requests_per_minute: 3}")
    for _ in range(3):
        admitted(q, "a").release()
    refused = q.admit("a", 0, now=0.0)
    assert isinstance(refused, Throttled) and refused.limit == "requests_per_minute"
    assert refused.retry_after == 20  # one request back every 60 / 3 s
    assert "tenant a" in refused.message and "retry after 20s" in refused.message
    assert isinstance(q.admit("a", 0, now=19.0), Throttled)
    admitted(q, "a", now=20.0)
    # Another tenant has its own budget.
    admitted(q, "b")


def test_concurrent_requests() -> None:
    q = quotas("default: {concurrent_requests: 2}")
    first, _ = admitted(q, "a"), admitted(q, "a")
    refused = q.check("a", now=0.0)
    assert isinstance(refused, Throttled) and refused.limit == "concurrent_requests"
    assert refused.retry_after == 1
    assert q.in_flight() == {"a": 2}
    first.release()
    first.release()  # once only
    assert q.in_flight() == {"a": 1} and q.check("a", now=0.0) is None


def test_prompt_tokens_are_taken_on_admission_and_corrected_at_the_end() -> None:
    q = quotas("default: {prompt_tokens_per_minute: 6000}")
    ticket = admitted(q, "a", tokens=5000)
    assert q.check("a", now=0.0) is None  # 1000 left
    ticket.release(prompt_tokens=7000)  # the backend counted more: overdrawn by 1000
    refused = q.check("a", now=0.0)
    assert isinstance(refused, Throttled) and refused.limit == "prompt_tokens_per_minute"
    assert refused.retry_after == 10  # 1000 of 6000 a minute
    assert q.check("a", now=10.0) is None
    # One prompt larger than a minute's worth still gets through a full bucket.
    admitted(q, "b", tokens=60_000)
    assert isinstance(q.check("b", now=0.0), Throttled)


def test_generated_tokens_count_when_known() -> None:
    q = quotas("default: {generated_tokens_per_minute: 600}")
    admitted(q, "a").release(generated=900)
    refused = q.check("a", now=0.0)
    assert isinstance(refused, Throttled) and refused.limit == "generated_tokens_per_minute"
    assert refused.retry_after == 30
    admitted(q, "a", now=30.1).release(generated=None)  # unknown: nothing taken


def test_tenant_limits_over_the_default_and_the_open_router() -> None:
    q = quotas(
        """
default: {requests_per_minute: 100, concurrent_requests: 1}
tenants:
  team-a: {requests_per_minute: 1}
"""
    )
    admitted(q, "team-a").release()
    assert isinstance(q.check("team-a", now=0.0), Throttled)  # its own rpm
    admitted(q, "team-b")
    assert isinstance(q.check("team-b", now=0.0), Throttled)  # the default's concurrency
    admitted(q, OPEN)
    refused = q.check(OPEN, now=0.0)
    assert isinstance(refused, Throttled) and "this router's clients" in refused.message


def test_limits_changed_under_way() -> None:
    config = [parse_quotas("default: {requests_per_minute: 1}")]
    q = Quotas(lambda: config[0])
    admitted(q, "a").release()
    assert isinstance(q.check("a", now=0.0), Throttled)
    config[0] = QuotaConfig()  # no limits any more
    assert q.check("a", now=0.0) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("default: {requests_per_minute: 0}", "default.requests_per_minute"),
        ("default: {rpm: 3}", "default.rpm"),
        ("tenants: {'bad name': {}}", "not tenant names"),
        ("[unclosed", "not YAML"),
        ("- a list", "the file"),
    ],
)
def test_bad_files(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_quotas(text)
