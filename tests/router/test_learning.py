"""The router's learned warm prompts, as plain Python: a request's static head is what
capture keeps (the same for every session of an agent, never its user message), and the
table learns a head only from `min_sessions` distinct sessions of one tenant, forgets
it after its ttl unused, stays within its bounds, and counts the first requests that
used a learned head."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.agents import claude_code, codex
from warmfleet_common.agent_apis.prefix import warm_prompt
from warmfleet_router.learning import Head, LearnedTable, LearnOptions, head_of
from warmfleet_router.prepare import Job, Prepared
from warmfleet_router.workers import KeyingPool

SECRET = "sk-live-SECRET-4f9a1c2e"
CLAUDE_UA = "claude-cli/2.1.332 (external, sdk-cli)"
T = 200.0  # when the listings are read


def chat_body(system: str, user: str, *more: dict[str, Any]) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {"model": "m", "messages": [*messages, *more]}


def test_the_head_is_what_capture_keeps_and_the_same_for_every_session() -> None:
    first, second = claude_code(f"deploy with {SECRET}"), claude_code("what is 2 + 2?")
    a, b = head_of("messages", first.body), head_of("messages", second.body)
    assert a is not None and b is not None
    assert a.digest == b.digest and a.entry == b.entry and a.api == "anthropic"
    captured = warm_prompt("anthropic", first.body, "x").model_dump(
        mode="json", exclude_none=True, exclude={"name"}
    )
    assert json.loads(a.entry) == captured
    assert SECRET not in a.entry
    c, d = head_of("responses", codex(SECRET).body), head_of("responses", codex("hi").body)
    assert c is not None and d is not None and c.digest == d.digest and SECRET not in c.entry


def test_nothing_after_the_first_user_message_is_read() -> None:
    reply = {"role": "assistant", "content": f"your key is {SECRET}"}
    head = head_of("chat", chat_body("You are terse.", SECRET, reply))
    assert head is not None and SECRET not in head.entry
    assert json.loads(head.entry) == {"messages": [{"role": "system", "content": "You are terse."}]}
    # A user message that is not even valid is never parsed.
    broken = chat_body("You are terse.", "x")
    broken["messages"][1] = {"role": "user", "content": [{"type": "image_url", "x": SECRET}]}
    assert head_of("chat", broken) is not None


def test_requests_without_a_static_head_have_none() -> None:
    assert head_of("chat", {"model": "m", "messages": [{"role": "user", "content": "x"}]}) is None
    assert head_of("completion", {"model": "m", "prompt": "You are terse."}) is None
    assert head_of("count_tokens", claude_code("x").body) is None
    assert head_of("chat", {"model": "m", "messages": "nope"}) is None
    assert head_of("chat", {"messages": [{"role": "sys"}, {"role": "user"}]}) is None


@pytest.mark.asyncio
async def test_a_key_worker_reads_the_head_and_only_when_asked() -> None:
    pool = KeyingPool(workers=1, large_bytes=0)  # every body to the worker process
    try:
        raw = json.dumps(chat_body("You are terse.", SECRET)).encode()
        asked = await pool.prepare(Job("chat", raw, learn=True))
        unasked = await pool.prepare(Job("chat", raw))
    finally:
        await pool.close()
    assert isinstance(asked, Prepared) and isinstance(unasked, Prepared)
    assert asked.head is not None and asked.head == head_of("chat", json.loads(raw))
    assert SECRET not in asked.head.entry and unasked.head is None


def head(system: str = "You are the release bot.") -> Head:
    found = head_of("chat", chat_body(system, "x"))
    assert found is not None
    return found


def test_learned_from_k_distinct_sessions_only() -> None:
    table = LearnedTable(LearnOptions(min_sessions=3))
    for _ in range(5):  # one session many times is one session
        table.observe(head(), "s1", None, CLAUDE_UA, now=100.0)
    table.observe(head(), "s2", None, CLAUDE_UA, now=101.0)
    assert len(table) == 0 and table.listing(now=T) == []
    table.observe(head(), "s3", None, CLAUDE_UA, now=102.0)
    assert len(table) == 1
    [learned] = table.listing(now=T)
    assert learned["sessions"] == 3 and learned["client"] == "claude-code"
    assert learned["first_seen"] == 100.0 and learned["last_seen"] == 102.0
    assert learned["prompt"]["name"] == learned["name"]
    assert learned["prompt"]["messages"][0]["content"] == "You are the release bot."
    # A fourth session's first request uses it, and its hit rate is counted.
    fourth = head()
    table.observe(fourth, "s4", None, CLAUDE_UA, now=103.0)
    assert fourth.first and fourth.learned
    assert table.settled(fourth, 100, 95)
    again = head()
    table.observe(again, "s4", None, CLAUDE_UA, now=104.0)
    assert not again.first and not table.settled(again, 100, 100)
    [learned] = table.listing(now=T)
    assert learned["sessions"] == 4 and learned["first_requests"] == 1
    assert learned["first_request_hit_rate"] == 0.95


def test_no_session_no_count_and_off_is_off() -> None:
    table = LearnedTable(LearnOptions(min_sessions=1))
    table.observe(head(), None, None, now=1.0)
    assert len(table) == 0
    off = LearnedTable(LearnOptions(min_sessions=0))
    for s in "abcd":
        off.observe(head(), s, None, now=1.0)
    assert len(off) == 0 and off.candidates == 0


def test_tenants_never_share_a_learned_head() -> None:
    table = LearnedTable(LearnOptions(min_sessions=2))
    table.observe(head(), "a/1", "team-a", now=1.0)
    table.observe(head(), "b/1", "team-b", now=1.0)
    assert len(table) == 0  # two sessions, but one per tenant
    table.observe(head(), "a/2", "team-a", now=2.0)
    assert [p["tenant"] for p in table.listing(now=T)] == ["team-a"]
    assert table.listing("team-b", every=False, now=T) == []
    assert table.counts() == {"team-a": 1}
    used = head()
    table.observe(used, "b/2", "team-b", now=3.0)
    assert not used.learned  # team-b's sessions never use team-a's learned head


def test_the_window_and_the_ttl() -> None:
    table = LearnedTable(LearnOptions(min_sessions=2, ttl=10.0))
    table.observe(head(), "s1", None, now=0.0)
    table.observe(head(), "s2", None, now=20.0)  # s1 fell out of the window
    assert len(table) == 0
    table.observe(head(), "s3", None, now=25.0)
    assert len(table) == 1
    table.observe(head("Another agent."), "s9", None, now=30.0)
    assert len(table) == 1
    table.observe(head("Another agent."), "s9", None, now=40.0)  # unused since 25
    assert len(table) == 0 and table.forgotten == 1


def test_an_upgraded_agent_is_learned_again_and_its_old_head_expires() -> None:
    table = LearnedTable(LearnOptions(min_sessions=3, ttl=100.0))
    for n in range(3):
        table.observe(head("Agent v1."), f"old-{n}", None, now=float(n))
    assert [p["prompt"]["messages"][0]["content"] for p in table.listing(now=10.0)] == ["Agent v1."]
    for n in range(3):  # the upgrade: a new system prompt, three sessions of it
        table.observe(head("Agent v2."), f"new-{n}", None, now=50.0 + n)
    heads = [p["prompt"]["messages"][0]["content"] for p in table.listing(now=60.0)]
    assert heads == ["Agent v2.", "Agent v1."]
    table.observe(head("Agent v2."), "new-3", None, now=150.0)  # v1 unused since 2
    assert [p["prompt"]["messages"][0]["content"] for p in table.listing(now=150.0)] == [
        "Agent v2."
    ]


def test_bounded_in_count_and_bytes() -> None:
    table = LearnedTable(LearnOptions(min_sessions=1, max_prompts=2, max_candidates=4))
    for n in range(5):
        table.observe(head(f"Agent {n}."), "s", None, now=float(n))
    assert [p["prompt"]["messages"][0]["content"] for p in table.listing(now=T)] == [
        "Agent 4.",
        "Agent 3.",
    ]
    small = LearnedTable(LearnOptions(min_sessions=1, max_bytes=200))
    small.observe(head("x" * 300), "s", None, now=1.0)
    assert len(small) == 0 and small.size_bytes == 0
    counting = LearnedTable(LearnOptions(min_sessions=2, max_candidates=3))
    for n in range(10):
        counting.observe(head(f"Agent {n}."), "s", None, now=float(n))
    assert counting.candidates == 3
