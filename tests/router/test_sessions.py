"""Session keys from a configurable list of sources (headers, body fields), first found
wins; the session table forgets the least recently used first."""

from __future__ import annotations

from typing import Any

import pytest

from warmfleet_router.sessions import KeySource, SessionKeys, SessionTable, body_values


def key_of(keys: SessionKeys, headers: dict[str, str], body: dict[str, Any] | None) -> str | None:
    return keys.of(headers, body_values(body or {}, keys.body_paths))


def test_the_default_sources_are_the_affinity_headers() -> None:
    keys = SessionKeys()
    assert key_of(keys, {"x-session-affinity": "u1", "x-prefix-hash": "p"}, None) == "u1"
    assert key_of(keys, {"x-prefix-hash": "p"}, {"user": "x"}) == "p"
    assert key_of(keys, {"x-session-affinity": ""}, None) is None


def test_agent_session_ids_are_sources_more() -> None:
    keys = SessionKeys(
        ["header:X-Claude-Code-Session-Id", "body:metadata.user_id", "body:prompt_cache_key"]
    )
    assert key_of(keys, {"x-claude-code-session-id": "cc-1"}, {"prompt_cache_key": "k"}) == "cc-1"
    assert key_of(keys, {}, {"metadata": {"user_id": "user_abc_session_1"}}) == "user_abc_session_1"
    assert key_of(keys, {}, {"metadata": "not an object", "prompt_cache_key": "k"}) == "k"
    assert key_of(keys, {}, {"prompt_cache_key": 5}) is None  # not a string: no key
    assert key_of(keys, {}, None) is None


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
