"""Session keys from a configurable list of sources (headers, body fields), first found
wins; the session table forgets the least recently used first."""

from __future__ import annotations

import pytest

from warmfleet_router.sessions import KeySource, SessionKeys, SessionTable


def test_the_default_sources_are_the_affinity_headers() -> None:
    keys = SessionKeys()
    assert keys.of({"x-session-affinity": "u1", "x-prefix-hash": "p"}, None) == "u1"
    assert keys.of({"x-prefix-hash": "p"}, {"user": "x"}) == "p"
    assert keys.of({"x-session-affinity": ""}, None) is None


def test_agent_session_ids_are_sources_more() -> None:
    keys = SessionKeys(
        ["header:X-Claude-Code-Session-Id", "body:metadata.user_id", "body:prompt_cache_key"]
    )
    assert keys.of({"x-claude-code-session-id": "cc-1"}, {"prompt_cache_key": "k"}) == "cc-1"
    assert keys.of({}, {"metadata": {"user_id": "user_abc_session_1"}}) == "user_abc_session_1"
    assert keys.of({}, {"metadata": "not an object", "prompt_cache_key": "k"}) == "k"
    assert keys.of({}, {"prompt_cache_key": 5}) is None  # not a string: no key
    assert keys.of({}, None) is None


@pytest.mark.parametrize("text", ["x-session-affinity", "cookie:a", "header:", "body:a..b"])
def test_bad_sources_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="session key source"):
        KeySource.parse(text)


def test_the_table_forgets_the_least_recently_served() -> None:
    table = SessionTable(max_sessions=2)
    table.served("a", "d0")
    table.served("b", "d1")
    table.served("a", "d2")  # a is now the most recent
    table.served("c", "d0")
    assert (table.get("a"), table.get("b"), table.get("c"), len(table)) == ("d2", None, "d0", 2)
