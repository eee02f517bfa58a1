"""Peer grants: issued with the peer's admin token for its URL, valid only there, only
until the expiry, never far ahead; and the spill signature covers a grant."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warmfleet_common.contract import PeerRef, WarmSetSpec
from warmfleet_common.grants import (
    MAX_GRANT_S,
    grant_refusal,
    grant_url,
    issue_grant,
    urls_reached_at,
)
from warmfleet_common.spill import peer_signature, signature_valid
from warmfleet_common.wire import CachePull

TOKEN = "peer-token"
URL = "http://10.0.0.7:8000"
NOW = 1_800_000_000.0
HERE = urls_reached_at("10.0.0.7:8000")


def test_a_grant_is_valid_for_its_url_until_it_expires() -> None:
    grant = issue_grant(TOKEN, URL, ttl_s=300, now=NOW)
    expiry, _, mac = grant.partition(".")
    assert int(expiry) == NOW + 300 and len(mac) == 64
    assert grant_refusal(TOKEN, HERE, grant, now=NOW) is None
    assert grant_refusal(TOKEN, HERE, grant, now=NOW + 299) is None
    assert grant_refusal(TOKEN, HERE, grant, now=NOW + 300) == "expired"


def test_forged_wrong_token_wrong_url_and_malformed_grants_are_refused() -> None:
    grant = issue_grant(TOKEN, URL, now=NOW)
    expiry, _, mac = grant.partition(".")
    assert grant_refusal("other-token", HERE, grant, now=NOW) == "not signed for this daemon"
    elsewhere = urls_reached_at("10.0.0.8:8000")
    assert grant_refusal(TOKEN, elsewhere, grant, now=NOW) == "not signed for this daemon"
    later = f"{int(expiry) + 1}.{mac}"  # the expiry is signed
    assert grant_refusal(TOKEN, HERE, later, now=NOW) == "not signed for this daemon"
    for bad in ("", "123", f"{expiry}.{mac[:-1]}", f"{expiry}.{mac.upper()}", f"-1.{mac}"):
        assert grant_refusal(TOKEN, HERE, bad, now=NOW).startswith("malformed")  # type: ignore[union-attr]


def test_a_grant_far_in_the_future_is_refused() -> None:
    capped = issue_grant(TOKEN, URL, ttl_s=10 * MAX_GRANT_S, now=NOW)  # the issuer caps it
    assert int(capped.partition(".")[0]) == NOW + MAX_GRANT_S
    forged_far = issue_grant(TOKEN, URL, ttl_s=MAX_GRANT_S, now=NOW + 3600)
    assert "ahead" in (grant_refusal(TOKEN, HERE, forged_far, now=NOW) or "")


def test_urls_are_compared_as_a_request_names_them() -> None:
    assert grant_url("HTTP://Mac1.LOCAL:80/") == "http://mac1.local"
    assert grant_url("https://mac1:443/node/") == "https://mac1/node"
    assert grant_url("http://[::1]:8000") == "http://[::1]:8000"
    # Behind a TLS-terminating proxy the peer sees http: a grant for https still holds.
    grant = issue_grant(TOKEN, "https://mac1.example", now=NOW)
    assert grant_refusal(TOKEN, urls_reached_at("mac1.example"), grant, now=NOW) is None
    assert grant_refusal(TOKEN, urls_reached_at("mac1.example", "/node"), grant, now=NOW)
    assert urls_reached_at("evil/path") == [] and urls_reached_at("") == []


def test_the_spill_signature_covers_the_grant() -> None:
    grant = issue_grant(TOKEN, URL, now=NOW)
    signed = peer_signature("receiver", URL, grant)
    assert signature_valid("receiver", URL, signed, grant)
    assert not signature_valid("receiver", URL, signed)  # the grant stripped
    assert not signature_valid("receiver", URL, peer_signature("receiver", URL), grant)
    other = issue_grant(TOKEN, URL, now=NOW + 1)
    assert not signature_valid("receiver", URL, signed, other)


def test_pushed_peers_take_a_url_or_a_url_with_a_grant() -> None:
    grant = issue_grant(TOKEN, URL, now=NOW)
    spec = WarmSetSpec.model_validate(
        {"peers": ["http://a:1/", {"url": URL + "/", "grant": grant}, {"url": "http://b:2"}]}
    )
    assert spec.peer_refs() == [
        PeerRef(url="http://a:1"),
        PeerRef(url=URL, grant=grant),
        PeerRef(url="http://b:2"),
    ]
    dumped = spec.model_dump(mode="json", exclude_none=True)["peers"]
    assert dumped == ["http://a:1", {"url": URL, "grant": grant}, {"url": "http://b:2"}]
    for bad in (
        {"url": "ftp://x"},
        {"url": URL, "grant": "nope"},
        {"url": URL, "token": "x"},
    ):
        with pytest.raises(ValidationError):
            WarmSetSpec.model_validate({"peers": [bad]})
    with pytest.raises(ValidationError):
        CachePull.model_validate(
            {
                "peer": URL,
                "peer_grant": "1.zz",
                "blocks": [{"key": "ab" * 16, "start": 0, "end": 1}],
            }
        )
